"""CUDA C targets before a run: `tileloop spec <file.cu>` (a commented spec.py written from the
parameters of `extern "C" void solve(...)`), `tileloop spec <case folder>` (a case in the seed skill's
layout, `v0.cu` and `ref.py` defining `reference(**kwargs)`, made a target `<case>_cuda.cu` and a spec
beside them whose reference calls the case's), and the part of `tileloop check <file.cu>` read from the
sources: each way the spec's inputs and solve's parameters differ, one line each.

The case's outputs are the pointers its reference writes in place (`out.copy_(...)`, `out[...] = `,
`out=out`), read from ref.py without running it; where it writes none, the output-like names of the
writable pointers (as `tileloop spec <file.cu>` does).

The spec's inputs are read from `make_inputs`' returned dict literal (its keys, and whether each
value is a tensor: a `torch.*` call or a method on one, or a scalar: a number, `shape[i]`,
arithmetic on these), without importing the spec. A value neither is left to the call, which checks
every argument again where it runs (`loop.worker.cuda_build`).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from loop.backends.nvcc import timing
from loop.common import cuda_c
from loop.common.errors import UserError
from loop.target.skeleton import spec_functions

OUTPUT_PREFIXES = ("out", "y", "dst", "result", "o")
SIZE_NAMES = {"n": "math.prod(shape)", "numel": "math.prod(shape)", "size": "math.prod(shape)",
              "rows": "shape[0]", "m": "shape[0]", "cols": "shape[-1]", "d": "shape[-1]", "k": "shape[-1]"}


def _is_output(p: cuda_c.Param) -> bool:
    low = p.name.lower()
    return p.pointer and not p.const and any(low == o or low.startswith(f"{o}_") or low == f"{o}put" for o in OUTPUT_PREFIXES)


def _made(p: cuda_c.Param, outputs: tuple[str, ...]) -> str:
    if p.pointer and p.name in outputs:
        return f'        "{p.name}": torch.empty(shape, dtype=torch.{p.dtype}),  # written by solve (OUTPUTS)'
    if p.pointer and p.dtype in ("float16", "bfloat16", "float32", "float64"):
        note = "" if p.const else " (not const: if solve writes it, list it in OUTPUTS)"
        return f'        "{p.name}": torch.randn(shape, generator=g).to(torch.{p.dtype}),  # TODO: its shape{note}'
    if p.pointer:
        return f'        "{p.name}": torch.randint(0, 100, shape, generator=g).to(torch.{p.dtype}),  # TODO: its values'
    size = SIZE_NAMES.get(p.name.lower())
    if size is not None:
        return f'        "{p.name}": {size},  # TODO: check ({p.ctype} {p.name}, going by its name)'
    return f'        "{p.name}": ...,  # TODO: its value ({p.ctype} {p.name})'


def skeleton(op: str, params: list[cuda_c.Param], declared: str, outputs: tuple[str, ...] | None = None,
             form: str = cuda_c.SYNCHRONISING) -> str:
    """The commented spec of a CUDA C target whose `solve` takes `params` (`outputs`: the pointers it
    writes, else the writable ones with an output's name) in `form`."""
    if outputs is None:
        outputs = tuple(p.name for p in params if _is_output(p))
    stream = next((p.name for p in params if p.stream), None)
    params = [p for p in params if not p.stream]  # the caller's stream, no input
    floats = list(dict.fromkeys(p.dtype for p in params if p.pointer and p.dtype in
                                ("float16", "bfloat16", "float32", "float64")))
    dtypes = floats[:1] or ["float32"]
    tensors = [p for p in params if p.pointer]
    args = ", ".join(p.name for p in params)
    lines = [
        f'"""The contract of {op} for tileloop: inputs, the PyTorch reference, shapes and tolerances.',
        "",
        "Written by `tileloop spec` from the CUDA C target's entry point",
        f"    {declared}",
        "each parameter an input of the same name: a pointer a tensor on the GPU (its dtype the C type's,",
        "the only one DTYPES can hold), any other a scalar"
        + (f" ({stream}, the cudaStream_t, is passed by the caller)." if stream else "."),
        *textwrap.wrap(f"How it is timed: {timing(form)}.", 100),
        'Fill in the TODOs and the `...`, then run `tileloop check` on the target."""',
        "",
        "import math",
        "",
        "import torch",
        "",
        f'ENTRY = "{cuda_c.ENTRY}"  # the target\'s extern "C" function, called with the inputs below by name',
        "CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000)]  # TODO: shapes of your op (odd sizes catch masking bugs)",
        "BENCHMARK_SHAPES = [(4096, 4096)]  # TODO: the shapes that matter for speed",
        f"DTYPES = [{', '.join(f'torch.{d}' for d in dtypes)}]  # the C types of solve's pointers",
        f"TOLERANCES = {{{', '.join(f'torch.{d}: (1e-5, 1e-5)' if d in ('float32', 'float64') else f'torch.{d}: (1e-2, 1e-2)' for d in dtypes)}}}  # (atol, rtol)",
        f"OUTPUTS = {outputs!r}  # output buffers among the inputs, written in place by solve",
        *spec_functions(op, [_made(p, outputs) for p in params], args,
                        ['    """The op in PyTorch; return the value of each output buffer, in the order of OUTPUTS."""'],
                        f"{max(len(tensors), 1)} * math.prod(shape) * size  # TODO: count every tensor read and written"),
    ]
    return "\n".join(lines)


def declaration(source: str) -> str:
    """solve's declaration as one line (its parameters as written, whitespace folded)."""
    text = cuda_c.strip_comments(source)
    start = text.find("solve", text.find('extern "C"'))
    end = text.find(")", start)
    return " ".join(f'extern "C" void {text[start:end + 1]}'.split()).replace("( ", "(")


def timing_of(target: Path) -> str:
    """How the target will be timed, by its form (the nvcc backend's line)."""
    return timing(cuda_c.solve_form(target.read_text(), str(target)))


def write_spec(target: Path, force: bool = False) -> Path:
    """Write the spec of a CUDA C target beside it; refuse to overwrite a spec unless `force`."""
    spec = target.parent / "spec.py"
    if spec.exists() and not force:
        raise UserError(f"{spec} exists", hint="pass --force to overwrite it, or edit it")
    source = target.read_text()
    params = cuda_c.solve_signature(source, str(target))
    form = cuda_c.solve_form(source, str(target))
    spec.write_text(skeleton(target.stem.removesuffix("_cuda"), params, declaration(source), form=form))
    return spec


CASE_KERNEL = "v0.cu"
CASE_REFERENCE = "ref.py"
CASE_MODULE = "ref"
_IN_PLACE = re.compile(r"[a-z]\w*_$")  # torch's in-place methods: copy_, fill_, add_, ...


def case_files(folder: Path) -> tuple[Path, Path]:
    """(v0.cu, ref.py) of a case in the seed skill's layout: ref.py in the folder, v0.cu beside it or
    in its v0/ (the skill's output folder); UserError naming what is missing otherwise."""
    reference = folder / CASE_REFERENCE
    kernel = next((k for k in (folder / CASE_KERNEL, folder / "v0" / CASE_KERNEL) if k.is_file()), None)
    missing = [n for n, found in ((CASE_KERNEL, kernel), (CASE_REFERENCE, reference.is_file())) if not found]
    if missing:
        raise UserError(f"{folder} is no case in the seed skill's layout: it has no {' and no '.join(missing)}",
                        hint=f"a case folder holds {CASE_KERNEL} (or v0/{CASE_KERNEL}) with extern \"C\" void "
                             f"solve(...) and {CASE_REFERENCE} defining reference(**kwargs)")
    return kernel, reference


def case_reference(source: str, shown: str) -> ast.FunctionDef:
    """ref.py's top-level `reference`; UserError where it does not parse or defines none."""
    try:
        tree = ast.parse(source, filename=shown)
    except SyntaxError as exc:
        raise UserError(f"{shown}:{exc.lineno}: {exc.msg}") from None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "reference"), None)
    if fn is None:
        raise UserError(f"{shown} defines no reference(**kwargs)",
                        hint="the seed skill's ref.py defines reference(**kwargs), which computes the op in PyTorch")
    return fn


