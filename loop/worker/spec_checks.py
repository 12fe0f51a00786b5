"""The spec's own problems, for the check job: every missing or malformed name, every value that
`tileloop spec` left to fill in (`...`), and, where the spec is not whole, what of it can run still
run (make_inputs, the reference, the entry point) so that every problem shows at once rather than
one per attempt. A problem is {what, where, hint}; `where` is `file:line` when a line is known."""

from __future__ import annotations

import ast
import inspect
import traceback
from pathlib import Path

from loop.common.outputs import upcast
from loop.worker.failures import KernelFailure, SpecError, call_impl
from loop.common.spec import dtype_name, drawn_shapes_of, shapes_of, transforms_of

REQUIRED = ("make_inputs", "reference", "CORRECTNESS_SHAPES", "BENCHMARK_SHAPES", "DTYPES", "TOLERANCES", "flops",
            "bytes_moved")
CALLABLE = ("make_inputs", "reference", "flops", "bytes_moved")
INPUTS_HINT = "make_inputs and reference must work at every correctness shape and dtype"
MISSING_HINTS = {
    "make_inputs": "def make_inputs(shape, dtype, seed): return {name: tensor} (random, never zeros)",
    "reference": "def reference(<the inputs by name>): the op in PyTorch, returning what the entry point returns",
    "CORRECTNESS_SHAPES": "CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000)]: small and odd sizes",
    "BENCHMARK_SHAPES": "BENCHMARK_SHAPES = [(4096, 4096)]: the shapes that matter for speed",
    "DTYPES": "DTYPES = [torch.float16, torch.bfloat16]",
    "TOLERANCES": "TOLERANCES = {torch.float16: (1e-3, 1e-3)}: (atol, rtol) per dtype",
    "flops": "def flops(shape, dtype): floating-point operations of one call",
    "bytes_moved": "def bytes_moved(shape, dtype): bytes one call reads and writes",
}
DTYPE_HINT = "a dtype torch knows: torch.float16, torch.bfloat16, torch.float32 (or its name, 'float16')"


def problem(what: str, where: str = "", hint: str = "") -> dict:
    return {"what": what, "where": where, "hint": hint}


def at(shape, dtype: str) -> str:
    """Every per-shape problem ends with "(at shape ... dtype)": the orchestrator groups by it."""
    return f"at shape {tuple(shape)} {dtype}"


class Lines:
    """file:line of a file's top-level names, and of the innermost frame of a traceback in that file."""

    def __init__(self, path: Path, shown: str):
        self.path, self.shown = path, shown
        try:
            self.source = path.read_text()
            self.tree = ast.parse(self.source)
        except (OSError, SyntaxError, UnicodeDecodeError):
            self.source, self.tree = "", ast.Module(body=[], type_ignores=[])
        self.names: dict[str, int] = {}
        for node in self.tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for name in [getattr(node, "name", None)] + [getattr(t, "id", None) for t in targets]:
                if name:
                    self.names.setdefault(name, node.lineno)

    def of(self, name: str) -> str:
        return f"{self.shown}:{self.names[name]}" if name in self.names else self.shown

    def of_exception(self, exc: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == self.path]
        return f"{self.shown}:{frames[-1].lineno}" if frames else self.shown


