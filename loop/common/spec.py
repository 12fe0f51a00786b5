"""The user's spec as tileloop's processes read it (the judge, which computes references and verdicts,
and the worker, which runs the kernel): tolerant of how PyTorch code is written, strict about what
cannot work.

Required names: `make_inputs(shape, dtype, seed[, device])`, `reference(**inputs)`,
`CORRECTNESS_SHAPES`, `BENCHMARK_SHAPES`, `DTYPES`, `TOLERANCES`, `flops(shape[, dtype])`,
`bytes_moved(shape[, dtype])`. Accepted forms:

- dtypes (`DTYPES` entries, `TOLERANCES` keys) as `torch.float16` or as names (`"float16"`,
  `"torch.float16"`), `DTYPES` as a list or one dtype alone; every spec function gets a `torch.dtype`;
- shapes as tuples or lists (of ints), a 1-d shape also as a bare int;
- `make_inputs` with a `device` parameter (then its tensors must be on that device) or without one
  (then tileloop moves what it returns to the device);
- `reference` returning a tensor, a tuple/list of tensors, or a dict of them: every output compared.

Optional names and their defaults:

- `OUTPUTS = ("out",)`: names of output buffers among the inputs, written in place by the kernel
  and compared when the entry point returns None;
- `INTERPRETER_SHAPES = CORRECTNESS_SHAPES[-1:]`: shapes timed under the Triton interpreter;
- `ENTRY = "run"`: the target's function called with the inputs (a library's op module need not
  have a `run`);
- `entry(target, **inputs)`: an adapter in the spec, called with the target module and the inputs
  (overrides `ENTRY`), for an op whose API is not a function of the inputs;
- `REFERENCES = {}`: named public kernels of the same op, timed beside the target by
  `report --measure` and `compare` (`name: "module:function"`, called with the inputs, or
  `name: ("module", adapter)`, called as `adapter(module, **inputs)`);
- `DRAWN_SHAPES`: where the judge draws shapes of its own each measurement (`loop.judge.drawn`).
  Left out: per dimension, between the smallest and largest value the spec's shapes use (a
  dimension whose values are all powers of two from 16 up, such as a head size, takes one of those
  values). `{"dims": [(1, 4096), 64, {64, 128}, None]}` states it per dimension: a range `(lo, hi)`,
  one value, a set of values, or None (a value the spec's shapes use there). `None, "reason"` turns
  the drawn shapes off;
- `TRANSFORMS = ("*10", "*100", "+90")`: the spec's floating inputs scaled or shifted before a
  comparison where the reference is finite; `{"ops": [...], "inputs": ["x"]}` names the inputs to
  transform (integer inputs never are); `None, "reason"` turns them off.
"""

from __future__ import annotations

import importlib.util
import inspect
import keyword
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from loop.common.errors import SpecError

DEFAULT_OUTPUTS = ("out",)
DEFAULT_ENTRY = "run"
DEFAULT_TRANSFORMS = ("*10", "*100", "+90")


