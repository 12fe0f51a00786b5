"""The worker's entry point: `python -m loop.worker --job JOB.json --result RESULT.json`, or
`--probe` / `--health`. It runs the job its `mode` names and writes one result file atomically:
the job's payload, or its failure typed (the kernel's, the spec's, or tileloop's own). With
`--serve R,W` it is the kernel process of a judged measurement (`loop.worker.serve`), answering
the judge over those two pipes."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from loop.common.files import atomic_write_text
from loop.common.jobs import RESULT_SCHEMA
from loop.common.processes import watch_parent
from loop.worker.check_job import check_job
from loop.worker.environment import health, interpreter_check, probe
from loop.worker.failures import KernelFailure, SpecError, short_traceback
from loop.worker.jobs import compile_job, profile_job

# job mode -> (work, its own exception classes typed as statuses)
JOBS = {
    "compile": (compile_job, ()),
    "profile": (profile_job, ()),
    "interpreter-check": (interpreter_check, ()),
    "check": (check_job, ()),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loop.worker", description="the tileloop worker: runs one job on kernel code")
    ap.add_argument("--job", type=Path)
    ap.add_argument("--result", type=Path)
    ap.add_argument("--serve", metavar="R,W", help="the kernel process of a judged measurement: read requests from fd R, answer on W")
    ap.add_argument("--warm", choices=("cuda", "cpu"), help="with --serve: get ready for this device before the first request")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--health", action="store_true", help="a tiny GPU round trip: is the device usable?")
    args = ap.parse_args(argv)
    watch_parent()  # a worker never outlives the tileloop that started it
    if args.serve:
        from loop.worker.serve import serve

        return serve(args.serve, args.warm)
    if args.result is None:
        ap.error("--result is required")
    started = time.time()
    if args.health:
        atomic_write_text(args.result, json.dumps({"schema": RESULT_SCHEMA, **health()}))
        return 0
    if args.probe:
        payload = {"schema": RESULT_SCHEMA, "status": "ok", "probe": probe()}
        atomic_write_text(args.result, json.dumps(payload, indent=1))
        return 0
    job = json.loads(args.job.read_text())
    work, typed = JOBS[job.get("mode")]
    return write_job_result(args.result, job, started, work, typed)


def write_job_result(result: Path, job: dict, started: float, work, typed: tuple[tuple[type, str], ...] = ()) -> int:
    """Run `work(job)` and write its payload to `result`, or its failure as a typed status: an
    KernelFailure is the implementation's, `typed` maps a worker's own exception classes to statuses
    (checked next), a SpecError is the spec's, anything else is tileloop's (`harness_error`). The
    payload always carries the schema, the backend and the wall time."""
    try:
        payload = work(job)
    except KernelFailure as exc:
        payload = exc.result()
    except BaseException as exc:
        status = next((st for cls, st in typed if isinstance(exc, cls)), None)
        if status is None and isinstance(exc, SpecError):
            status = "spec_error"
        payload = ({"status": status, "message": str(exc)} if status else
                   {"status": "harness_error", "message": f"{type(exc).__name__}: {exc}", "detail": short_traceback(exc)})
    payload.update(schema=RESULT_SCHEMA, backend=job.get("backend"), wall_s=round(time.time() - started, 3))
    atomic_write_text(result, json.dumps(payload, indent=1, default=str))
    return 0
