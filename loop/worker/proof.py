"""Proof of which backend really compiled the kernels (Triton's JIT caches name their target, cuTile
compiles are recorded as they happen), and the per-backend hooks a job installs before the target
is imported."""

from __future__ import annotations

import os
from typing import Any


def pin_autotune_to_first_config() -> None:
    """Triton's autotuner benchmarks on a GPU driver, which the interpreter does not have: under
    the interpreter an autotuned kernel runs its first config (interpreter timings say nothing
    about configs anyway; correctness of each config is what the CPU can check)."""
    from triton.runtime.autotuner import Autotuner

    real = Autotuner.run

    def first_config(self, *args, **kwargs):
        if len(self.configs) > 1:
            self.configs = self.configs[:1]
        return real(self, *args, **kwargs)

    Autotuner.run = first_config

CUTILE_COMPILES: list[dict] = []


def watch_cutile_compiles() -> None:
    """Record every cuTile JIT compilation (kernel, architecture, hints): the proof that kernels
    really went through cuda.tile and tileiras."""
    from cuda.tile import _execution

    real = _execution.kernel._compile

    def compile_and_record(self, signature, context, compute_capability=None):
        out = real(self, signature, context, compute_capability)
        opts = self._compiler_options
        CUTILE_COMPILES.append({"kernel": self._pyfunc.__name__, "cubin_bytes": len(out[0]) if out and out[0] else 0,
                                "occupancy": getattr(opts, "occupancy", None), "num_ctas": getattr(opts, "num_ctas", None)})
        return out

    _execution.kernel._compile = compile_and_record


def backend_proof(modules: dict[str, Any], backend: str) -> dict:
    """What actually compiled the kernels: the targets and IR kinds in Triton's JIT caches."""
    if backend == "interpreter":
        return {"ran": "interpreter", "ok": os.environ.get("TRITON_INTERPRET") == "1", "detail": "TRITON_INTERPRET=1"}
    if backend == "cutile":
        ok = bool(CUTILE_COMPILES) and all(c["cubin_bytes"] > 0 for c in CUTILE_COMPILES)
        return {"ran": "cutile" if ok else "unknown", "ok": ok,
                "detail": f"cuda.tile compiled {len(CUTILE_COMPILES)} kernel(s) through tileiras: {CUTILE_COMPILES}"[:800]}
    targets, kinds = set(), set()
    for module in modules.values():
        for obj in vars(module).values():
            fn = obj  # Autotuner/Heuristics wrap a JITFunction in .fn; a JITFunction's .fn is the Python function
            for _ in range(4):
                if fn is None or hasattr(fn, "device_caches"):
                    break
                fn = getattr(fn, "fn", None)
            caches = getattr(fn, "device_caches", None)
            if not isinstance(caches, dict):
                continue
            for entry in caches.values():
                kernel_cache = entry[0] if isinstance(entry, tuple) else entry
                for kernel in getattr(kernel_cache, "values", lambda: [])():
                    target = getattr(getattr(kernel, "metadata", None), "target", None)
                    if target is not None:
                        targets.add(str(getattr(target, "backend", target)))
                    kinds.update(getattr(kernel, "asm", {}).keys())
    if not targets and not kinds:
        return {"ran": "unknown", "ok": False, "detail": "no compiled kernels found in Triton's JIT caches"}
    ran = "tileir" if any("tile" in t for t in targets) or any("tile" in k for k in kinds) else "ptx"
    ok = ran == backend
    detail = f"targets={sorted(targets)} ir={sorted(kinds)}"
    if backend == "tileir" and ran == "ptx":
        detail = "FALLBACK to PTX: " + detail
    return {"ran": ran, "ok": ok, "detail": detail}