def dtype_name(torch, value, where: str) -> str:
    """'float16' for torch.float16, 'float16' or 'torch.float16'; SpecError for anything else."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, str):
        name = value.strip().removeprefix("torch.")
        if isinstance(getattr(torch, name, None), torch.dtype):
            return str(getattr(torch, name)).removeprefix("torch.")
    raise SpecError(f"{where}: {value!r} is not a torch dtype; write torch.float16 or 'float16'")


def shape_of(value, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        return tuple(value)
    raise SpecError(f"{where}: {value!r} is not a shape; write a tuple of ints such as (4096, 1024)")


def shapes_of(value, where: str) -> list[tuple[int, ...]]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"{where} must be a non-empty list of shapes, got {value!r}")
    return [shape_of(s, f"{where}[{i}]") for i, s in enumerate(value)]


class Spec:
    """A spec module, read once: normalised names, defaults filled in, the entry point resolved."""

    def __init__(self, torch, module: types.ModuleType):
        self.torch, self.module = torch, module
        self.dtypes = [dtype_name(torch, d, f"DTYPES[{i}]") for i, d in enumerate(_list(module, "DTYPES"))]
        self.tolerances = self._tolerances(module)
        self.correctness_shapes = shapes_of(module.CORRECTNESS_SHAPES, "CORRECTNESS_SHAPES")
        self.benchmark_shapes = shapes_of(module.BENCHMARK_SHAPES, "BENCHMARK_SHAPES")
        interp = getattr(module, "INTERPRETER_SHAPES", None)
        self.interpreter_shapes = shapes_of(interp, "INTERPRETER_SHAPES") if interp else self.correctness_shapes[-1:]
        outputs = getattr(module, "OUTPUTS", DEFAULT_OUTPUTS)
        self.outputs = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        self.entry_name = getattr(module, "ENTRY", DEFAULT_ENTRY)
        self.adapter = getattr(module, "entry", None)
        self.accepts_device = "device" in inspect.signature(module.make_inputs).parameters
        self.references = references_of(module)
        self.drawn_shapes = drawn_shapes_of(getattr(module, "DRAWN_SHAPES", _ABSENT), len(self.correctness_shapes[0]))
        self.transforms = transforms_of(getattr(module, "TRANSFORMS", _ABSENT))

    def _tolerances(self, module) -> dict[str, tuple[float, float]]:
        raw = getattr(module, "TOLERANCES", None)
        if not isinstance(raw, dict):
            raise SpecError(f"TOLERANCES must be a dict {{dtype: (atol, rtol)}}, got {type(raw).__name__}")
        out = {}
        for key, value in raw.items():
            name = dtype_name(self.torch, key, "TOLERANCES key")
            try:
                atol, rtol = value
                out[name] = (float(atol), float(rtol))
            except (TypeError, ValueError):
                raise SpecError(f"TOLERANCES[{key!r}] must be (atol, rtol), got {value!r}") from None
        return out

    def torch_dtype(self, name: str):
        return getattr(self.torch, name)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        try:
            return self.tolerances[dtype]
        except KeyError:
            raise SpecError(f"TOLERANCES has no entry for {dtype}") from None

    def entry(self, target) -> Callable[..., Any]:
        """What a check or a timed call calls with the inputs: the spec's adapter, the target's ENTRY
        function (default `run`), or, for a stand-in that is not a module (torch eager, a planted
        wrapper), its `run`."""
        if not isinstance(target, types.ModuleType):
            return target.run
        if self.adapter is not None:
            adapter = self.adapter
            return lambda **inputs: adapter(target, **inputs)
        fn = getattr(target, self.entry_name, None)
        if not callable(fn):
            raise SpecError(f"the target has no function {self.entry_name!r} to call with the inputs"
                            + ("" if self.entry_name != DEFAULT_ENTRY else
                               "; name the entry point with ENTRY = '<function>' or an entry(target, **inputs) in the spec"))
        return fn

    def make_inputs(self, shape, dtype: str, seed: int, device: str) -> dict:
        kwargs = {"device": device} if self.accepts_device else {}
        inputs = self.module.make_inputs(tuple(shape), self.torch_dtype(dtype), seed, **kwargs)
        if not isinstance(inputs, dict):
            raise SpecError(f"make_inputs returned {type(inputs).__name__}, not a dict of inputs")
        tensors = {k: v for k, v in inputs.items() if isinstance(v, self.torch.Tensor)}
        if not self.accepts_device:  # tileloop places the inputs
            return {k: (v.to(device) if k in tensors else v) for k, v in inputs.items()}
        wrong = [f"{k} on {v.device.type}" for k, v in tensors.items() if v.device.type != device]
        if wrong:
            raise SpecError(f"make_inputs(device={device!r}) returned {', '.join(wrong)}: create the tensors on `device` "
                            "(or drop the device parameter and tileloop moves them)")
        return inputs

    def flops(self, shape, dtype: str) -> float:
        return float(self._sized(self.module.flops, shape, dtype))

    def bytes_moved(self, shape, dtype: str) -> float:
        return float(self._sized(self.module.bytes_moved, shape, dtype))

    def _sized(self, fn, shape, dtype: str):
        params = inspect.signature(fn).parameters
        return fn(tuple(shape), self.torch_dtype(dtype)) if len(params) >= 2 else fn(tuple(shape))


def references_of(module) -> dict[str, tuple[str, str | None, Any]]:
    """name -> (module, attribute path or None, adapter or None), from the spec's REFERENCES."""
    raw = getattr(module, "REFERENCES", None)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError("REFERENCES must be a dict {name: 'module:function' or ('module', adapter)}, "
                        f"got {type(raw).__name__}")
    out = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SpecError(f"REFERENCES: the name {name!r} must be an identifier, e.g. 'liger'")
        if isinstance(value, str) and value.count(":") == 1 and all(value.split(":")):
            module_name, attr = value.split(":")
            out[name] = (module_name, attr, None)
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0] and callable(value[1]):
            out[name] = (value[0], None, value[1])
        else:
            raise SpecError(f"REFERENCES[{name!r}] must be 'module:function' or ('module', adapter) with "
                            f"adapter(module, **inputs), got {value!r}")
    return out