def written_in_place(fn: ast.FunctionDef) -> set[str]:
    """The inputs the reference writes in place: a name taken from kwargs (`out = kwargs["out"]`,
    `kwargs.get("out")`) or a parameter of its own, then `out.copy_(...)` (any in-place method),
    `out[...] = ...` or `torch.f(..., out=out)`; `kwargs["out"].copy_(...)` too."""
    aliases = {a.arg: a.arg for a in fn.args.args + fn.args.kwonlyargs}
    kwargs = fn.args.kwarg.arg if fn.args.kwarg else None

    def literal(node: ast.expr) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def key(node: ast.expr) -> str | None:
        """The input an expression is: kwargs["x"], kwargs.get("x"), or a name bound to one."""
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == kwargs:
            return literal(node.slice)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == kwargs and node.args:
            return literal(node.args[0])
        return aliases.get(node.id) if isinstance(node, ast.Name) else None

    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and (name := key(node.value)) is not None:
            aliases[node.targets[0].id] = name
    written = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _IN_PLACE.fullmatch(node.func.attr):
            written.add(key(node.func.value))
        if isinstance(node, ast.Call):
            written.update(key(k.value) for k in node.keywords if k.arg == "out")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Subscript):
                    written.add(key(t.value))
    return written - {None}


def case_spec(op: str, params: list[cuda_c.Param], declared: str, fn: ast.FunctionDef,
              form: str = cuda_c.SYNCHRONISING) -> str:
    """The spec of a case's target: `tileloop spec`'s skeleton from solve's parameters, its reference
    the case's reference(**kwargs) called on copies of the inputs."""
    written = written_in_place(fn)
    outputs = tuple(p.name for p in params if p.pointer and p.name in written) or None
    text = skeleton(op, params, declared, outputs, form)
    names = ", ".join(f"{p.name}={p.name}" for p in params if not p.stream)
    body = "\n".join([
        f"    inputs = dict({names})",
        "    inputs = {name: v.clone() if isinstance(v, torch.Tensor) else v for name, v in inputs.items()}",
        "    returned = case_reference(**inputs)",
        "    if returned is not None:",
        "        return returned",
        "    return tuple(inputs[name] for name in OUTPUTS) if len(OUTPUTS) != 1 else inputs[OUTPUTS[0]]",
    ])
    doc = '    """The op in PyTorch; return the value of each output buffer, in the order of OUTPUTS."""'
    case_doc = ('    """The case\'s reference(**kwargs) on copies of the inputs: what it returns, else the value '
                'of each output buffer\n    it wrote in place, in the order of OUTPUTS."""')
    text = text.replace(doc, case_doc).replace(f'    raise NotImplementedError("write {op} in PyTorch here")', body)
    text = text.replace("import torch\n", f"import torch\n\nfrom {CASE_MODULE} import reference as case_reference  "
                        f"# the case's reference(**kwargs), in {CASE_REFERENCE} beside this spec\n", 1)
    return text.replace("Written by `tileloop spec` from", "Written by `tileloop spec` from a case in the seed "
                        f"skill's layout ({CASE_KERNEL} and {CASE_REFERENCE}),\nthe reference its {CASE_REFERENCE}'s; "
                        "from", 1)


