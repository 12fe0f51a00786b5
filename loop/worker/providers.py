"""Named reference implementations of a spec's op: the best public kernels (Liger-Kernel's,
TileGym's, quack's, ...) that `report --measure` and `compare` time beside the target, PyTorch
eager and torch.compile, so that every result says how far it is from them.

A spec names them in `REFERENCES`, name -> where to find it:

    REFERENCES = {
        # "module:function": called with the inputs as keyword arguments
        "mine_v1": "my_kernels.softmax:softmax",
        # ("module", adapter): the module imported here, then adapter(module, **inputs) called
        "liger": ("liger_kernel.ops.softmax", lambda liger, x, out: liger.LigerSoftmaxFunction.apply(x)),
        "quack": ("quack.softmax", lambda quack, x, out: quack.softmax(x)),
    }

Each one is imported in the worker. One that cannot be imported (not installed, or failing at
import) is reported `unavailable` with the reason, never dropped and never filled with another
number. An available one is checked like the implementations (every dtype, every correctness
shape, the same seeds and tolerances) before it is timed; one that fails a check, or whose timed
run writes a wrong output, is reported `incorrect` (or, where it raised, `runtime_error`,
`compile_error` or `oom`) with the reason, and has no time. A wrongly written REFERENCES is the
spec's error.
"""

from __future__ import annotations

import importlib
import keyword
from types import SimpleNamespace

from loop.common.jobs import seed_for
from loop.worker.failures import STICKY_CUDA, ImplFailure, SpecError

SPEC_NAME = "REFERENCES"


def _entries(spec) -> dict[str, tuple[str, str | None, object]]:
    """name -> (module, attribute path or None, adapter or None), from the spec's REFERENCES."""
    raw = getattr(spec.module, SPEC_NAME, None)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(f"{SPEC_NAME} must be a dict {{name: 'module:function' or ('module', adapter)}}, "
                        f"got {type(raw).__name__}")
    out = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SpecError(f"{SPEC_NAME}: the name {name!r} must be an identifier, e.g. 'liger'")
        if isinstance(value, str) and value.count(":") == 1 and all(value.split(":")):
            module, attr = value.split(":")
            out[name] = (module, attr, None)
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0] and callable(value[1]):
            out[name] = (value[0], None, value[1])
        else:
            raise SpecError(f"{SPEC_NAME}[{name!r}] must be 'module:function' or ('module', adapter) with "
                            f"adapter(module, **inputs), got {value!r}")
    return out


class References:
    """The spec's references in one worker: imported, then checked, then settled after timing."""

    def __init__(self, spec, taken):
        self.report: dict[str, dict] = {}
        self.stand_ins: dict[str, SimpleNamespace] = {}
        for name, (module_name, attr, adapter) in _entries(spec).items():
            if name in taken:
                raise SpecError(f"{SPEC_NAME}: {name!r} is already the name of an implementation here; rename it")
            source = f"{module_name}:{attr}" if attr else f"{module_name} (adapter in the spec)"
            self.report[name] = {"source": source, "status": "ok", "reason": ""}
            try:
                module = importlib.import_module(module_name)
                fn = _attribute(module, attr) if attr else None
            except Exception as exc:  # noqa: BLE001 - not installed, or broken at import: the reason is the record
                self.report[name].update(status="unavailable", reason=f"{type(exc).__name__}: {exc}"[:500])
                continue
            run = fn if fn is not None else (lambda *, _m=module, _a=adapter, **inputs: _a(_m, **inputs))
            self.stand_ins[name] = SimpleNamespace(run=run)

    def check(self, harness, job: dict, dtypes: list[str], shapes, modules: dict) -> dict[str, dict]:
        """Check each available reference at every dtype and shape; the correct ones join `modules`
        (to be timed). Returns the report: name -> {source, status, reason, checks}."""
        for name, stand_in in self.stand_ins.items():
            checks = 0
            for dtype in dtypes:
                for shape in shapes:
                    status = "incorrect"
                    try:
                        rec = harness.check_one(stand_in, name, shape, dtype, seed_for(job["seed"], name, tuple(shape), dtype))
                    except ImplFailure as exc:
                        if any(m.lower() in exc.message.lower() for m in STICKY_CUDA):
                            raise  # the CUDA context is gone: nothing after this could be timed
                        status, rec = exc.status, {"ok": False, "reason": exc.message}
                    checks += 1
                    if not rec["ok"]:
                        self.report[name].update(status=status, reason=f"{tuple(shape)} {dtype}: {rec['reason']}"[:500])
                        break
                if self.report[name]["status"] != "ok":
                    break
            self.report[name]["checks"] = checks
            if self.report[name]["status"] == "ok":
                modules[name] = stand_in
        return self.report

    def settle(self, result: dict) -> None:
        """After timing: a reference whose timed run wrote a wrong output is `incorrect` and loses its
        times (its recheck leaves the job's own recheck, which judges the implementations only)."""
        shapes = result.get("timing", {}).get("shapes", [])
        for s in shapes:
            for name in [n for n in s.get("recheck", {}) if n in self.report]:
                rc = s["recheck"].pop(name)
                if not rc["ok"] and self.report[name]["status"] == "ok":
                    self.report[name].update(status="incorrect",
                                             reason=f"output written by the timed run is wrong at {s['shape']}: {rc.get('reason')}"[:500])
        wrong = [n for n, r in self.report.items() if r["status"] != "ok"]
        for s in shapes:
            for name in wrong:
                s["impls"].pop(name, None)
        result["references"] = self.report


def _attribute(module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{module.__name__}:{path} is not callable")
    return obj
