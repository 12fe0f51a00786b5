"""Proof of which backend really compiled the kernels (Triton's JIT caches name their target, cuTile
compiles are recorded as they happen, a CUDA C target's solve keeps the library nvcc built for the
device and its calls, TileLang's compiles are recorded as they happen and its kernels name their
target and cache folder), and the per-backend hooks a job installs before the target is imported."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType
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


TILELANG_COMPILES: list[dict] = []  # every kernel TileLang compiled in this process: {symbol, arch, id}


def watch_tilelang_compiles() -> None:
    """Record every kernel TileLang compiles in this process (a `JITKernel` lowered and built from its
    TIR, not loaded from a cache): its symbol, the architecture it was built for and the kernel's id."""
    from tilelang.jit.kernel import JITKernel

    from loop.worker.tilelang_build import kernel_arch

    real = JITKernel._compile_and_create_adapter
    if getattr(real, "tileloop_watched", False):
        return

    def compile_and_record(self, tilelang_func, out_idx):
        adapter = real(self, tilelang_func, out_idx)
        symbol = tilelang_func.attrs.get("global_symbol") if tilelang_func.attrs is not None else None
        TILELANG_COMPILES.append({"symbol": str(symbol) if symbol else None, "arch": kernel_arch(self), "id": id(self)})
        return adapter

    compile_and_record.tileloop_watched = True  # type: ignore[attr-defined]
    JITKernel._compile_and_create_adapter = compile_and_record


def _within(path: str | None, folder: str) -> bool:
    """Whether `path` lies in `folder` (both as this process names them; "" is no folder)."""
    return bool(path and folder) and os.path.normpath(path).startswith(os.path.normpath(folder) + os.sep)


def tilelang_proof(kernels: dict[str, list[dict]], compiled: list[dict], arch: str | None, cache: str) -> dict:
    """What built a TileLang target's kernels: for each implementation loaded (label -> its kernels,
    `loop.worker.tilelang_build.compiled_kernels`), each kernel's architecture and where it came from.
    `ok` only where there is at least one kernel and every one was built for this device's TileLang
    target (`arch` "sm_90" -> "sm_90a"; None: no CUDA device) and either compiled by TileLang in this
    process (`compiled`, `watch_tilelang_compiles`) or loaded from this implementation's own cache
    folder `cache`."""
    from loop.worker.tilelang_build import arch_target

    expected = arch_target(int(arch.removeprefix("sm_"))) if arch else None
    here = {c["id"] for c in compiled}
    problems: list[str] = []
    seen: dict[str, int] = {}  # what each kernel is, and how many kernels (shapes, dtypes) are so
    for label, rows in kernels.items():
        for row in rows:
            name = f"{label}: {row['kernel']} ({row.get('symbol') or '?'})"
            if row["id"] in here:
                source = "compiled here"
            elif _within(row.get("cache_path"), cache):
                source = "loaded from its own cache"
            else:
                source = f"loaded from {row.get('cache_path') or 'no cache'}"
                problems.append(f"{name}: neither compiled in this process nor loaded from this implementation's "
                                f"own cache ({source})")
            what = f"{name} for {row.get('arch') or '?'}, {source}"
            seen[what] = seen.get(what, 0) + 1
            if expected is None or row.get("arch") != expected:
                problems.append(f"{name}: built for {row.get('arch') or 'no architecture'}, not for this device's "
                                f"{expected or '(no CUDA device)'}")
    if not seen:
        return {"ran": "unknown", "ok": False, "detail": "no TileLang kernel compiled: the target's @tilelang.jit "
                                                          "functions hold none"}
    ok = not problems
    kinds = [what if n == 1 else f"{what} (x{n})" for what, n in seen.items()]
    return {"ran": "tilelang" if ok else "unknown", "ok": ok,
            "detail": "; ".join(list(dict.fromkeys(problems)) + kinds if problems else kinds)[:800]}


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


def backend_proof(modules: dict[str, Any], backend: str, arch: str | None = None, tilelang_cache: str = "") -> dict:
    """What actually compiled the kernels: the targets and IR kinds in Triton's JIT caches (for
    "nvcc": `nvcc_proof` on this device's `arch`; for "tilelang": `tilelang_proof`, with the
    implementation's own TileLang cache folder)."""
    if backend == "nvcc":
        return nvcc_proof(modules, arch)
    if backend == "tilelang":
        from loop.worker.tilelang_build import compiled_kernels

        held = {label: compiled_kernels(module) for label, module in modules.items() if isinstance(module, ModuleType)}
        return tilelang_proof(held, TILELANG_COMPILES, arch, tilelang_cache)
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