def listed(value) -> list:
    """DTYPES as the user wrote it: a list or tuple, or one dtype alone."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return [] if value is None else [value]


def good_dtypes(torch, module) -> list[str]:
    out = []
    for i, d in enumerate(listed(getattr(module, "DTYPES", None))):
        try:
            out.append(dtype_name(torch, d, f"DTYPES[{i}]"))
        except SpecError:
            pass
    return out


def spec_problems(torch, module, lines: Lines) -> list[dict]:
    """Every missing or malformed name of the spec, each on its own, and every value left as `...`."""
    out = [problem(f"the spec has no {name}", lines.shown, MISSING_HINTS[name]) for name in REQUIRED
           if not hasattr(module, name)]
    out += [problem(f"{name} is not a function", lines.of(name), f"def {name}(...)") for name in CALLABLE
            if hasattr(module, name) and not callable(getattr(module, name))]
    raw = getattr(module, "DTYPES", None)
    if hasattr(module, "DTYPES") and not listed(raw):
        out.append(problem("DTYPES is empty", lines.of("DTYPES"), "DTYPES = [torch.float16, torch.bfloat16]"))
    for i, d in enumerate(listed(raw)):
        try:
            dtype_name(torch, d, f"DTYPES[{i}]")
        except SpecError as exc:
            out.append(problem(str(exc), lines.of("DTYPES"), DTYPE_HINT))
    out += _tolerance_problems(torch, module, lines)
    for name in ("CORRECTNESS_SHAPES", "BENCHMARK_SHAPES", "INTERPRETER_SHAPES"):
        if getattr(module, name, None) is not None:
            try:
                shapes_of(getattr(module, name), name)
            except SpecError as exc:
                out.append(problem(str(exc), lines.of(name), "a list of tuples of ints, e.g. [(4096, 1024), (1, 7)]"))
    return out + _drawn_problems(module, lines) + placeholders(lines) + unwritten_reference(lines)


def _drawn_problems(module, lines: Lines) -> list[dict]:
    """DRAWN_SHAPES and TRANSFORMS, where the spec states them (`loop.common.spec` has their forms)."""
    try:
        rank = len(shapes_of(getattr(module, "CORRECTNESS_SHAPES", None), "CORRECTNESS_SHAPES")[0])
    except SpecError:
        rank = None
    out = []
    for name, parse, hint in (
            ("DRAWN_SHAPES", lambda v: drawn_shapes_of(v, rank), 'DRAWN_SHAPES = {"dims": [(1, 4096), (1, 16384)]}, '
             'or DRAWN_SHAPES = None, "why no other shapes can be checked"'),
            ("TRANSFORMS", transforms_of, 'TRANSFORMS = ["*10", "*100", "+90"], or TRANSFORMS = None, "why"')):
        if hasattr(module, name):
            try:
                parse(getattr(module, name))
            except SpecError as exc:
                out.append(problem(str(exc), lines.of(name), hint))
    return out


def _tolerance_problems(torch, module, lines: Lines) -> list[dict]:
    raw = getattr(module, "TOLERANCES", None)
    if raw is None:
        return []
    where, example = lines.of("TOLERANCES"), "{torch.float16: (1e-3, 1e-3)}"
    if not isinstance(raw, dict):
        return [problem(f"TOLERANCES must be a dict {{dtype: (atol, rtol)}}, got {type(raw).__name__}", where, example)]
    out, tolerances = [], set()
    for key, value in raw.items():
        try:
            name = dtype_name(torch, key, "TOLERANCES key")
            atol, rtol = (float(v) for v in value)
            tolerances.add(name)
        except SpecError as exc:
            out.append(problem(str(exc), where, example))
        except (TypeError, ValueError):
            out.append(problem(f"TOLERANCES[{key!r}] must be (atol, rtol), got {value!r}", where, example))
    return out + [problem(f"TOLERANCES has no entry for {d}", where, f"add {d!r}: (atol, rtol)")
                  for d in good_dtypes(torch, module) if d not in tolerances]


def placeholders(lines: Lines) -> list[dict]:
    """The values `tileloop spec` left as `...` in make_inputs, each with its line."""
    fn = next((n for n in lines.tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_inputs"), None)
    out = []
    for node in ast.walk(fn) if fn else []:
        pairs = []
        if isinstance(node, ast.Dict):
            pairs = [(k, v) for k, v in zip(node.keys, node.values) if k is not None]
        elif isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        for key, value in pairs:
            if isinstance(value, ast.Constant) and value.value is Ellipsis:
                name = key.value if isinstance(key, ast.Constant) else ast.unparse(key)
                out.append(problem(f"make_inputs: {name!r} is still `...`: its value is yours to give",
                                   f"{lines.shown}:{value.lineno}",
                                   "the value its callers pass (1e-6, 'llama', None, ...)"))
    return out


def unwritten_reference(lines: Lines) -> list[dict]:
    """The reference as `tileloop spec` left it: nothing but `raise NotImplementedError(...)`."""
    fn = next((n for n in lines.tree.body if isinstance(n, ast.FunctionDef) and n.name == "reference"), None)
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))] if fn else []
    if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
        return [problem("reference still raises NotImplementedError: the op in PyTorch is yours to write",
                        f"{lines.shown}:{body[0].lineno}", "return what the entry point returns, computed with torch")]
    return []


SIZE_HINTS = {
    "flops": "return the floating-point operations of one call (the element count for an element-wise op, "
             "2*M*N*K for a matmul; 0 only for an op that computes nothing, such as a copy), and drop the # TODO",
    "bytes_moved": "count every tensor read and written once (outputs too), and drop the # TODO",
}


def template_sizes(lines: Lines) -> tuple[list[dict], list[dict]]:
    """flops and bytes_moved as `tileloop spec` left them, their return line still marked `# TODO`:
    a constant 0 is a problem (TFLOP/s or GB/s, the roofline and the kernel's class would read it),
    the template's estimate of bytes a warning. (problems, warnings)"""
    problems, warnings = [], []
    text = lines.source.splitlines()
    for fn in lines.tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name in SIZE_HINTS):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Return) and node.value is not None and node.lineno <= len(text)
                    and "# TODO" in text[node.lineno - 1]):
                continue
            where = f"{lines.shown}:{node.lineno}"
            if isinstance(node.value, ast.Constant) and node.value.value == 0:
                problems.append(problem(f"{fn.name} still returns the template's 0 (# TODO): the roofline and the "
                                        "kernel's class would read it", where, SIZE_HINTS[fn.name]))
            else:
                warnings.append(problem(f"{fn.name} is still the template's estimate (# TODO)", where,
                                        SIZE_HINTS[fn.name]))
    return problems, warnings


