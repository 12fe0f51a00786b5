"""One measurement of one iteration: a worker per backend, turned into typed results.

The target backend runs first; if it crashes or is incorrect the guard backends are not run
(the candidate is rejected anyway) and say so. Raw samples stay in the worker's result file
under `sandbox/<run>/iter-NNN/`; records keep per-shape summaries.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure, UserError
from loop.records.results import BackendResult
from loop.measure.launch import kill_group, run_worker
from loop.common.settings import Settings
from loop.common.stats import geomean
from loop.common.jobs import seed_for

SUMMARY_KEYS = ("median_ms", "iqr_ms", "rel_std", "min_ms", "max_ms", "nrep", "peak_mem_mb", "gbps", "tflops", "frac_clone_bw",
                "tuned")  # tuned: the configs a run-time tuner picked for this shape in the timing process



@dataclass
class Measurement:
    results: dict[str, BackendResult]
    raw: dict[str, dict]  # backend -> worker result (with samples)

    def target(self, name: str) -> BackendResult:
        return self.results[name]


def _summary(stats: dict) -> dict:
    return {k: stats.get(k) for k in SUMMARY_KEYS if k in stats}


def to_backend_result(name: str, raw: dict, label: str, workdir: Path, root: Path) -> BackendResult:
    backend = backend_registry.get(name)
    status = raw.get("status", "runtime_error")
    rel_dir = str(workdir.relative_to(root))
    if status in ("spec_error", "harness_error"):
        raise HarnessFailure(f"{name} worker: {status}: {raw.get('message')} (logs: {rel_dir})")
    correctness = "PASS" if raw.get("correctness", {}).get("passed") and status == "ok" else "FAIL"
    if status != "ok":
        msg = raw.get("message", "")
        return BackendResult(name, True, status, msg[:500], correctness=correctness,
                             timing_label=backend.timing_label, worker_dir=rel_dir)
    shapes, cand, inc = [], [], []
    for s in raw["timing"]["shapes"]:
        impls = s["impls"]
        entry = {"shape": s["shape"], "dtype": s["dtype"], "method": s["method"], "flops": s.get("flops"), "bytes": s.get("bytes"),
                 "calls_per_sample": s["calls_per_sample"], "notes": s.get("notes", []),
                 label: _summary(impls[label])}
        cand.append(impls[label]["median_ms"])
        if "incumbent" in impls and label != "incumbent":
            entry["incumbent"] = _summary(impls["incumbent"])
            inc.append(impls["incumbent"]["median_ms"])
        if s.get("clone"):
            entry["clone_gbps"] = s["clone"]["gbps"]
        shapes.append(entry)
    proof = raw.get("proof")
    if proof and not proof.get("ok"):
        return BackendResult(name, True, "fallback", f"backend proof failed: {proof.get('detail')}", correctness=correctness,
                             timing_label=backend.timing_label, proof=proof, shapes=shapes, worker_dir=rel_dir)
    return BackendResult(name, True, "ok", "", geomean(cand), geomean(inc) if inc else None, correctness,
                         backend.timing_label, proof, shapes, rel_dir)


def not_run(name: str, availability: dict[str, dict], reason: str) -> BackendResult:
    """A backend that produced no measurement: unavailable (with its own reason) or not run (with `reason`)."""
    av, backend = availability.get(name, {"available": False, "reason": "not probed"}), backend_registry.get(name)
    if not av["available"]:
        return BackendResult(name, False, "unavailable", av["reason"], timing_label=backend.timing_label)
    return BackendResult(name, True, "not_run", reason, timing_label=backend.timing_label)


def measure(
    *,
    root: Path,
    workdir: Path,
    spec_path: Path,
    target_dir: Path,
    impls: dict[str, Path],
    check: list[str],
    backend_names: list[str],
    availability: dict[str, dict],
    target_backend: str,
    device: str,
    seed: int,
    settings: Settings,
    cache_root: Path,
    on_stage=None,
    timing: dict | None = None,
) -> Measurement:
    label = check[0]
    order = [target_backend] + [b for b in backend_names if b != target_backend]
    results: dict[str, BackendResult] = {}
    raw_all: dict[str, dict] = {}
    stop_reason = None
    for name in order:
        backend = backend_registry.get(name)
        if not availability.get(name, {}).get("available") or stop_reason:
            results[name] = not_run(name, availability, stop_reason or "")
            continue
        if on_stage:
            on_stage(f"measure {name}")
        job = {
            "spec": str(spec_path), "target_dir": str(target_dir), "device": device, "backend": name,
            "impls": [{"label": k, "path": str(v)} for k, v in impls.items()], "check": check,
            "seed": seed_for(seed, name), "bench": True, "timing": timing or {},
        }
        raw = run_worker(workdir, job, backend, settings, cache_root / name, name=f"worker-{name}")
        raw_all[name] = raw
        results[name] = to_backend_result(name, raw, label, workdir, root)
        if name == target_backend and results[name].status != "ok":
            stop_reason = f"target backend {name} failed ({results[name].status})"
    ordered = {name: results[name] for name in backend_names if name in results}
    return Measurement(ordered, raw_all)


def guard_failures(m: Measurement, target_backend: str) -> list[str]:
    return [f"{name}: {r.status} {r.reason}".strip() for name, r in m.results.items()
            if name != target_backend and r.available and r.status not in ("ok", "not_run")]


def require_available(target_backend: str, availability: dict[str, dict]) -> None:
    av = availability.get(target_backend)
    if av is None:
        raise UserError(f"backend {target_backend!r} does not apply to this target; valid: {', '.join(availability)}")
    if not av["available"]:
        raise UserError(f"target backend {target_backend} is unavailable: {av['reason']}")


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
    backend = backend_registry.get("cutile" if language == "cutile" else "ptx")
    pairs = [(arch, dtype) for arch in archs for dtype in (dtypes or [])]
    parallel = compile_parallelism(len(pairs)) if len(pairs) > 1 else 1
    if parallel <= 1:
        raws = [run_worker(workdir, base, backend, settings, cache_root / "aot", name=name)]
    else:
        procs: list = []

        def one(i: int, arch: str, dtype: str) -> dict:
            job = {**base, "archs": [arch], "dtypes": [dtype]}
            return run_worker(workdir, job, backend, settings, cache_root / "aot", name=f"{name}-{i}", procs=procs)

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
