"""`python -m loop.judge --job JOB.json --result RESULT.json`: one judged measurement, its result
written atomically (the kernel's failures typed as data; the spec's as `spec_error`; the judge's own
as `harness_error`, with its traceback)."""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

from loop.common.errors import SpecError
from loop.common.files import atomic_write_text
from loop.common.jobs import RESULT_SCHEMA
from loop.common.messages import JudgeJob
from loop.common.processes import watch_parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loop.judge",
                                 description="the tileloop judge: one measurement, judged outside the kernel's process")
    ap.add_argument("--job", type=Path, help="the job file")
    ap.add_argument("--job-fd", type=int, help="instead of --job: started ahead of its job, get ready, then read the job "
                    "file's path from this pipe (nothing read: the job was called off)")
    ap.add_argument("--kernels", type=int, default=0, help="with --job-fd: kernel processes to start before the job comes")
    ap.add_argument("--device", choices=("cuda", "cpu"), help="with --job-fd: the device to get ready for")
    ap.add_argument("--result", type=Path, required=True, help="where the result is kept for the logs")
    ap.add_argument("--result-fd", type=int, help="the pipe the orchestrator reads the result from (no kernel process holds it)")
    ap.add_argument("--hosted", action="store_true", help=argparse.SUPPRESS)  # forked by `loop.judge.host`
    args = ap.parse_args(argv)
    if (args.job is None) == (args.job_fd is None):
        ap.error("give one of --job and --job-fd")
    watch_parent()  # the judge never outlives the tileloop that started it (nor its kernel process the judge)
    from loop.judge.fork import guard_judge

    guard_judge()  # not dumpable and a subreaper before any kernel process starts
    started = time.time()
    from loop.judge.kernel_process import Pool
    from loop.judge.run import Phases, judge_job, warm

    workdir, name = args.result.parent, args.result.name.removesuffix(".result.json")
    phases, pool = Phases(started), None
    if args.job_fd is not None:  # everything that needs no job, done while the orchestrator commits and compiles
        pool = Pool(workdir, name, args.kernels, args.device)  # new interpreters: they import torch beside the judge
        phases.mark("kernels_started")
        warm(args.device)
        phases.mark("warm")
        with os.fdopen(args.job_fd, "rb") as pipe:
            path = pipe.read(4096).decode(errors="replace").strip()
        if not path:
            pool.close()
            return 0
        phases.mark("job")
        args.job = Path(path)
    job = None
    try:
        job = JudgeJob.from_json(json.loads(args.job.read_text()))
        payload = judge_job(job, workdir, name, pool, phases)
    except SpecError as exc:
        payload = {"status": "spec_error", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - tileloop's own failure: typed, with its traceback, never the candidate's
        payload = {"status": "harness_error", "message": f"{type(exc).__name__}: {exc}",
                   "detail": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]}
    payload.update(schema=RESULT_SCHEMA, backend=job.backend if job is not None else None,
                   wall_s=round(time.time() - started, 3),
                   judge_started="forked by the run's judge host" if args.hosted else "a new process")
    text = json.dumps(payload, indent=1, default=str)
    atomic_write_text(args.result, text)
    if args.result_fd is not None:
        with os.fdopen(args.result_fd, "wb") as pipe:
            pipe.write(text.encode())
    return 0
