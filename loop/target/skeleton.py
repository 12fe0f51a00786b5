"""`tileloop spec <target>`: a commented spec.py to fill in, written from the target's entry point.

The entry point (`run`, the function named with --entry, or with --entry naming a class, an
autograd Function whose `forward` gives the inputs and whose `apply` a spec adapter calls) gives the
inputs: each parameter becomes a line of make_inputs and an argument of the reference, a parameter
with a default keeps it, a parameter named like a weight or a bias (W, B, weight, ...) is made a
vector of the last dimension, and a parameter named like an output (out, y, output, ...) is made an
empty buffer and listed in OUTPUTS. What the entry point returns is quoted above the reference, with
an adapter to compare only some of it when it returns several values. What only the user knows (a
scalar's value, the reference itself) is left as `...` or an exception, so that `tileloop check`
names each, with its line, until it is written.
"""

from __future__ import annotations

import ast
from pathlib import Path

from loop.common.errors import UserError

OUTPUT_NAMES = {"out", "output", "y", "result", "dst", "o"}
# parameters that are scalars or options, not tensors, going by their names
SCALAR_NAMES = {"eps", "epsilon", "offset", "alpha", "beta", "scale", "dim", "axis", "p", "bias_scale", "gate_multiplier"}
SCALAR_HINTS = ("_mode", "mode", "is_", "use_", "in_place", "num_", "block", "BLOCK")
# parameters that are vectors over the last dimension (a norm's weight and bias), going by their names
VECTOR_NAMES = {"w", "weight", "bias", "gamma"}


def _is_scalar(name: str) -> bool:
    low = name.lower()
    return low in SCALAR_NAMES or any(low.startswith(h) or low.endswith(h) for h in SCALAR_HINTS)


def _entry_node(tree: ast.Module, entry: str) -> tuple[ast.FunctionDef | None, str | None]:
    """The entry function, and the class when the entry is a class (its `forward`) or `Class.method`."""
    name, _, method = entry.partition(".")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            return node, None
        if isinstance(node, ast.ClassDef) and node.name == name:
            wanted = method or "forward"
            fn = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == wanted), None)
            return fn, name if fn is not None else None
    return None, None


def entry_parameters(source: str, entry: str) -> list[tuple[str, str | None]]:
    """(name, default as source text or None) of the entry function's parameters."""
    fn, _ = _entry_node(ast.parse(source), entry)
    if fn is None:
        tree = ast.parse(source)
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list]
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                   and any(isinstance(m, ast.FunctionDef) and m.name == "forward" for m in n.body)]
        raise UserError(f"the target has no top-level function {entry}()",
                        hint=f"name its entry point with --entry (functions here: {', '.join(names) or 'none'}"
                             + (f"; classes with a forward: {', '.join(classes)}" if classes else "") + ")")
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    defaults = [None] * (len(fn.args.posonlyargs + fn.args.args) - len(fn.args.defaults)) + fn.args.defaults + \
        list(fn.args.kw_defaults)
    return [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args, defaults) if a.arg not in ("self", "ctx")]


def entry_returns(source: str, entry: str) -> list[str]:
    """What the entry function's `return` statements return, as source text (its own, not nested functions')."""
    fn, _ = _entry_node(ast.parse(source), entry)
    if fn is None:
        return []
    out, todo = [], list(fn.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Return) and node.value is not None:
            out.append(ast.unparse(node.value))
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return list(dict.fromkeys(out))


def _is_vector(name: str, names: set[str]) -> bool:
    """A weight or a bias, by its name; `B` (or `b`) when a weight `W` is there too."""
    low = name.lower()
    return low in VECTOR_NAMES or low.endswith(("_weight", "_bias")) or (low == "b" and bool({"w", "weight"} & names))


def _made(params: list[tuple[str, str | None]], outputs: list[str]) -> tuple[list[str], int, int]:
    """make_inputs' lines, and how many full-shape tensors and vectors they make (for bytes_moved)."""
    names = {n.lower() for n, _ in params}
    made, full, vectors = [], len(outputs), 0
    for name, default in params:
        if name in outputs:
            continue
        if default is not None:
            made.append(f'        "{name}": {default},  # the entry point\'s default')
        elif _is_scalar(name):
            made.append(f'        "{name}": ...,  # TODO: its value (a scalar or an option, going by its name)')
        elif _is_vector(name, names):
            vectors += 1
            made.append(f'        "{name}": torch.randn(shape[-1], generator=g, dtype=torch.float32).to(dtype),'
                        '  # TODO: a vector over the last dimension?')
        else:
            full += 1
            made.append(f'        "{name}": torch.randn(shape, generator=g, dtype=torch.float32).to(dtype),  # TODO: its shape')
    made += [f'        "{name}": torch.empty(shape, dtype=dtype),  # an output buffer (OUTPUTS)' for name in outputs]
    return made, full, vectors


