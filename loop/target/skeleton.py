"""`tileloop spec <target>`: a commented spec.py to fill in, written from the target's entry point.

The entry point (`run`, or the function named with --entry) gives the inputs: each parameter becomes
a line of make_inputs and an argument of the reference, a parameter with a default keeps it, and a
parameter named like an output (out, y, output, ...) is made an empty buffer and listed in OUTPUTS.
What only the user knows (the shapes, the reference itself) is left as an exception that says so,
so that `tileloop check` fails until it is written.
"""

from __future__ import annotations

import ast
from pathlib import Path

from loop.common.errors import UserError

OUTPUT_NAMES = {"out", "output", "y", "result", "dst", "o"}
# parameters that are scalars or options, not tensors, going by their names
SCALAR_NAMES = {"eps", "epsilon", "offset", "alpha", "beta", "scale", "dim", "axis", "p", "bias_scale", "gate_multiplier"}
SCALAR_HINTS = ("_mode", "mode", "is_", "use_", "in_place", "num_", "block", "BLOCK")


def _is_scalar(name: str) -> bool:
    low = name.lower()
    return low in SCALAR_NAMES or any(low.startswith(h) or low.endswith(h) for h in SCALAR_HINTS)


def entry_parameters(source: str, entry: str) -> list[tuple[str, str | None]]:
    """(name, default as source text or None) of the entry function's parameters."""
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry), None)
    if fn is None:
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list]
        raise UserError(f"the target has no top-level function {entry}()",
                        hint=f"name its entry point with --entry (functions here: {', '.join(names) or 'none'})")
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    defaults = [None] * (len(fn.args.posonlyargs + fn.args.args) - len(fn.args.defaults)) + fn.args.defaults + \
        list(fn.args.kw_defaults)
    return [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args, defaults) if a.arg not in ("self", "ctx")]


def skeleton(op: str, entry: str, params: list[tuple[str, str | None]]) -> str:
    outputs = [n for n, d in params if n.lower() in OUTPUT_NAMES and d is None]
    inputs = [(n, d) for n, d in params if n not in outputs]
    made = []
    for name, default in inputs:
        if default is not None:
            made.append(f'        "{name}": {default},  # the entry point\'s default')
        elif _is_scalar(name):
            made.append(f'        "{name}": None,  # TODO: its value (a scalar or an option, going by its name)')
        else:
            made.append(f'        "{name}": torch.randn(shape, generator=g, dtype=torch.float32).to(dtype),  # TODO: its shape')
    made += [f'        "{name}": torch.empty(shape, dtype=dtype),  # an output buffer (OUTPUTS)' for name in outputs]
    args = ", ".join(n for n, _ in params)
    lines = [
        f'"""The contract of {op} for tileloop: inputs, the PyTorch reference, shapes and tolerances.',
        "",
        'Written by `tileloop spec`; fill in the TODOs, then run `tileloop check` on the target."""',
        "",
        "import torch",
        "",
        *([f'ENTRY = "{entry}"  # the target\'s function called with the inputs below', ""] if entry != "run" else []),
        "# odd, non-power-of-two sizes catch masking bugs; the last one is also timed under --device cpu",
        "CORRECTNESS_SHAPES = [(1, 7), (5, 33), (37, 1000)]  # TODO: shapes of your op",
        "BENCHMARK_SHAPES = [(4096, 4096)]  # TODO: the shapes that matter for speed",
        "DTYPES = [torch.float16, torch.float32]",
        "TOLERANCES = {torch.float16: (1e-3, 1e-3), torch.float32: (1e-5, 1e-5)}  # (atol, rtol) per dtype",
        f"OUTPUTS = {tuple(outputs)!r}  # output buffers among the inputs, written in place (compared when the entry returns None)",
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
        '    """The op in PyTorch; tileloop passes fp32 copies of half inputs (fp64 of fp32) and compares every',
        '    output (return a tensor, or a tuple or dict of them in the order the entry point returns them)."""',
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
        f"    return {max(len(params), 1)} * torch.Size(shape).numel() * size  # TODO: count every tensor read and written",
        "",
    ]
    return "\n".join(lines)


def write_spec(target: Path, entry: str = "run", force: bool = False) -> Path:
    """Write the skeleton beside the target; refuse to overwrite a spec unless `force`."""
    if not target.is_file():
        raise UserError(f"target {target} does not exist")
    spec = target.parent / "spec.py"
    if spec.exists() and not force:
        raise UserError(f"{spec} exists", hint="pass --force to overwrite it, or edit it")
    op = target.stem.removesuffix("_triton").removesuffix("_cutile")
    spec.write_text(skeleton(op, entry, entry_parameters(target.read_text(), entry)))
    return spec
