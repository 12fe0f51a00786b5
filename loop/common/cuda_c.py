"""A CUDA C target's host entry point, read from its source: `extern "C" void solve(...)` and its
parameters (the contract of a `.cu` target; `loop.common.language` names the language).

A pointer parameter is a tensor (its dtype from the C type, `const` marks an input); a `cudaStream_t`
is the stream to launch on (the caller's, no input); any other is a scalar (an integer or a float).

Two forms (`solve_form`): the seed skill's, whose solve launches on the default stream and may
synchronise (`cudaDeviceSynchronize()` inside it), timed eagerly; and the stream form, whose solve
takes one `cudaStream_t` and launches every kernel on a stream given as the launch's fourth
argument, with no device-wide synchronisation: a CUDA graph can capture it. A stream form that breaks
either rule is a one-line UserError at the line. The one declaration is read by a small parser of C declarations
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
STREAM_TYPES = ("cudaStream_t", "CUstream")
SYNCHRONISING, STREAM = "synchronising", "stream"  # the two forms of solve
# how a target of each form is timed, and why (the judge's note, the spec's text, `tileloop check`)
TIMING = {
    SYNCHRONISING: "timed eagerly: solve synchronises (it takes no cudaStream_t, so it launches on the default "
                   "stream and may call cudaDeviceSynchronize), and no CUDA graph can capture it",
    STREAM: "the stream form: solve launches on the cudaStream_t it is given, so it can be captured in a CUDA "
            "graph and timed as the other languages' kernels are",
}
# what no CUDA graph can capture in a stream form's solve
_DEVICE_SYNC = re.compile(r"\b(cudaDeviceSynchronize|cudaStreamSynchronize|cudaThreadSynchronize|cudaMemcpy|cudaMalloc|"
                          r"cudaFree)\s*\(")
_LAUNCH = re.compile(r"<<<(?P<config>.*?)>>>", re.S)
_DEFAULT_STREAMS = ("0", "NULL", "nullptr", "cudaStreamLegacy", "(cudaStream_t)0", "cudaStreamPerThread")
_EXTERN_SOLVE = re.compile(r'extern\s+"C"\s*(?:\{[^}]*?)?(?:__host__\s+)?void\s+' + ENTRY + r"\s*\(")


@dataclass(frozen=True)
class Param:
    """One parameter of `solve`: a tensor (a pointer; `dtype` its element type) or a scalar (`kind`)."""

    name: str
    ctype: str  # the element type (a pointer's) or the scalar's type, qualifiers dropped
    pointer: bool
    const: bool
    dtype: str | None = None  # torch dtype name of a pointer's elements
    kind: str | None = None  # "int", "float" or "double" for a scalar, "stream" for the cudaStream_t

    @property
    def tensor(self) -> bool:
        return self.pointer

    @property
    def stream(self) -> bool:
        """The stream to launch on: given by the caller, not by make_inputs."""
        return self.kind == "stream"

    def describe(self) -> str:
        if self.stream:
            return f"{self.ctype} {self.name} (the stream to launch on)"
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
    text = strip_comments(source)  # shorter than the source, with its newlines: count them in it
    m = _EXTERN_SOLVE.search(text)
    return None if m is None else text.count("\n", 0, m.end()) + 1


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
    streams = [p.name for p in params if p.stream]
    if len(streams) > 1:
        raise UserError(f"{shown}:{line}: {ENTRY} takes {len(streams)} streams ({', '.join(streams)}): the stream form "
                        "takes one, the stream to launch every kernel on")
    return params


def solve_form(source: str, shown: str = "the target") -> str:
    """SYNCHRONISING (solve takes no stream: timed eagerly) or STREAM (it takes one and launches every
    kernel on a stream given at the launch, with nothing a CUDA graph cannot capture); a stream form
    that launches on the default stream or synchronises is a UserError at the line."""
    params = solve_signature(source, shown)
    stream = next((p for p in params if p.stream), None)
    if stream is None:
        return SYNCHRONISING
    text = strip_comments(source)
    for m in _DEVICE_SYNC.finditer(text):
        raise UserError(f"{shown}:{text.count(chr(10), 0, m.start()) + 1}: {ENTRY} takes {stream.ctype} {stream.name} "
                        f"but calls {m.group(1)}, which no CUDA graph can capture",
                        hint=f"the stream form leaves synchronising to its caller; drop the {stream.ctype} parameter "
                             "for the synchronising form (timed eagerly)")
    for m in _LAUNCH.finditer(text):
        config = [c.strip() for c in _split(m.group("config"))]
        if len(config) < 4 or " ".join(config[3].split()) in _DEFAULT_STREAMS:
            raise UserError(f"{shown}:{text.count(chr(10), 0, m.start()) + 1}: {ENTRY} takes {stream.ctype} "
                            f"{stream.name} but launches <<<{', '.join(config)}>>> on the default stream",
                            hint=f"launch on the stream given: <<<grid, block, shared_bytes, {stream.name}>>>")
    return STREAM


def timed_form(source: str, shown: str = "the target") -> str:
    """The form a target is timed by: `solve_form`'s, where a stream form that breaks its rules (or a
    source without solve) is SYNCHRONISING: called as it is and timed eagerly, never captured in a
    CUDA graph (`tileloop check` names what it breaks, at its line)."""
    try:
        return solve_form(source, shown)
    except UserError:
        return SYNCHRONISING


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
    if base in STREAM_TYPES:
        if stars:
            raise UserError(f"{where}: {ENTRY}'s parameter {name} is a pointer to a {base}: take the stream itself")
        return Param(name, base, False, False, kind="stream")
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
        if p.stream:
            if p.name in inputs:
                out.append(f"make_inputs gives {p.name!r}, {ENTRY}'s {p.ctype}: the caller passes the stream to "
                           "launch on")
            continue
        if p.name not in inputs:
            out.append(f"{ENTRY}'s parameter {p.describe()} is not among make_inputs' names")
        elif inputs[p.name] != p.tensor:
            given = "a tensor" if inputs[p.name] else "a scalar"
            out.append(f"make_inputs gives {given} for {ENTRY}'s parameter {p.describe()}")
    taken = {p.name for p in params}
    out += [f"make_inputs' {name!r} is no parameter of {ENTRY}" for name in inputs if name not in taken]
    return out
