"""The spec's named reference kernels (`REFERENCES`), judged like the implementations but never
failing the measurement: each in a kernel process of its own, imported there (or reported
`unavailable` with the reason), checked at every dtype and correctness shape (a wrong one is
`incorrect`, one that raises is its failure kind), timed beside the implementations when correct,
and `incorrect` after all, without a time, if what its timed run wrote is wrong."""

from __future__ import annotations

from pathlib import Path

from loop.common.errors import SpecError
from loop.common.harness import Harness
from loop.common.jobs import seed_for
from loop.common.messages import JudgeJob
from loop.judge.checks import remote_call
from loop.judge.kernel_process import KernelFailure, KernelProcess


def start(spec, job: JudgeJob, workdir: Path, name: str, taken: set[str]) -> dict[str, KernelProcess]:
    """One kernel process per reference, its module imported there; the report of each."""
    clash = sorted(set(spec.references) & taken)
    if clash:
        raise SpecError(f"REFERENCES: {clash[0]!r} is already the name of an implementation here; rename it")
    return {ref: KernelProcess(workdir, f"{name}-{ref}", warm=job.device) for ref in spec.references}


def load(kernels: dict[str, KernelProcess], job: JudgeJob) -> dict[str, dict]:
    report = {}
    for ref, kernel in kernels.items():
        try:
            answer = kernel.request({"op": "load", "spec": job.spec, "target_dir": job.target_dir,
                                     "device": job.device, "backend": job.backend, "impls": [],
                                     "torch_providers": [], "reference": ref}, ref)
        except KernelFailure as failure:
            report[ref] = {"source": ref, "status": "unavailable", "reason": failure.message[:500]}
            continue
        why = str(answer.get("unavailable") or "")
        report[ref] = {"source": str(answer.get("source", ref)), "status": "unavailable" if why else "ok", "reason": why}
    return report


def check(harness: Harness, bridge, kernels: dict[str, KernelProcess], job: JudgeJob, dtypes: list[str], shapes,
          report: dict[str, dict]) -> None:
    """Every available reference at every dtype and shape; a failure is its report, not the job's."""
    for ref, entry in report.items():
        if entry["status"] != "ok":
            continue
        bridge.label = ref
        call = remote_call(bridge, kernels[ref], ref)
        checks = 0
        try:
            for dtype in dtypes:
                for shape in shapes:
                    rec = harness.check_with(call, ref, shape, dtype, seed_for(job.seed, ref, tuple(shape), dtype))
                    checks += 1
                    if not rec["ok"]:
                        raise KernelFailure("incorrect", ref, f"{tuple(shape)} {dtype}: {rec['reason']}")
        except KernelFailure as failure:
            entry.update(status=failure.status, reason=failure.message[:500])
        entry["checks"] = checks


def settle(result: dict, report: dict[str, dict]) -> None:
    """After timing: a reference whose timed run wrote a wrong output is `incorrect` and loses its
    times (its recheck leaves the result's own, which judges the implementations only)."""
    shapes = result.get("timing", {}).get("shapes", [])
    for s in shapes:
        for ref in [n for n in s.get("recheck", {}) if n in report]:
            rc = s["recheck"].pop(ref)
            if not rc["ok"] and report[ref]["status"] == "ok":
                report[ref].update(status="incorrect",
                                   reason=f"output written by the timed run is wrong at {s['shape']}: {rc.get('reason')}"[:500])
    wrong = [n for n, r in report.items() if r["status"] != "ok"]
    for s in shapes:
        for ref in wrong:
            s["impls"].pop(ref, None)
    result["references"] = report