_ABSENT = object()
_OP = re.compile(r"^\s*x?\s*([*+-])\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DrawnShapes:
    """Where the judge draws its shapes: `dims` per dimension ("range", lo, hi), ("value", v),
    ("values", (v, ...)) or ("listed",) (a value the spec's shapes use there); None when derived from
    the spec's shapes. `off` is the spec's reason when it turned them off."""

    dims: tuple | None = None
    off: str = ""


@dataclass(frozen=True)
class Transforms:
    """The transforms of the spec's floating inputs: ("scale", 10.0) or ("shift", 90.0), each with its
    text ("*10"); `inputs` the names transformed (None: every floating input); `off` the spec's reason."""

    ops: tuple[tuple[str, str, float], ...] = ()
    inputs: tuple[str, ...] | None = None
    off: str = ""


def _turned_off(value, name: str) -> str | None:
    """The reason of `NAME = None, "reason"`; None when `value` is not that form."""
    if value is None:
        raise SpecError(f'{name} = None needs a reason: {name} = None, "why these checks cannot apply"')
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] is None:
        if isinstance(value[1], str) and value[1].strip():
            return value[1].strip()
        raise SpecError(f'{name} = None, ... needs its reason as text: {name} = None, "why"')
    return None


def _dim_of(value, where: str) -> tuple:
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if value is None:
        return ("listed",)
    if whole(value):
        return ("value", value)
    if isinstance(value, (set, frozenset)) and value and all(whole(v) for v in value):
        return ("values", tuple(sorted(value)))
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(whole(v) for v in value) and value[0] <= value[1]:
        return ("range", value[0], value[1])
    raise SpecError(f"{where}: {value!r} is not a dimension; write (lo, hi) for a range, an int, a set of ints "
                    "{64, 128}, or None for the values the spec's shapes use")


def drawn_shapes_of(value, rank: int | None) -> DrawnShapes:
    """DRAWN_SHAPES as the spec wrote it (see the module's docstring); SpecError, one line, otherwise."""
    if value is _ABSENT:
        return DrawnShapes()
    if (reason := _turned_off(value, "DRAWN_SHAPES")) is not None:
        return DrawnShapes(off=reason)
    if not isinstance(value, dict) or set(value) != {"dims"} or not isinstance(value["dims"], (list, tuple)):
        raise SpecError(f"DRAWN_SHAPES must be {{\"dims\": [(lo, hi), ...]}} or None, \"reason\", got {value!r}")
    dims = tuple(_dim_of(d, f"DRAWN_SHAPES['dims'][{i}]") for i, d in enumerate(value["dims"]))
    if rank is not None and len(dims) != rank:
        raise SpecError(f"DRAWN_SHAPES['dims'] has {len(dims)} dimension(s), the correctness shapes {rank}: "
                        "one entry per dimension")
    return DrawnShapes(dims=dims)


def transforms_of(value) -> Transforms:
    """TRANSFORMS as the spec wrote it (see the module's docstring); SpecError, one line, otherwise."""
    if value is _ABSENT:
        value = DEFAULT_TRANSFORMS
    if (reason := _turned_off(value, "TRANSFORMS")) is not None:
        return Transforms(off=reason)
    inputs = None
    if isinstance(value, dict):
        names = value.get("inputs")
        if set(value) - {"ops", "inputs"} or "ops" not in value or not (names is None or (
                isinstance(names, (list, tuple)) and names and all(isinstance(n, str) for n in names))):
            raise SpecError(f'TRANSFORMS as a dict is {{"ops": ["*10", "+90"], "inputs": ["x"]}}, got {value!r}')
        value, inputs = value["ops"], None if names is None else tuple(names)
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f'TRANSFORMS must be a list such as ["*10", "*100", "+90"] (or None, "reason"), got {value!r}')
    ops = []
    for text in value:
        match = _OP.match(text) if isinstance(text, str) else None
        try:
            number = float(match.group(2)) if match else 0.0
        except ValueError:
            number = 0.0
        op = match.group(1) if match else ""
        if not match or number == 0.0 or (op == "*" and number == 1.0):
            raise SpecError(f"TRANSFORMS: {text!r} is not a transform; write '*10' (scale by a number other than 0 "
                            "and 1) or '+90' / '-90' (shift)")
        kind, amount = ("scale", number) if op == "*" else ("shift", -number if op == "-" else number)
        ops.append((kind, f"x{op}{match.group(2)}", amount))
    return Transforms(ops=tuple(ops), inputs=inputs)


def _list(module, name: str) -> list:
    """A non-empty list or tuple, or one value alone (`DTYPES = torch.bfloat16`)."""
    value = getattr(module, name)
    if isinstance(value, (list, tuple)):
        if value:
            return list(value)
        raise SpecError(f"{name} must be a non-empty list, got {value!r}")
    return [value]


def load_module(name: str, path: Path):
    """Import the Python file at `path` as module `name` (registered in sys.modules); a target of a
    language that is not Python (a `.cu` file) is loaded by its language's `load` instead."""
    from loop.common.language import loader_of

    other = loader_of(Path(path))
    if other is not None:
        return other(name, Path(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
