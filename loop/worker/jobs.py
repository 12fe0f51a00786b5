"""The worker's jobs that judge no candidate: `python -m loop.worker --job JOB.json --result R.json`.

Runs in a fresh subprocess (own process group, hard timeout, own TRITON_CACHE_DIR; see
`loop.measure.launch`). Jobs with `mode: compile` compile ahead of time (`compile_job`, the compile
gate: a candidate that fakes success here is still measured by the judge), `mode: profile` check
one shape and run it for a profiler (`profile_job`), `mode: decision-check` run the trials of
`tileloop decision-check` (`loop.worker.decision_job`), `mode: check` check the user's own target
and spec (`loop.worker.check_job`). A measurement (an iteration, `report --measure`, `compare`) is
never a worker job: the judge (`loop.judge`) runs it, with this package's `serve` as its kernel
process. `--probe` reports the environment (GPU, versions, backends), `--health` makes a tiny GPU
round trip.

Failures of the kernel are data (typed `status`); failures of the spec or of this package are
`spec_error` / `harness_error`, which the orchestrator raises instead of recording."""

from __future__ import annotations

import sys
from pathlib import Path

from loop.common.jobs import seed_for
from loop.worker.correctness import Harness
from loop.worker.failures import SpecError, call_impl, classify, load_module
from loop.worker.proof import (
    backend_proof,
    pin_autotune_to_first_config,
    watch_cutile_compiles,
)
from loop.common.spec import Spec


def compile_job(job: dict) -> dict:
    import torch

    from loop.worker import aot

    sys.path.insert(0, job["target_dir"])
    spec = Spec(torch, load_module("tileloop_spec", Path(job["spec"])))
    out = aot.compile_all(torch, spec, Path(job["target"]), job["language"], job["archs"], load_module, classify,
                          dtypes=job.get("dtypes"))
    failed = [r for r in out["results"] if not r["ok"]]
    if failed:
        first = failed[0]
        return {"status": first.get("status", "compile_error"), "failed_impl": "candidate",
                "message": f"{first['arch']} {first['dtype']}: {first.get('error')}", "compile": out}
    return {"status": "ok", "compile": out}


def profile_point(spec, shape, dtype) -> tuple[tuple, str]:
    """The shape and dtype to profile: as asked, or the spec's largest benchmark shape (by element
    count) and its first dtype."""
    import math

    dtypes = list(spec.dtypes)
    dtype = dtype or dtypes[0]
    if dtype not in dtypes:
        raise SpecError(f"dtype {dtype} is not one of the spec's DTYPES {dtypes}")
    shapes = list(spec.benchmark_shapes)
    if shape is None:
        return max(shapes, key=math.prod), dtype
    ranks = sorted({len(s) for s in shapes})
    if len(shape) not in ranks:
        raise SpecError(f"shape {tuple(shape)} has {len(shape)} dimension(s); the spec's shapes have {ranks}, "
                        f"e.g. {shapes[0]}")
    return tuple(shape), dtype


def profile_job(job: dict) -> dict:
    """One shape and dtype for a profiler started with --profile-from-start off: a correctness
    check (which also compiles and autotunes), one warm call on the profiled buffers, then
    `launches` calls inside a cudaProfilerStart/Stop range, the only launches a profiler sees."""
    import contextlib

    import torch

    device = job["device"]
    spec = start_job(torch, job)
    harness = Harness(torch, spec, device)
    module = call_impl("candidate", "import", load_module, "tileloop_impl_candidate", Path(job["target"]))
    shape, dtype = profile_point(spec, job.get("shape"), job.get("dtype"))
    base = {"shape": list(shape), "dtype": dtype}
    check = harness.check_one(module, "candidate", shape, dtype, seed_for(job["seed"], "profile", shape, dtype))
    if not check["ok"]:
        return {**base, "status": "incorrect", "failed_impl": "candidate", "message": check["reason"],
                "correctness": {"passed": False, "checks": [check]}}
    inputs = harness.make_inputs(shape, dtype, seed_for(job["seed"], "profile-run", shape, dtype))
    sync = (lambda: call_impl("candidate", "call", torch.cuda.synchronize)) if device == "cuda" else (lambda: None)
    entry = spec.entry(module)
    call_impl("candidate", "call", entry, **inputs)
    sync()
    with contextlib.ExitStack() as profiled:
        if device == "cuda":  # cudaProfilerStart/Stop: what a profiler started with --profile-from-start off waits for
            torch.cuda.profiler.start()
            profiled.callback(torch.cuda.profiler.stop)
        for _ in range(int(job.get("launches", 1))):
            call_impl("candidate", "call", entry, **inputs)
        sync()
    return {**base, "status": "ok", "launches": int(job.get("launches", 1)),
            "correctness": {"passed": True, "checks": [check]}, "proof": backend_proof({"candidate": module}, job["backend"])}


def start_job(torch, job: dict) -> Spec:
    """The start every GPU-side job shares: the device is there, the target's folder is importable,
    the backend's watchers are on (cuTile compiles, the interpreter's autotune pinned), and the
    spec is loaded and read (returned)."""
    if job["device"] == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("worker asked for cuda but no CUDA device is visible")
    sys.path.insert(0, job["target_dir"])
    if job["backend"] == "cutile":
        watch_cutile_compiles()
    if job["backend"] == "interpreter":
        pin_autotune_to_first_config()
    return Spec(torch, load_module("tileloop_spec", Path(job["spec"])))
