"""The worker's jobs: `python -m loop.worker --job JOB.json --result RESULT.json`.

Runs in a fresh subprocess (own process group, hard timeout, own TRITON_CACHE_DIR; see
`loop.measure.launch`). A measurement job (`run_job`)

1. loads the spec and each implementation by path (an import failure is a `compile_error`),
2. checks correctness of the implementations named in `check` (`Harness.check_one`),
3. times all implementations interleaved at the benchmark shapes (`loop.worker.bench`),
4. re-checks the outputs that the last timed round wrote,
5. proves which backend compiled the kernels, and writes one JSON result atomically.

Failures of the kernel are data (typed `status`); failures of the spec or of this package are
`spec_error` / `harness_error`, which the orchestrator raises instead of recording.
`--probe` reports the environment (GPU, versions, backends), `--health` makes a tiny GPU round
trip. Jobs with `mode: compile` compile ahead of time (`compile_job`), `mode: profile` check one
shape and run it for a profiler (`profile_job`), `mode: decision-check` run the trials of
`tileloop decision-check` (`loop.worker.decision_job`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from loop.common.jobs import seed_for
from loop.worker.bench import bench_all
from loop.worker.correctness import Harness
from loop.worker.failures import SpecError, call_impl, classify, load_module
from loop.worker.launches import LaunchRecorder
from loop.worker.providers import References
from loop.worker.proof import (
    backend_proof,
    pin_autotune_to_first_config,
    watch_cutile_compiles,
)
from loop.worker.spec import Spec
from loop.worker.tamper import check_tamper, timer_identities


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


def run_job(job: dict) -> dict:
    import torch

    from loop.worker import timing

    device = job["device"]
    clock = timing._Clock(torch) if device == "cuda" else None
    tamper_watch = timer_identities(torch)
    spec = start_job(torch, job)
    harness = Harness(torch, spec, device, clock)
    modules: dict[str, Any] = {}
    for impl in job["impls"]:
        modules[impl["label"]] = call_impl(impl["label"], "import", load_module, f"tileloop_impl_{impl['label']}", Path(impl["path"]))
    for provider in job.get("torch_providers", []):  # for `tileloop compare`: the spec's op in PyTorch itself
        modules[provider] = torch_provider(torch, spec, provider)
    refs = References(spec, set(modules)) if job.get("references") else None  # the spec's named public kernels
    check_tamper(torch, tamper_watch, "import")

    dtypes = list(job.get("dtypes") or spec.dtypes)
    skipped = []
    if device == "cpu" and "bfloat16" in dtypes:
        dtypes.remove("bfloat16")
        skipped.append("bfloat16: the Triton interpreter does not support bf16")
    checks = []
    shapes_to_check = [tuple(s) for s in job.get("correctness_shapes") or spec.correctness_shapes]
    if job.get("check_benchmark_shapes"):  # `compare --full-check`: every dtype at the full benchmark shapes too
        shapes_to_check += [s for s in spec.benchmark_shapes if s not in shapes_to_check]
    launched: dict[str, list[str]] = {}
    called: dict[str, list[str]] = {}
    for label in job["check"]:
        with LaunchRecorder(modules[label], "cutile" if job["backend"] == "cutile" else "triton") as recorder:
            for dtype in dtypes:
                for shape in shapes_to_check:
                    rec = harness.check_one(modules[label], label, shape, dtype,
                                            seed_for(job["seed"], label, tuple(shape), dtype))
                    checks.append(rec)
                    if not rec["ok"]:
                        return {"status": "incorrect", "failed_impl": label, "message": rec["reason"],
                                "correctness": {"passed": False, "checks": checks, "skipped": skipped}}
        launched[label] = sorted(recorder.launched)  # the target's kernels the checks ran
        called[label] = sorted(recorder.called)  # and its host functions
    check_tamper(torch, tamper_watch, "correctness")
    result: dict[str, Any] = {"status": "ok", "correctness": {"passed": True, "checks": checks, "skipped": skipped,
                                                              "launched": launched, "called": called}}
    if refs:  # checked like the implementations; the correct ones are timed beside them
        result["references"] = refs.check(harness, job, dtypes, shapes_to_check, modules)
    if job.get("bench", True):
        result["timing"] = bench_all(torch, harness, modules, job, dtypes)
        check_tamper(torch, tamper_watch, "timing")
        if refs:
            refs.settle(result)
        bad = [s for s in result["timing"]["shapes"] for k, v in s["recheck"].items() if not v["ok"]]
        if bad:
            first = bad[0]
            label, rc = next((k, v) for k, v in first["recheck"].items() if not v["ok"])
            return {"status": "incorrect", "failed_impl": label,
                    "message": f"output written by the timed run is wrong at {first['shape']}: {rc.get('reason')}",
                    "correctness": result["correctness"], "timing": result["timing"]}
    result["proof"] = backend_proof(modules, job["backend"])
    return result


def torch_provider(torch, spec, name: str):
    """PyTorch eager (the spec's reference at the benchmark dtype) or torch.compile of it."""
    from types import SimpleNamespace

    fn = spec.module.reference
    if name == "torch_compile":
        fn = torch.compile(spec.module.reference, dynamic=False)
    elif name != "torch_eager":
        raise ValueError(f"unknown torch provider {name!r}")
    return SimpleNamespace(run=fn)
