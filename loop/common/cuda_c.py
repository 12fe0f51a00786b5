"""A CUDA C target's host entry point, read from its source: `extern "C" void solve(...)` and its
parameters (the contract of a `.cu` target; `loop.common.language` names the language).

A pointer parameter is a tensor (its dtype from the C type, `const` marks an input); any other is a
scalar (an integer or a float). The one declaration is read by a small parser of C declarations
(comments and preprocessor lines dropped, the parameter list split at its top-level commas), not by
a C++ front end: what the contract allows (plain, `const`, `__restrict__` and `restrict` qualified
types, one level of pointer) it reads; anything else is a one-line UserError naming the line. The
spec's inputs are matched with the parameters by name (`mismatches`). Nothing here imports CUDA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loop.common.errors import UserError

SUFFIX = ".cu"
ENTRY = "solve"
# C element type -> torch dtype name
POINTER_DTYPES = {
    "float": "float32", "double": "float64", "__half": "float16", "half": "float16",
    "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16", "int": "int32", "int32_t": "int32",
    "unsigned int": "int32", "uint32_t": "int32", "long long": "int64", "int64_t": "int64", "long": "int64",
    "short": "int16", "int16_t": "int16", "char": "int8", "signed char": "int8", "int8_t": "int8",
    "unsigned char": "uint8", "uint8_t": "uint8", "bool": "bool",
}
# C scalar type -> "int" or "float" (how its value is passed)
SCALAR_KINDS = {
    **{t: "int" for t in ("int", "int32_t", "unsigned int", "unsigned", "uint32_t", "long", "long long", "int64_t",
                          "uint64_t", "size_t", "short", "int16_t", "char", "int8_t", "bool")},
    "float": "float", "double": "double",
}
QUALIFIERS = ("const", "__restrict__", "__restrict", "restrict", "volatile")
_EXTERN_SOLVE = re.compile(r'extern\s+"C"\s*(?:\{[^}]*?)?(?:__host__\s+)?void\s+' + ENTRY + r"\s*\(")


@dataclass(frozen=True)
class Param:
    """One parameter of `solve`: a tensor (a pointer; `dtype` its element type) or a scalar (`kind`)."""

    name: str
    ctype: str  # the element type (a pointer's) or the scalar's type, qualifiers dropped
    pointer: bool
    const: bool
    dtype: str | None = None  # torch dtype name of a pointer's elements
    kind: str | None = None  # "int", "float" or "double" for a scalar

    @property
    def tensor(self) -> bool:
        return self.pointer

    def describe(self) -> str:
        if self.pointer:
            return f"{'const ' if self.const else ''}{self.ctype}* {self.name} (a {self.dtype} tensor" + \
                (", input)" if self.const else ")")
        return f"{self.ctype} {self.name} (a scalar)"


def strip_comments(source: str) -> str:
    """The source with comments and preprocessor lines blanked (newlines kept, so line numbers hold);
    string literals are kept as they are."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    return re.sub(r"(?m)^[ \t]*#.*$", "", text)


def is_cuda_target(name: str) -> bool:
    """A file of the CUDA C language, by its name."""
    return name.endswith(SUFFIX)


def has_solve(source: str) -> bool:
    """The source declares `extern "C" void solve(...)`."""
    return _EXTERN_SOLVE.search(strip_comments(source)) is not None


def solve_line(source: str) -> int | None:
    """The line of the `solve` declaration (1-based), None where there is none."""
    m = _EXTERN_SOLVE.search(strip_comments(source))
    return None if m is None else source.count("\n", 0, m.end()) + 1


def solve_signature(source: str, shown: str = "the target") -> list[Param]:
    """The parameters of `extern "C" void solve(...)`, in order; UserError naming the line otherwise."""
    text = strip_comments(source)
    m = _EXTERN_SOLVE.search(text)
    if m is None:
        raise UserError(f'{shown} declares no extern "C" void {ENTRY}(...)',
                        hint=f'a CUDA C target launches its kernels from extern "C" void {ENTRY}(<pointers and '
                             "scalars>), the seed skill's contract")
    depth, j = 1, m.end()
    while j < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        j += 1
    if depth:
        raise UserError(f"{shown}:{solve_line(source)}: the parameter list of {ENTRY} is not closed")
    inner = text[m.end():j - 1].strip()
    line = solve_line(source)
    if inner in ("", "void"):
        return []
    params = [_param(part.strip(), f"{shown}:{line}") for part in _split(inner)]
    names = [p.name for p in params]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"{shown}:{line}: {ENTRY} names a parameter twice: {', '.join(dupes)}")
    return params


def _split(inner: str) -> list[str]:
    """The parameter list split at its top-level commas (a template argument's commas kept)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return parts


def _param(decl: str, where: str) -> Param:
    """One parameter declaration: `const float* __restrict__ x`, `int n`, `__half *out`, `float x[]`."""
    if "=" in decl:
        raise UserError(f"{where}: {ENTRY}'s parameter {decl!r} has a default: extern \"C\" takes none")
    m = re.fullmatch(r"(?P<type>.*?)(?P<stars>[\s*]*)\b(?P<name>[A-Za-z_]\w*)\s*(?P<array>\[\s*\])?", decl, re.S)
    if m is None or not m.group("type").strip():
        raise UserError(f"{where}: {ENTRY}'s parameter {decl!r} is not a type and a name")
    words = re.findall(r"[A-Za-z_]\w*|\*|&", m.group("type") + m.group("stars"))
    if "&" in words:
        raise UserError(f"{where}: {ENTRY}'s parameter {decl!r} is a reference: pass a pointer or a value")
    stars = words.count("*") + (1 if m.group("array") else 0)
    const = "const" in words[: words.index("*")] if "*" in words else "const" in words
    base = " ".join(w for w in words if w != "*" and w not in QUALIFIERS)
    base = re.sub(r"^(?:std::)?", "", base)
    name = m.group("name")
    if stars > 1:
        raise UserError(f"{where}: {ENTRY}'s parameter {name} is a pointer to a pointer: pass one device pointer "
                        "per tensor")
    if stars == 1:
        dtype = POINTER_DTYPES.get(base)
        if dtype is None:
            raise UserError(f"{where}: {ENTRY}'s parameter {name} points to {base!r}, which names no tensor dtype",
                            hint=f"one of: {', '.join(sorted(POINTER_DTYPES))}")
        return Param(name, base, True, const, dtype=dtype)
    kind = SCALAR_KINDS.get(base)
    if kind is None:
        raise UserError(f"{where}: {ENTRY}'s parameter {name} has type {base!r}, neither a pointer nor a number",
                        hint=f"scalars are one of: {', '.join(sorted(SCALAR_KINDS))}")
    return Param(name, base, False, const, kind=kind)


def mismatches(params: list[Param], inputs: dict[str, bool]) -> list[str]:
    """Each way the spec's inputs (name -> is a tensor) and `solve`'s parameters differ, one line each:
    a parameter no input gives, an input no parameter takes, a tensor given for a scalar or back."""
    out = []
    for p in params:
        if p.name not in inputs:
            out.append(f"{ENTRY}'s parameter {p.describe()} is not among make_inputs' names")
        elif inputs[p.name] != p.tensor:
            given = "a tensor" if inputs[p.name] else "a scalar"
            out.append(f"make_inputs gives {given} for {ENTRY}'s parameter {p.describe()}")
    taken = {p.name for p in params}
    out += [f"make_inputs' {name!r} is no parameter of {ENTRY}" for name in inputs if name not in taken]
    return out
