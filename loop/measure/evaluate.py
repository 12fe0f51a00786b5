"""One measurement of one iteration: a worker per backend, turned into typed results.

The target backend runs first; if it crashes or is incorrect the guard backends are not run
(the candidate is rejected anyway) and say so. Raw samples stay in the worker's result file
under `sandbox/<run>/iter-NNN/`; records keep per-shape summaries. A judge's timing result is read
into its type here, once (`loop.common.messages.Timing`), and handed on as that value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure
from loop.common.jobs import seed_for
from loop.common.messages import ImplTiming, JobImpl, JudgeJob, Timing
from loop.common.settings import Settings
from loop.common.stats import geomean
from loop.measure.host import JudgeHost
from loop.measure.launch import JudgeAhead, run_worker
from loop.records.results import BackendResult

CPU_TIMING = {"min_reps": 5, "max_reps": 15, "budget_s": 0.5}  # the interpreter: few, short rounds
SUMMARY_KEYS = ("median_ms", "iqr_ms", "rel_std", "min_ms", "max_ms", "nrep", "peak_mem_mb", "gbps", "tflops", "frac_clone_bw",
                "frac_matmul", "tuned")  # tuned: the configs a run-time tuner picked for this shape in the timing process


@dataclass
class Measurement:
    results: dict[str, BackendResult]
    raw: dict[str, dict]  # backend -> worker result (with samples)
    timings: dict[str, Timing] = field(default_factory=dict)  # backend -> its judge's timing result, where it has one

    def target(self, name: str) -> BackendResult:
        return self.results[name]


def _summary(impl: ImplTiming) -> dict:
    stats = impl.to_json()
    return {k: stats.get(k) for k in SUMMARY_KEYS if k in stats}


def timing_of(raw: dict) -> Timing | None:
    """A judge's (or a harness's) timing result, typed; None where it timed nothing."""
    return Timing.from_json(raw["timing"]) if raw.get("timing") else None


def to_backend_result(name: str, raw: dict, label: str, workdir: Path, root: Path,
                      timing: Timing | None = None) -> BackendResult:
    """A backend's typed result from its judge's result (`timing`: its timing result, where already read),
    for the implementation `label` (the candidate, or the baseline): with what its checks launched and called."""
    backend = backend_registry.get(name)
    status = raw.get("status", "runtime_error")
    rel_dir = str(workdir.relative_to(root))
    if status in ("spec_error", "harness_error"):
        raise HarnessFailure(f"{name} worker: {status}: {raw.get('message')} (logs: {rel_dir})")
    # a timing the judge refused (uncorroborated) comes from outputs that were checked and right
    correctness = "PASS" if raw.get("correctness", {}).get("passed") and status in ("ok", "uncorroborated") else "FAIL"
    drawn = raw.get("drawn")  # the judge's drawn checks, kept so that a failure can be replayed
    ran = checks_ran(raw, label)
    if status != "ok":
        msg = raw.get("message", "")
        return BackendResult(name, True, status, msg[:500], correctness=correctness,
                             timing_label=backend.timing_label, worker_dir=rel_dir, drawn=drawn, **ran)
    shapes, cand, inc = [], [], []
    for s in (timing or Timing.from_json(raw["timing"])).shapes:
        impls = s.impls
        entry = {"shape": list(s.shape), "dtype": s.dtype, "method": s.method, "flops": s.flops, "bytes": s.bytes,
                 "calls_per_sample": s.calls_per_sample, "notes": list(s.notes or ()),
                 label: _summary(impls[label])}
        cand.append(impls[label].median_ms)
        if "incumbent" in impls and label != "incumbent":
            entry["incumbent"] = _summary(impls["incumbent"])
            inc.append(impls["incumbent"].median_ms)
        if s.clone:
            entry["clone_gbps"] = s.clone["gbps"]
        if s.matmul:
            entry["matmul"] = s.matmul
        if raw.get("isolation"):  # the boundary around the kernel processes that timed it (`loop.judge.fork`)
            entry["isolation"] = raw["isolation"]
        shapes.append(entry)
    proof = raw.get("proof")
    if proof and not proof.get("ok"):
        return BackendResult(name, True, "fallback", f"backend proof failed: {proof.get('detail')}", correctness=correctness,
                             timing_label=backend.timing_label, proof=proof, shapes=shapes, worker_dir=rel_dir, drawn=drawn,
                             **ran)
    return BackendResult(name, True, "ok", "", geomean(cand), geomean(inc) if inc else None, correctness,
                         backend.timing_label, proof, shapes, rel_dir, drawn, **ran)


def checks_ran(raw: dict, label: str) -> dict[str, list[str] | None]:
    """{launched, called}: the kernels of implementation `label` that its judge's correctness checks
    launched and the host functions they called; None for each where the judge's result does not say."""
    seen = raw.get("correctness") or {}
    return {key: (list(seen[key][label]) if label in (seen.get(key) or {}) else None) for key in ("launched", "called")}


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
    target: Path | None = None,
    ahead: JudgeAhead | None = None,
    host: JudgeHost | None = None,
) -> Measurement:
    label = check[0]
    order = [target_backend] + [b for b in backend_names if b != target_backend]
    results: dict[str, BackendResult] = {}
    raw_all: dict[str, dict] = {}
    timings: dict[str, Timing] = {}
    stop_reason = None
    for name in order:
        backend = backend_registry.get(name)
        if not availability.get(name, {}).get("available") or stop_reason:
            results[name] = not_run(name, availability, stop_reason or "")
            continue
        if on_stage:
            on_stage(f"measure {name}")
        job = JudgeJob(str(spec_path), str(target_dir), device, name, tuple(JobImpl(k, str(v)) for k, v in impls.items()),
                       tuple(check), seed_for(seed, name), str(target) if target else None, timing=timing or {})
        raw = run_worker(workdir, job.to_json(), backend, settings, cache_root / name, name=f"worker-{name}",
                         ahead=ahead if name == target_backend else None, host=host)
        raw_all[name] = raw
        if (timing := timing_of(raw)) is not None:
            timings[name] = timing
        results[name] = to_backend_result(name, raw, label, workdir, root, timing)
        if name == target_backend and results[name].status != "ok":
            stop_reason = f"target backend {name} failed ({results[name].status})"
    ordered = {name: results[name] for name in backend_names if name in results}
    return Measurement(ordered, raw_all, timings)


def guard_failures(results: dict[str, BackendResult], target_backend: str) -> list[str]:
    """Why the guard backends (every available backend but the target) failed, one line each."""
    return [f"{name}: {r.status} {r.reason}".strip() for name, r in results.items()
            if name != target_backend and r.available and r.status not in ("ok", "not_run")]