def partial_checks(torch, module, target, device: str, spec_lines: Lines, fail) -> list[dict]:
    """With the spec not whole, what of it can run: make_inputs at every correctness shape and good
    dtype, the reference where there is one, and the entry point where it resolves (its failures,
    through `fail(KernelFailure, at)`); nothing is compared. Nothing runs while make_inputs still holds
    values to fill in."""
    make = getattr(module, "make_inputs", None)
    try:
        shapes = shapes_of(getattr(module, "CORRECTNESS_SHAPES", None), "CORRECTNESS_SHAPES")
    except SpecError:
        return []
    if not callable(make) or placeholders(spec_lines):
        return []
    reference = None if unwritten_reference(spec_lines) else getattr(module, "reference", None)
    entry = entry_point(module, target)
    kwargs = {"device": device} if "device" in inspect.signature(make).parameters else {}
    out = []
    for dtype in [d for d in good_dtypes(torch, module) if not (device == "cpu" and d == "bfloat16")]:
        for shape in shapes:
            where = at(shape, dtype)
            try:
                inputs = make(tuple(shape), getattr(torch, dtype), 12345, **kwargs)
                if not isinstance(inputs, dict):
                    raise SpecError(f"make_inputs returned {type(inputs).__name__}, not a dict of inputs")
                inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
                if callable(reference):
                    reference(**{k: upcast(torch, v.clone() if isinstance(v, torch.Tensor) else v)
                                 for k, v in inputs.items()})
            except BaseException as exc:  # noqa: BLE001 - the spec's own code failed: that is the finding
                out.append(problem(f"{type(exc).__name__}: {exc} ({where})", spec_lines.of_exception(exc), INPUTS_HINT))
                continue
            if entry is not None:
                try:
                    call_impl("candidate", "call", entry, **inputs)
                except KernelFailure as exc:
                    out.append(fail(exc, where))
    return out


def entry_point(module, target):
    """What the spec says to call with the inputs, or None when the target has no such function."""
    if target is None:
        return None
    adapter = getattr(module, "entry", None)
    if callable(adapter):
        return lambda **inputs: adapter(target, **inputs)
    fn = getattr(target, getattr(module, "ENTRY", "run"), None)
    return fn if callable(fn) else None
