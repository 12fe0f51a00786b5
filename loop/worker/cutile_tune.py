"""An implementation's cuTile tuning choices, kept in its own folder: `keep_cutile_tunings(folder)`
wraps `cuda.tile.tune.exhaustive_search` (and the `_tune` module cuda.tile itself calls it through)
so that a search's result is stored in `<folder>/cutile-tune/<key>.json` and a later search with
the same key, in this kernel process or a later one, returns it without timing anything: an
incumbent autotuned per input key is tuned once per run, not once per kernel process.

The key (sha256) covers what the timings depend on: the kernel's python function (qualified name)
and its compiler options, the search space (repr of the configs, in order), for every config its
grid, the signature of its arguments (shapes, dtypes, strides and devices of tensors; values of
scalars) and its hints, the device's name and compute capability, cuda.tile's version and the
search's other options (`flush_l2`, `single_run_timeout_sec`). The implementation's source is the
folder's: the kernel process passes its own Triton cache folder
(`loop.common.namespaces.own_triton_cache`, `<label>-<hash of its source>`), so a stored result is
only ever used by the same implementation source on the same device, and a candidate cannot write
the incumbent's choices (their folder is not in its reach). The first search of a key still times
every config; a search whose key cannot be told (an argument or hint this module cannot describe,
no CUDA device) is timed every time and not stored. A file that is corrupt, written for another
key or naming configs the space does not have is ignored (the search runs again and replaces it);
files are written atomically."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import numbers
import sys
from pathlib import Path
from typing import Any, Callable

from loop.common.files import atomic_write_text

SUBFOLDER = "cutile-tune"
FORMAT = "tileloop-cutile-tune/1"
_SCALARS = (bool, int, float, str, type(None))
_DTYPES = ("torch.dtype", "cuda.tile.DType")  # dtype objects a kernel may take as an argument, told by repr
# the arguments of exhaustive_search read into the key one by one, or (the stream, whether it prints
# progress) left out: they change no timing
_READ = ("search_space", "stream", "grid_fn", "kernel", "args_fn", "hints_fn", "quiet")


class Unsigned(Exception):
    """Something of a search this module cannot describe in a key: the search is timed, not kept."""


def keep_cutile_tunings(folder: str) -> bool:
    """Install the keeping `exhaustive_search` in cuda.tile's `tune` and `tune._tune` modules, its
    results kept under `folder` (a second call rewraps the real search for the new folder). False
    (nothing installed) without a folder or without cuda.tile."""
    if not folder:
        return False
    try:
        import cuda.tile.tune as tune
        from cuda.tile.tune import _tune
    except ImportError:
        return False
    real = getattr(_tune.exhaustive_search, "tileloop_real", _tune.exhaustive_search)
    keeping = kept_search(real, Path(folder) / SUBFOLDER)
    tune.exhaustive_search = keeping
    _tune.exhaustive_search = keeping
    return True


def kept_search(real: Callable, store: Path) -> Callable:
    """`real` (cuda.tile's exhaustive_search) with its results kept in `store`, one file per key. Its
    arguments pass through as given; they are read by `real`'s own signature (a call that does not
    bind to it is `real`'s to refuse)."""
    signature = inspect.signature(real)

    @functools.wraps(real)
    def exhaustive_search(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return real(*args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        try:
            key = search_key(given)
        except Unsigned:
            return real(*args, **kwargs)
        kept = load_result(store / f"{key}.json", key, given["search_space"])
        if kept is not None:
            if not given.get("quiet", False):
                print(kept)
            return kept
        result = real(*args, **kwargs)
        write_result(store / f"{key}.json", key, given["search_space"], result)
        return result

    exhaustive_search.tileloop_real = real
    exhaustive_search.tileloop_store = store
    return exhaustive_search


# -- the key ----------------------------------------------------------------------------------------

def device_identity() -> dict:
    """The current CUDA device's name and compute capability (Unsigned without one)."""
    import torch

    if not torch.cuda.is_available():
        raise Unsigned("no CUDA device")
    index = torch.cuda.current_device()
    return {"name": torch.cuda.get_device_name(index), "capability": list(torch.cuda.get_device_capability(index))}


def search_key(given: dict) -> str:
    """sha256 (hex) of everything a search's timings depend on (module docstring), from the search's
    arguments by name; Unsigned if some part cannot be described. Arguments other than the ones
    named here (`flush_l2`, `single_run_timeout_sec`, any a later cuda.tile adds) enter by repr."""
    import cuda.tile

    space, kernel, hints_fn = given.get("search_space"), given.get("kernel"), given.get("hints_fn")
    grid_fn, args_fn = given.get("grid_fn"), given.get("args_fn")
    if not isinstance(space, (list, tuple)) or not space or grid_fn is None or args_fn is None:
        raise Unsigned("not a search space, grid_fn and args_fn")
    per_config = []
    for cfg in space:
        try:
            grid, chosen, args = grid_fn(cfg), kernel if _is_kernel(kernel) else kernel(cfg), args_fn(cfg)
            hints = hints_fn(cfg) if hints_fn is not None else {}
        except Exception as exc:  # noqa: BLE001 - the real search meets it (or records it) itself
            raise Unsigned(f"config {cfg!r}: {type(exc).__name__}") from exc
        per_config.append({"grid": _described(grid), "kernel": _kernel_identity(chosen),
                           "args": _described(args), "hints": _repr(hints)})
    others = {name: _repr(value) for name, value in sorted(given.items()) if name not in _READ}
    material = {"format": FORMAT, "space": [_repr(cfg) for cfg in space], "configs": per_config,
                "device": device_identity(), "cuda.tile": str(getattr(cuda.tile, "__version__", "")),
                "options": others}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _is_kernel(kernel) -> bool:
    from cuda.tile._execution import kernel as TileKernel

    return isinstance(kernel, TileKernel)


def _kernel_identity(kernel) -> list[str]:
    if not _is_kernel(kernel):
        raise Unsigned(f"the kernel function returned a {type(kernel).__name__}, not a cuda.tile kernel")
    func = getattr(getattr(kernel, "_annotated_function", None), "pyfunc", None) or getattr(kernel, "_pyfunc", None)
    if func is None:
        raise Unsigned("a cuda.tile kernel without its python function")
    return [func.__qualname__, _repr(getattr(kernel, "_compiler_options", None))]


def _repr(value: Any) -> str:
    """repr(value), refused where it names a memory address (it would differ in every process)."""
    text = repr(value)
    if " at 0x" in text:
        raise Unsigned(f"{type(value).__name__} has no stable repr")
    return text


def _described(value: Any) -> Any:
    """A JSON-able description of a kernel argument or grid: tensors by shape, dtype, strides and
    device; scalars and dtypes (torch's, cuda.tile's) by type and value; tuples and lists element by
    element."""
    if isinstance(value, _SCALARS) or isinstance(value, numbers.Number):
        return [type(value).__name__, _repr(value)]
    if f"{type(value).__module__}.{type(value).__qualname__}" in _DTYPES:
        return [type(value).__qualname__, _repr(value)]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_described(v) for v in value]]
    if hasattr(value, "shape") and hasattr(value, "dtype") and callable(getattr(value, "stride", None)):
        device = getattr(value, "device", None)
        return ["tensor", list(value.shape), str(value.dtype), list(value.stride()), str(getattr(device, "type", device))]
    interface = getattr(value, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        return ["cuda_array", list(interface.get("shape", ())), str(interface.get("typestr")),
                _repr(interface.get("strides"))]
    raise Unsigned(f"an argument of type {type(value).__name__}")


# -- the stored file --------------------------------------------------------------------------------

def _index(space, config) -> int | None:
    """The position of `config` in `space` (the same object first, an equal one else)."""
    for i, cfg in enumerate(space):
        if cfg is config:
            return i
    for i, cfg in enumerate(space):
        try:
            if cfg == config:
                return i
        except Exception:  # noqa: BLE001 - a config that cannot be compared is not this one
            continue
    return None


def _measurement(space, m) -> dict | None:
    index = _index(space, m.config)
    if index is None:
        return None
    return {"index": index, "mean_us": float(m.mean_us), "error_margin_us": float(m.error_margin_us),
            "num_samples": int(m.num_samples)}


def write_result(path: Path, key: str, space, result) -> bool:
    """`result` stored at `path` (atomically); False (nothing written) where a config is not in the
    space or the folder cannot be written."""
    successes = [_measurement(space, m) for m in result.successes]
    best = _index(space, result.best.config)
    failures = []
    for cfg, exc_type, message in result.failures:
        index = _index(space, cfg)
        if index is None:
            return False
        failures.append({"index": index, "type": f"{exc_type.__module__}:{exc_type.__qualname__}",
                         "message": str(message)})
    if best is None or any(s is None for s in successes):
        return False
    data = {"format": FORMAT, "key": key, "configs": len(space), "best": best, "successes": successes,
            "failures": failures}
    try:
        atomic_write_text(path, json.dumps(data))
    except OSError:
        return False
    return True


def load_result(path: Path, key: str, space):
    """The TuningResult stored at `path` for `key`, rebuilt with the configs of `space`; None where
    there is none, or it is corrupt or not this key's."""
    try:
        data = json.loads(path.read_text())
        return _rebuilt(data, key, space)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _rebuilt(data: dict, key: str, space):
    from cuda.tile.tune import Measurement, TuningResult

    if data.get("format") != FORMAT or data.get("key") != key or data.get("configs") != len(space):
        return None
    successes = []
    for s in data["successes"]:
        index, mean, margin, samples = s["index"], s["mean_us"], s["error_margin_us"], s["num_samples"]
        if not _valid_index(index, space) or not all(_finite(v) for v in (mean, margin)) or type(samples) is not int:
            return None
        successes.append(Measurement(config=space[index], mean_us=float(mean), num_samples=samples,
                                     error_margin_us=float(margin)))
    best = [m for m, s in zip(successes, data["successes"]) if s["index"] == data["best"]]
    if not best:
        return None
    failures = []
    for f in data["failures"]:
        if not _valid_index(f["index"], space) or not isinstance(f["message"], str):
            return None
        failures.append((space[f["index"]], _exception_type(str(f["type"])), f["message"]))
    return TuningResult(best=best[0], successes=tuple(successes), failures=tuple(failures))


def _valid_index(index, space) -> bool:
    return type(index) is int and 0 <= index < len(space)


def _finite(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _exception_type(name: str) -> type[BaseException]:
    """The exception class `module:qualname` names, from a module already imported (none is imported
    for a stored file); Exception where there is no such class."""
    module_name, _, qualname = name.partition(":")
    found: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else Exception