def _entry_lines(entry: str, cls: str | None, params: list[tuple[str, str | None]], returns: list[str]) -> list[str]:
    """How the spec calls the target: ENTRY, or an adapter for a class (an autograd Function's apply);
    with what the entry returns quoted, and an adapter to compare only some of it when it returns several values."""
    args = ", ".join(n for n, _ in params)
    if cls is not None:
        return ["", f"def entry(target, {args}):",
                f'    """The op through {cls}.apply, as a model calls it (the inputs as forward takes them)."""',
                f"    return target.{cls}.apply({args})", "", ""]
    lines = [f'ENTRY = "{entry}"  # the target\'s function called with the inputs below'] if entry != "run" else []
    several = [r for r in returns if r.startswith("(") and r.endswith(")") and "," in r]
    if several:
        values = several[0][1:-1]
        lines += [f"# {entry} returns", f"#     ({values})",
                  "# and each value is compared, in order, with what reference returns. To compare only the",
                  "# outputs a change must keep right, replace ENTRY with an adapter:",
                  "#", f"# def entry(target, {args}):",
                  f"#     values = target.{entry}({args})",
                  "#     return values[0]  # TODO: the outputs to compare, e.g. values[0], values[2]"]
    elif returns:
        lines += [f"# {entry} returns {returns[0]}"]
    return lines + ([""] if lines else [])


def skeleton(op: str, entry: str, params: list[tuple[str, str | None]], returns: list[str] | None = None,
             cls: str | None = None) -> str:
    outputs = [n for n, d in params if n.lower() in OUTPUT_NAMES and d is None]
    made, full, vectors = _made(params, outputs)
    args = ", ".join(n for n, _ in params)
    moved = f"{max(full, 1)} * torch.Size(shape).numel()" + (f" + {vectors} * shape[-1]" if vectors else "")
    lines = [
        f'"""The contract of {op} for tileloop: inputs, the PyTorch reference, shapes and tolerances.',
        "",
        'Written by `tileloop spec`; fill in the TODOs and the `...`, then run `tileloop check` on the target."""',
        "",
        "import torch",
        "",
        *_entry_lines(entry, cls, params, returns or []),
        "# odd, non-power-of-two sizes catch masking bugs; the last one is also timed under --device cpu",
        "CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000)]  # TODO: shapes of your op",
        "BENCHMARK_SHAPES = [(4096, 4096)]  # TODO: the shapes that matter for speed",
        "DTYPES = [torch.float16, torch.float32]",
        "TOLERANCES = {torch.float16: (1e-3, 1e-3), torch.float32: (1e-5, 1e-5)}  # (atol, rtol) per dtype",
        f"OUTPUTS = {tuple(outputs)!r}  # output buffers among the inputs, written in place (compared when the entry returns None)",
        *spec_functions(op, made, args,
                        ['    """The op in PyTorch; tileloop passes fp32 copies of half inputs (fp64 of fp32) and compares every',
                         '    output (return a tensor, or a tuple or dict of them in the order the entry point returns them)."""'],
                        f"({moved}) * size  # TODO: count every tensor read and written (outputs too)"),
    ]
    return "\n".join(lines)


def spec_functions(op: str, made: list[str], args: str, reference_doc: list[str], moved: str) -> list[str]:
    """The functions every written spec has, whatever the target's language: make_inputs (its dict's
    lines `made`), a reference of `args` to fill in (its docstring `reference_doc`), flops, and
    bytes_moved returning `moved` (an expression in shape and size)."""
    return [
        "",
        "",
        "def make_inputs(shape, dtype, seed):",
        '    """Fresh random inputs (never zeros), built on the CPU: tileloop moves them to the device."""',
        "    g = torch.Generator().manual_seed(seed)",
        "    return {",
        *made,
        "    }",
        "",
        "",
        f"def reference({args}):",
        *reference_doc,
        f'    raise NotImplementedError("write {op} in PyTorch here")',
        "",
        "",
        "def flops(shape, dtype):",
        '    """Floating-point operations of one call, for TFLOP/s."""',
        "    return 0  # TODO",
        "",
        "",
        "def bytes_moved(shape, dtype):",
        '    """Bytes one call must read and write at least, for GB/s and the fraction of copy bandwidth."""',
        "    size = torch.empty((), dtype=dtype).element_size()",
        f"    return {moved}",
        "",
    ]


def write_spec(target: Path, entry: str = "run", force: bool = False) -> Path:
    """Write the skeleton beside the target; refuse to overwrite a spec unless `force`."""
    if not target.is_file():
        raise UserError(f"target {target} does not exist")
    spec = target.parent / "spec.py"
    if spec.exists() and not force:
        raise UserError(f"{spec} exists", hint="pass --force to overwrite it, or edit it")
    op = target.stem.removesuffix("_triton").removesuffix("_cutile")
    source = target.read_text()
    _, cls = _entry_node(ast.parse(source), entry)
    spec.write_text(skeleton(op, entry, entry_parameters(source, entry), entry_returns(source, entry), cls))
    return spec
