"""Named reference implementations of a spec's op (the spec's `REFERENCES`, read by
`loop.common.spec.references_of`): the best public kernels (Liger-Kernel's, TileGym's, quack's, ...)
that `report --measure` and `compare` time beside the target, PyTorch eager and torch.compile, so
that every result says how far it is from them.

    REFERENCES = {
        # "module:function": called with the inputs as keyword arguments
        "mine_v1": "my_kernels.softmax:softmax",
        # ("module", adapter): the module imported here, then adapter(module, **inputs) called
        "liger": ("liger_kernel.ops.softmax", lambda liger, x, out: liger.LigerSoftmaxFunction.apply(x)),
    }

Each one is imported in a kernel process of its own (`load_reference`). One that cannot be
imported (not installed, or failing at import) is reported `unavailable` with the reason, never
dropped and never filled with another number; the judge checks an available one like the
implementations before it is timed (`loop.judge.references`).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace


def load_reference(spec, name: str) -> tuple[SimpleNamespace | None, str, str]:
    """(a stand-in with `run`, or None; where it comes from; why it is unavailable, or "")."""
    module_name, attr, adapter = spec.references[name]
    source = f"{module_name}:{attr}" if attr else f"{module_name} (adapter in the spec)"
    try:
        module = importlib.import_module(module_name)
        fn = _attribute(module, attr) if attr else None
    except Exception as exc:  # noqa: BLE001 - not installed, or broken at import: the reason is the record
        return None, source, f"{type(exc).__name__}: {exc}"[:500]
    run = fn if fn is not None else (lambda *, _m=module, _a=adapter, **inputs: _a(_m, **inputs))
    return SimpleNamespace(run=run), source, ""


def _attribute(module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{module.__name__}:{path} is not callable")
    return obj