def case_op(folder: Path) -> str:
    """The op a case tunes: its folder's name as an identifier ("case" where nothing is left)."""
    return re.sub(r"\W+", "_", folder.resolve().name).strip("_").lower() or "case"


def import_case(folder: Path, force: bool = False) -> tuple[Path, Path]:
    """Make a case in the seed skill's layout a target `<op>_cuda.cu` (its v0.cu) and a spec beside
    ref.py; refuse to overwrite either unless `force`. Returns (target, spec)."""
    kernel, reference = case_files(folder)
    target, spec = folder / f"{case_op(folder)}_cuda.cu", folder / "spec.py"
    existing = [str(p) for p in (target, spec) if p.exists()]
    if existing and not force:
        raise UserError(f"{' and '.join(existing)} exist{'s' if len(existing) == 1 else ''}",
                        hint="pass --force to overwrite, or edit them")
    source = kernel.read_text()
    params = cuda_c.solve_signature(source, str(kernel))
    fn = case_reference(reference.read_text(), str(reference))
    text = case_spec(case_op(folder), params, declaration(source), fn, cuda_c.solve_form(source, str(kernel)))
    target.write_text(source)
    spec.write_text(text)
    return target, spec


def spec_inputs(spec_source: str) -> tuple[dict[str, bool | None], int] | None:
    """make_inputs' input names, each True (a tensor), False (a scalar) or None (not known from the
    source), and the line of its returned dict; None where it returns no dict literal."""
    tree = ast.parse(spec_source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_inputs"), None)
    if fn is None:
        return None
    tensors = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and _tensor(n.value) for t in n.targets
               if isinstance(t, ast.Name)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            out: dict[str, bool | None] = {}
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out[key.value] = True if _tensor(value) or (isinstance(value, ast.Name) and value.id in tensors) \
                        else False if _scalar(value) else None
            return out, node.lineno
    return None


def _tensor(node: ast.expr) -> bool:
    """`torch.randn(...)`, `torch.empty(...).to(...)`, ...: a call whose callee starts at `torch`."""
    while isinstance(node, ast.Call):
        func = node.func
        while isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id == "torch":
                return True
            if isinstance(func.value, ast.Call):
                break
            func = func.value
        node = func.value if isinstance(func, ast.Attribute) else func
    return False


def _scalar(node: ast.expr) -> bool:
    """A number, `shape[i]`, `len(...)`, `int(...)`, `math.prod(shape)`, or arithmetic on these."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool) or node.value is Ellipsis
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Name) and node.value.id == "shape"
    if isinstance(node, ast.BinOp):
        return _scalar(node.left) and _scalar(node.right)
    if isinstance(node, ast.UnaryOp):
        return _scalar(node.operand)
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        return name in ("int", "float", "len", "math.prod", "max", "min")
    return False


def problems(target: Path, spec: Path, target_shown: str, spec_shown: str) -> list[dict]:
    """A stream form that launches on the default stream or synchronises, and each mismatch between
    the spec's inputs and solve's parameters, one problem each, where the spec returns them."""
    params = cuda_c.solve_signature(target.read_text(), target_shown)
    found = []
    try:
        cuda_c.solve_form(target.read_text(), target_shown)
    except UserError as exc:
        where, _, what = exc.message.partition(": ")
        found.append({"what": what, "where": where, "hint": exc.hint or ""})
    try:
        read = spec_inputs(spec.read_text())
    except SyntaxError:
        return found  # the spec's own check names it
    line = cuda_c.solve_line(target.read_text())
    if read is None:
        return found + [{"what": "make_inputs returns no dict literal: its names could not be matched with solve's "
                         "parameters here", "where": spec_shown,
                 "hint": "return {\"name\": value, ...}; the call checks them again on a GPU"}]
    inputs, at = read
    known = {k: v for k, v in inputs.items() if v is not None}  # a value of no known kind: its name alone
    lines = cuda_c.mismatches([p for p in params if inputs.get(p.name, True) is not None], known)
    names = {p.name for p in params}
    lines += [f"make_inputs' {n!r} is no parameter of {cuda_c.ENTRY}" for n, v in inputs.items()
              if v is None and n not in names]
    return found + [{"what": m, "where": f"{spec_shown}:{at}", "hint": f"make_inputs gives solve's parameters by name "
             f"({target_shown}:{line}): a tensor for each pointer, a number for each scalar"} for m in lines]
