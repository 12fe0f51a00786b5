"""Proof of which backend really compiled the kernels (Triton's JIT caches name their target, cuTile
compiles are recorded as they happen, a CUDA C target's solve keeps the library nvcc built for the
device and its calls), and the per-backend hooks a job installs before the target is imported."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
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


def nvcc_proof(modules: dict[str, Any], arch: str | None) -> dict:
    """What ran a CUDA C target's kernels: for each target loaded (a module whose `solve` keeps its
    build, `loop.worker.cuda_build._Solve`), the shared library nvcc built for this device's `arch`
    ("sm_90"; None: no CUDA device), its build key and the hash of its bytes, and how many calls of
    solve returned. `ok` only where every target's library exists, was built for `arch` and was
    called at least once."""
    solves = {name: module.solve for name, module in modules.items()
              if hasattr(getattr(module, "solve", None), "built") and hasattr(module.solve, "calls")}
    if not solves:
        return {"ran": "unknown", "ok": False, "detail": "no CUDA C target loaded: no solve built by nvcc"}
    problems, seen = [], []
    for name, solve in solves.items():
        built = solve.built
        if built is None:
            problems.append(f"{name}: no library built (solve never bound)")
            continue
        library = Path(built.library)
        digest = hashlib.sha256(library.read_bytes()).hexdigest()[:16] if library.is_file() else None
        seen.append(f"{name}: {library.name} for {','.join(built.archs)} key={built.key} sha256={digest} "
                    f"calls={solve.calls}")
        if digest is None:
            problems.append(f"{name}: the library {library} is gone")
        if arch is None or arch not in built.archs:
            problems.append(f"{name}: built for {','.join(built.archs)}, not for this device's "
                            f"{arch or '(no CUDA device)'}")
        if solve.calls < 1:
            problems.append(f"{name}: solve was never called")
    ok = not problems
    return {"ran": "nvcc" if ok else "unknown", "ok": ok,
            "detail": "; ".join(problems + seen if problems else seen)[:800]}


def backend_proof(modules: dict[str, Any], backend: str, arch: str | None = None) -> dict:
    """What actually compiled the kernels: the targets and IR kinds in Triton's JIT caches (for
    "nvcc": `nvcc_proof` on this device's `arch`)."""
    if backend == "nvcc":
        return nvcc_proof(modules, arch)
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
