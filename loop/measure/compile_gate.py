"""The compile gate: the candidate compiled ahead of time for every architecture of the run
(default sm_90 and sm_100) and every dtype of its spec, in workers, before a GPU second is spent on
it; no GPU is needed. The workers run in the environment of the language's `compile_backend` and
compile with its `compile` function (`loop.common.language`). Also `tileloop compile`."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure
from loop.common.language import get_language
from loop.common.settings import Settings
from loop.measure.launch import kill_group, run_worker


def compile_parallelism(n_jobs: int) -> int:
    """Compile workers to run at once: one per (architecture, dtype) up to the cores there are,
    at most 8; 1 (one worker for everything) on a machine with fewer than 4 cores, where the
    start-up of extra workers (each imports torch) would cost more than it saves."""
    cores = os.cpu_count() or 1
    return 1 if cores < 4 else max(1, min(n_jobs, cores // 2, 8))

def compile_gate(*, workdir: Path, spec_path: Path, target_dir: Path, target: Path, language: str, archs: list[str],
                 settings: Settings, cache_root: Path, name: str = "compile", dtypes: list[str] | None = None) -> dict:
    """Ahead-of-time compile for every architecture and dtype (no GPU needed); a typed worker
    result. An autotuned candidate compiles every config for each (architecture, dtype): with
    cores to spare, the pairs go to parallel workers (`compile_parallelism`) and their results
    are merged in the order one worker would have produced them. `dtypes` (the spec's DTYPES)
    enables the split; without it one worker compiles everything."""
    base = {"mode": "compile", "spec": str(spec_path), "target_dir": str(target_dir), "target": str(target),
            "language": language, "archs": archs}
    backend = backend_registry.get(get_language(language).compile_backend)
    # the run's own cache, or one shared by runs (TILELOOP_AOT_CACHE): only the gate's verdict comes from it,
    # never a kernel the judge times (each implementation the judge loads compiles in a cache of its own)
    aot = settings.aot_cache or cache_root / "aot"
    pairs = [(arch, dtype) for arch in archs for dtype in (dtypes or [])]
    parallel = compile_parallelism(len(pairs)) if len(pairs) > 1 else 1
    if parallel <= 1:
        raws = [run_worker(workdir, base, backend, settings, aot, name=name)]
    else:
        procs: list = []

        def one(i: int, arch: str, dtype: str) -> dict:
            job = {**base, "archs": [arch], "dtypes": [dtype]}
            return run_worker(workdir, job, backend, settings, aot, name=f"{name}-{i}", procs=procs)

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures: list = []
            try:  # from the first submit: an interrupt between two submits leaves no worker behind either
                futures.extend(pool.submit(one, i, arch, dtype) for i, (arch, dtype) in enumerate(pairs))
                raws = [f.result() for f in futures]
            except BaseException:  # Ctrl-C or SIGTERM in the main thread: no compile worker left behind
                for f in futures:
                    f.cancel()
                for proc in list(procs):
                    kill_group(proc)
                raise
    for raw in raws:
        if raw.get("status") in ("spec_error", "harness_error"):
            raise HarnessFailure(f"compile worker: {raw['status']}: {raw.get('message')} (logs: {workdir})")
    if len(raws) == 1:
        return raws[0]
    results = [r for raw in raws for r in (raw.get("compile") or {}).get("results", [])]
    merged = {"status": "ok", "compile": {"ok": all(r.get("ok") for r in results), "results": results},
              "wall_s": max(raw.get("wall_s", 0.0) for raw in raws)}
    bad = next((raw for raw in raws if raw.get("status") != "ok"), None)
    if bad is not None:  # the first failure in (arch, dtype) order, as a single worker reports it
        merged.update({k: v for k, v in bad.items() if k != "compile"})
    return merged

def compile_summary(raw: dict) -> list[dict]:
    """One row per architecture, dtype and kernel: registers, spills, shared memory."""
    rows = []
    for entry in (raw.get("compile") or {}).get("results", []):
        if not entry.get("ok"):
            rows.append({"arch": entry["arch"], "dtype": entry["dtype"], "ok": False, "error": entry.get("error", "")[:500]})
            continue
        for k in entry["kernels"]:
            for res in k.get("resources") or [{}]:
                rows.append({"arch": entry["arch"], "dtype": entry["dtype"], "ok": True, "kernel": k["kernel"],
                             "registers": res.get("registers"), "spills": res.get("spills"), "local": res.get("local"),
                             "shared": k.get("shared_bytes", res.get("shared")), "num_warps": k.get("num_warps")})
    return rows
