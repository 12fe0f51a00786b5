"""The measurement worker: `python -m loop.worker --job JOB.json --result RESULT.json`.

Runs in a fresh subprocess (own process group, hard timeout, own TRITON_CACHE_DIR; see
`loop.sandbox`). It is the only place kernel code is imported. It

1. loads the spec and each implementation by path (an import failure is a `compile_error`),
2. checks correctness of the implementations named in `check` (see `check_one`),
3. times all implementations interleaved at the benchmark shapes (`loop.timing`),
4. re-checks the outputs that the last timed round wrote,
5. proves which backend compiled the kernels, and writes one JSON result atomically.

Failures of the kernel are data (typed `status`); failures of the spec or of this file are
`spec_error` / `harness_error`, which the orchestrator raises instead of recording.
`python -m loop.worker --probe --result P.json` reports the environment (GPU, versions, backends).
Jobs with `mode: compile` compile ahead of time (`compile_job`); `mode: profile` check one shape
and run it for a profiler (`profile_job`, for `tileloop profile`).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from loop.common.files import atomic_write_text
from loop.common.jobs import RESULT_SCHEMA, seed_for

STICKY_CUDA = ("illegal memory access", "misaligned address", "unspecified launch failure",
               "illegal instruction", "device-side assert", "an illegal", "cudaErrorLaunchFailure")
OOM_MARKERS = ("out of memory", "CUDA_ERROR_OUT_OF_MEMORY", "OutOfMemoryError", "can't allocate memory")
COMPILE_MARKERS = ("CompilationError", "CompileTimeAssertionFailure", "PTXASError", "ptxas",
                   "OutOfResources", "out of resource", "failed to compile", "TileCompilerError",
                   "tileiras", "MLIR", "Unsupported",
                   # cuTile front-end errors (cuda.tile._exception): raised while compiling, never at run time
                   "TypeCheckingError", "TileTypeError", "TileSyntaxError", "TileValueError", "TileStaticAssertionError",
                   "TileStaticEvalError", "TileUnsupportedFeatureError", "TileRecursionError", "TileCompilerExecutionError",
                   "TileCompilerTimeoutError")


class ImplFailure(Exception):
    """A failure of kernel code, typed for the record."""

    def __init__(self, status: str, label: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.label, self.message, self.detail = status, label, message, detail


class SpecError(Exception):
    """The spec is unusable as a test (e.g. a reference so small that zeros would pass)."""


def classify(exc: BaseException, stage: str) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if any(m in text for m in OOM_MARKERS):
        return "oom"
    if any(m.lower() in text.lower() for m in STICKY_CUDA):
        return "runtime_error"
    if stage == "import" or isinstance(exc, SyntaxError) or any(m in text for m in COMPILE_MARKERS):
        return "compile_error"
    return "runtime_error"


def _short_tb(exc: BaseException, limit: int = 4000) -> str:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return tb[-limit:]


def call_impl(label: str, stage: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, ImplFailure, SpecError):
        raise
    except BaseException as exc:  # kernel code may raise anything: that is data, typed here
        raise ImplFailure(classify(exc, stage), label, f"{type(exc).__name__}: {exc}"[:2000], _short_tb(exc)) from exc


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- correctness


def upcast(torch, value):
    """fp16/bf16 -> fp32, fp32 -> fp64; the reference is computed at fp32 or better."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64 if value.dtype in (torch.float32, torch.float64) else torch.float32)
    return value


def poison(torch, tensor):
    if tensor.is_floating_point():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def poison_allocator(torch, nbytes: int):
    """Fill freed CUDA caching-allocator blocks with NaN, so a kernel that allocates its output
    and leaves part unwritten reads NaN rather than a lucky earlier result."""
    if nbytes <= 0:
        return
    blocks = [torch.full((max(nbytes // 4, 1),), float("nan"), dtype=torch.float32, device="cuda") for _ in range(2)]
    del blocks


def compare(torch, out, ref, atol: float, rtol: float) -> dict:
    if not isinstance(out, torch.Tensor):
        return {"ok": False, "reason": f"run() returned {type(out).__name__}, not a tensor"}
    if tuple(out.shape) != tuple(ref.shape):
        return {"ok": False, "reason": f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"}
    o = out.detach().to(torch.float64)
    r = ref.detach().to(o.device, torch.float64)
    diff = (o - r).abs()
    bound = atol + rtol * r.abs()
    bad = ~(diff <= bound)  # NaN in the output counts as a mismatch
    nonfinite = int((~torch.isfinite(o)).sum())
    n_bad = int(bad.sum())
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("inf")
    big = r.abs() > atol
    rel = diff[big & finite] / r.abs()[big & finite]
    res = {
        "ok": n_bad == 0,
        "max_abs_err": max_abs,
        "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
        "mismatched": n_bad,
        "numel": int(o.numel()),
        "nonfinite": nonfinite,
    }
    if n_bad:
        res["reason"] = f"{n_bad}/{o.numel()} elements outside atol={atol} rtol={rtol}" + (
            f" ({nonfinite} NaN/inf: unwritten or poisoned output)" if nonfinite else "")
    return res


def zero_pass_fraction(torch, ref, atol: float, rtol: float) -> float:
    """Fraction of elements where an all-zero output would be accepted."""
    r = ref.detach().to(torch.float64).abs()
    return float((r <= atol + rtol * r).double().mean())


def check_inputs_unchanged(torch, inputs: dict, snapshot: dict) -> str | None:
    for name, before in snapshot.items():
        if not torch.equal(inputs[name], before):
            return f"input {name!r} was modified by the kernel"
    return None


class Harness:
    """Everything the worker does with the spec, for one device and backend."""

    MAX_ZERO_PASS = 0.10

    def __init__(self, torch, spec, device: str, clock=None):
        self.torch, self.spec, self.device, self.clock = torch, spec, device, clock
        self.outputs = tuple(getattr(spec, "OUTPUTS", ("out",)))
        self.accepts_device = "device" in inspect.signature(spec.make_inputs).parameters

    def dtype(self, name: str):
        return getattr(self.torch, name)

    def make_inputs(self, shape, dtype: str, seed: int) -> dict:
        kwargs = {"device": self.device} if self.accepts_device else {}
        inputs = self.spec.make_inputs(tuple(shape), self.dtype(dtype), seed, **kwargs)
        if not isinstance(inputs, dict):
            raise SpecError(f"make_inputs returned {type(inputs).__name__}, not a dict")
        for name, value in inputs.items():
            if isinstance(value, self.torch.Tensor) and name not in self.outputs and value.numel() and not bool(value.any()):
                raise SpecError(f"make_inputs gave an all-zero input {name!r}: inputs must be random")
        return inputs

    def reference(self, inputs: dict):
        ref_inputs = {k: upcast(self.torch, v.clone() if isinstance(v, self.torch.Tensor) else v) for k, v in inputs.items()}
        return self.spec.reference(**ref_inputs)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        try:
            atol, rtol = self.spec.TOLERANCES[dtype]
        except KeyError:
            raise SpecError(f"TOLERANCES has no entry for {dtype}") from None
        return float(atol), float(rtol)

    def output_of(self, result, inputs: dict):
        if result is None:
            for name in self.outputs:
                if name in inputs:
                    return inputs[name]
        return result

    def prepare_call(self, inputs: dict):
        for name in self.outputs:
            if isinstance(inputs.get(name), self.torch.Tensor):
                poison(self.torch, inputs[name])

    def check_one(self, module, label: str, shape, dtype: str, seed: int) -> dict:
        torch = self.torch
        inputs = self.make_inputs(shape, dtype, seed)
        snapshot = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in self.outputs}
        ref = self.reference(inputs)
        atol, rtol = self.tolerance(dtype)
        zp = zero_pass_fraction(torch, ref, atol, rtol)
        if zp > self.MAX_ZERO_PASS:
            raise SpecError(
                f"reference at shape {tuple(shape)} {dtype} is near zero relative to atol={atol}: an all-zero "
                f"output would pass on {zp:.0%} of elements; lower atol in TOLERANCES or scale the inputs")
        self.prepare_call(inputs)
        if self.device == "cuda":
            poison_allocator(torch, ref.numel() * ref.element_size())
        result = call_impl(label, "call", module.run, **inputs)
        if self.device == "cuda":
            call_impl(label, "call", torch.cuda.synchronize)
        rec = {"label": label, "shape": list(shape), "dtype": dtype, "seed": seed, "atol": atol, "rtol": rtol}
        rec.update(compare(torch, self.output_of(result, inputs), ref, atol, rtol))
        if rec["ok"] and (msg := check_inputs_unchanged(torch, inputs, snapshot)):
            rec.update(ok=False, reason=msg)
        return rec


# --------------------------------------------------------------------------- environment


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def probe() -> dict:
    """Environment fingerprint and backend facts; safe on a machine without a GPU."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": None, "triton_version": None, "cutile_version": _version("cuda-tile"),
        "cuda_available": False, "cuda_reason": None, "gpu": None, "capability": None,
        "driver": None, "cuda_runtime": None, "sm_count": None, "l2_mb": None,
        "clocks": None, "nvtriton": False,
        "tile_env": {k: os.environ[k] for k in ("ENABLE_TILE", "TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ") if k in os.environ},
    }
    try:
        import torch

        info["torch_version"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(cuda_available=True, gpu=props.name, capability=list(torch.cuda.get_device_capability(0)),
                        sm_count=props.multi_processor_count,
                        l2_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        else:
            info["cuda_reason"] = "no CUDA device visible to torch" if torch.version.cuda else "torch is a CPU-only build"
    except ImportError as exc:
        info["cuda_reason"] = f"torch not importable: {exc}"
    try:
        import triton

        info["triton_version"] = triton.__version__
        info["nvtriton"] = importlib.util.find_spec("triton.backends.tileir") is not None
    except ImportError:
        pass
    info.update(_tileiras_facts())
    info["ncu"] = shutil.which("ncu")
    if info["ncu"]:
        info["ncu_version"] = _first_line([info["ncu"], "--version"], last=True)
    if info["cuda_available"] and info["triton_version"]:
        try:  # which backend Triton's active driver compiles for (nvtriton with ENABLE_TILE=1 says tileir)
            from triton.runtime import driver

            target = driver.active.get_current_target()
            info["triton_active_target"] = str(getattr(target, "backend", target))
        except Exception as exc:  # report, do not fail the probe: doctor shows it
            info["triton_active_target"] = f"error: {type(exc).__name__}: {exc}"[:200]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                fields = [f.strip() for f in out[0].split(",")]
                info["driver"] = fields[0]
                info["clocks"] = {"max_sm_mhz": fields[1], "max_mem_mhz": fields[2], "sm_mhz_now": fields[3], "power_limit_w": fields[4]}
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def health() -> dict:
    """Allocate, compute, copy back, synchronize: a wedged or lost GPU fails or hangs here."""
    import torch

    t0 = time.perf_counter()
    if not torch.cuda.is_available():
        return {"status": "runtime_error", "message": "no CUDA device visible"}
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    total = float((x * 2).sum().item())
    torch.cuda.synchronize()
    expected = float((1 << 20) * ((1 << 20) - 1))
    if total != expected:
        return {"status": "runtime_error", "message": f"GPU arithmetic check gave {total}, expected {expected}"}
    free, total_mem = torch.cuda.mem_get_info()
    return {"status": "ok", "seconds": round(time.perf_counter() - t0, 3), "free_mb": free // 2**20, "total_mb": total_mem // 2**20}


def _first_line(cmd: list[str], last: bool = False) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out[-1] if last else out[0]) if out else None


def _tileiras_facts() -> dict:
    """Which tileiras cuda-tile would use, its version, and the architectures it accepts."""
    path = None
    try:
        from cuda.tile._compile import _find_compiler_bin  # private, hence guarded: falls back to PATH

        path = _find_compiler_bin().path
    except Exception:
        path = shutil.which("tileiras")
    facts: dict[str, Any] = {"tileiras": path, "tileiras_version": None, "tileiras_archs": []}
    if path:
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
            facts["tileiras_version"] = next((ln.strip() for ln in text.splitlines() if "release" in ln), text.strip()[-80:])
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            help_text = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30).stdout
            import re

            facts["tileiras_archs"] = sorted(set(re.findall(r"=(sm_\d+)\s", help_text)), key=lambda a: int(a[3:]))
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


# --------------------------------------------------------------------------- backend proof


def _pin_autotune_to_first_config() -> None:
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


def _watch_cutile_compiles() -> None:
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


def backend_proof(modules: dict[str, Any], backend: str) -> dict:
    """What actually compiled the kernels: the targets and IR kinds in Triton's JIT caches."""
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


# --------------------------------------------------------------------------- main job


def compile_job(job: dict) -> dict:
    import torch

    from loop.worker import aot

    sys.path.insert(0, job["target_dir"])
    spec = load_module("tileloop_spec", Path(job["spec"]))
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

    dtypes = list(spec.DTYPES)
    dtype = dtype or dtypes[0]
    if dtype not in dtypes:
        raise SpecError(f"dtype {dtype} is not one of the spec's DTYPES {dtypes}")
    shapes = [tuple(s) for s in spec.BENCHMARK_SHAPES]
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
    call_impl("candidate", "call", module.run, **inputs)
    sync()
    with contextlib.ExitStack() as profiled:
        if device == "cuda":  # cudaProfilerStart/Stop: what a profiler started with --profile-from-start off waits for
            torch.cuda.profiler.start()
            profiled.callback(torch.cuda.profiler.stop)
        for _ in range(int(job.get("launches", 1))):
            call_impl("candidate", "call", module.run, **inputs)
        sync()
    return {**base, "status": "ok", "launches": int(job.get("launches", 1)),
            "correctness": {"passed": True, "checks": [check]}, "proof": backend_proof({"candidate": module}, job["backend"])}


def start_job(torch, job: dict):
    """The start every GPU-side job shares: the device is there, the target's folder is importable,
    the backend's watchers are on (cuTile compiles, the interpreter's autotune pinned), and the
    spec is loaded (returned)."""
    if job["device"] == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("worker asked for cuda but no CUDA device is visible")
    sys.path.insert(0, job["target_dir"])
    if job["backend"] == "cutile":
        _watch_cutile_compiles()
    if job["backend"] == "interpreter":
        _pin_autotune_to_first_config()
    return load_module("tileloop_spec", Path(job["spec"]))


def run_job(job: dict) -> dict:
    import torch

    from loop.worker import timing

    device = job["device"]
    clock = timing._Clock(torch) if device == "cuda" else None
    tamper_watch = _timer_identities(torch)
    spec = start_job(torch, job)
    harness = Harness(torch, spec, device, clock)
    modules: dict[str, Any] = {}
    for impl in job["impls"]:
        modules[impl["label"]] = call_impl(impl["label"], "import", load_module, f"tileloop_impl_{impl['label']}", Path(impl["path"]))
    for provider in job.get("torch_providers", []):  # for `tileloop compare`: the spec's op in PyTorch itself
        modules[provider] = torch_provider(torch, spec, provider)
    _check_tamper(torch, tamper_watch, "import")

    dtypes = list(job.get("dtypes") or spec.DTYPES)
    skipped = []
    if device == "cpu" and "bfloat16" in dtypes:
        dtypes.remove("bfloat16")
        skipped.append("bfloat16: the Triton interpreter does not support bf16")
    checks = []
    shapes_to_check = list(job.get("correctness_shapes") or spec.CORRECTNESS_SHAPES)
    if job.get("check_benchmark_shapes"):  # `compare --full-check`: every dtype at the full benchmark shapes too
        shapes_to_check += [s for s in spec.BENCHMARK_SHAPES if s not in shapes_to_check]
    for label in job["check"]:
        for dtype in dtypes:
            for shape in shapes_to_check:
                rec = harness.check_one(modules[label], label, shape, dtype, seed_for(job["seed"], label, tuple(shape), dtype))
                checks.append(rec)
                if not rec["ok"]:
                    return {"status": "incorrect", "failed_impl": label, "message": rec["reason"],
                            "correctness": {"passed": False, "checks": checks, "skipped": skipped}}
    _check_tamper(torch, tamper_watch, "correctness")
    result: dict[str, Any] = {"status": "ok", "correctness": {"passed": True, "checks": checks, "skipped": skipped}}
    if job.get("bench", True):
        result["timing"] = bench_all(torch, harness, modules, job, dtypes)
        _check_tamper(torch, tamper_watch, "timing")
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

    fn = spec.reference
    if name == "torch_compile":
        fn = torch.compile(spec.reference, dynamic=False)
    elif name != "torch_eager":
        raise ValueError(f"unknown torch provider {name!r}")
    return SimpleNamespace(run=fn)


def _timer_identities(torch) -> dict:
    watched = {"time.perf_counter": (time, "perf_counter")}
    if hasattr(torch, "cuda"):
        watched.update({"torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event")})
        ev = torch.cuda.Event
        watched.update({"Event.record": (ev, "record"), "Event.elapsed_time": (ev, "elapsed_time"),
                        "CUDAGraph.replay": (torch.cuda.CUDAGraph, "replay")})
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in watched.items()}


def _check_tamper(torch, watch: dict, stage: str):
    changed = [name for name, (owner, attr, orig) in watch.items() if getattr(owner, attr) is not orig]
    if changed:
        raise ImplFailure("incorrect", "candidate", f"timer tampering detected after {stage}: {', '.join(changed)} replaced")


def tuned_configs(module) -> dict[str, str]:
    """The configs a kernel tuned at run time has picked so far, by input key: the cutile-autotune
    convention (module-level `_TUNED`: key -> (config, kernel)) and Triton autotuners (`cache`:
    key -> Config). A pick made in the timing process is what was timed; another process may pick
    differently, and this makes it visible. Never raises: a record, not a check."""
    picks: dict[str, str] = {}
    try:
        tuned = getattr(module, "_TUNED", None)
        if isinstance(tuned, dict):
            for key, value in list(tuned.items()):
                picks[repr(key)[:300]] = repr(value[0] if isinstance(value, tuple) and value else value)[:300]
        for name, obj in list(vars(module).items()):
            cache = getattr(obj, "cache", None)
            if isinstance(cache, dict) and isinstance(getattr(obj, "configs", None), list):
                for key, cfg in list(cache.items()):
                    picks[f"{name}{repr(key)}"[:300]] = str(cfg)[:300]
    except Exception:  # noqa: BLE001 - an odd module attribute must not fail a measurement
        pass
    return picks


def bench_all(torch, harness: Harness, modules: dict, job: dict, dtypes: list[str]) -> dict:
    from loop.worker import timing

    spec = harness.spec
    device = job["device"]
    dtype = job.get("bench_dtype") or dtypes[0]
    if device == "cpu":
        shapes = job.get("bench_shapes") or getattr(spec, "INTERPRETER_SHAPES", None) or spec.CORRECTNESS_SHAPES[-1:]
    else:
        shapes = job.get("bench_shapes") or spec.BENCHMARK_SHAPES
    plan = timing.TimingPlan(**job.get("timing", {}))
    out = []
    for shape in shapes:
        out.append(bench_shape(torch, harness, modules, job, tuple(shape), dtype, plan))
    return {"dtype": dtype, "device": device, "shapes": out}


def bench_shape(torch, harness: Harness, modules: dict, job: dict, shape: tuple, dtype: str, plan) -> dict:
    from loop.worker import timing
    from loop.common.stats import summarize

    spec, device = harness.spec, job["device"]
    base_seed = seed_for(job["seed"], "bench", shape, dtype)
    first = harness.make_inputs(shape, dtype, base_seed)
    in_bytes = sum(v.numel() * v.element_size() for v in first.values() if isinstance(v, torch.Tensor))
    nsets = 1
    notes = []
    if device == "cuda":
        l2 = timing.l2_bytes(torch)
        nsets = int(min(timing.MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2 // max(in_bytes, 1)))))
        nsets = max(1, min(nsets, int(2**30 // max(in_bytes, 1))))
        notes.append(f"{nsets} rotating input set(s) of {in_bytes / 2**20:.2f} MiB ({nsets * in_bytes / l2:.1f}x L2)")
    sets = [first] + [harness.make_inputs(shape, dtype, base_seed + j) for j in range(1, nsets)]
    refs: list = [None, None]
    labels = list(modules)
    # every implementation reads the same input sets (the same memory): separate copies showed a
    # systematic ~1-3% difference between identical kernels on an H200 (placement, not code)
    last_results: dict[str, list] = {lab: [None] * nsets for lab in labels}

    def guard(label):
        run, store = modules[label].run, last_results[label]

        def fn(j):
            store[j] = call_impl(label, "call", run, **sets[j])
        return fn

    guarded = {lab: guard(lab) for lab in labels}
    tuned_before = {lab: tuned_configs(modules[lab]) for lab in labels}  # picks made for this shape come after
    peak = {}
    if device == "cuda":
        for lab in labels:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            guarded[lab](0)
            torch.cuda.synchronize()
            peak[lab] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 3)
        res = call_impl(labels[-1], "call", timing.time_gpu, torch, harness.clock, guarded, nsets, plan)
    else:
        res = timing.time_cpu({lab: (lambda lab=lab: guarded[lab](0)) for lab in labels}, plan)
    atol, rtol = harness.tolerance(dtype)
    recheck = {}
    checked = [0, 1] if nsets > 1 else [0]
    for lab in labels:  # what the timed work itself writes: fresh data in the same buffers, poison, run, check
        for j in checked:  # new values in place: a kernel that caches results (by shape or pointer) fails here
            fresh = harness.make_inputs(shape, dtype, seed_for(base_seed, "recheck", lab, j))
            for k, v in fresh.items():
                if isinstance(v, torch.Tensor) and k not in harness.outputs:
                    sets[j][k].copy_(v)
            refs[j] = harness.reference(sets[j])
        for j, s in enumerate(sets):
            harness.prepare_call(s)
            if isinstance(last_results[lab][j], torch.Tensor):  # a graph's own output buffer
                poison(torch, last_results[lab][j])
        call_impl(lab, "call", res.replay[lab])
        if device == "cuda":
            call_impl(lab, "call", torch.cuda.synchronize)
        used = range(nsets) if device == "cuda" else range(1)
        outs = {j: harness.output_of(last_results[lab][j], sets[j]) for j in used}
        rc = compare(torch, outs[0], refs[0], atol, rtol)
        if rc["ok"] and 1 in outs:
            rc = compare(torch, outs[1], refs[1], atol, rtol)
        for j in used:
            o = outs[j]
            if rc["ok"] and isinstance(o, torch.Tensor) and o.is_floating_point() and not bool(torch.isfinite(o).all()):
                rc = {"ok": False, "reason": f"input set {j}: output has NaN/inf after the timed run (unwritten)"}
        recheck[lab] = rc
    flops = float(spec.flops(shape))
    nbytes = float(_bytes_moved(spec, shape, dtype))
    impls = {}
    for lab in labels:
        st = summarize(res.samples_ms[lab])
        secs = st.median_ms / 1e3
        impls[lab] = {**st.to_json(), "samples_ms": res.samples_ms[lab], "peak_mem_mb": peak.get(lab),
                      "gbps": nbytes / secs / 1e9 if secs > 0 else None,
                      "tflops": flops / secs / 1e12 if secs > 0 else None}
        picked = {k: v for k, v in tuned_configs(modules[lab]).items() if k not in tuned_before[lab]}
        if picked:
            impls[lab]["tuned"] = picked
    entry = {"shape": list(shape), "dtype": dtype, "method": res.method, "calls_per_sample": res.calls_per_sample,
             "notes": notes + res.notes, "impls": impls, "recheck": recheck, "flops": flops, "bytes": nbytes}
    if device == "cuda" and job.get("clone_bandwidth", True):  # off where only the comparison counts (decision-check)
        entry["clone"] = clone_bandwidth(torch, harness.clock, nbytes, plan)
        for lab in labels:
            if entry["clone"] and impls[lab]["gbps"]:
                impls[lab]["frac_clone_bw"] = impls[lab]["gbps"] / entry["clone"]["gbps"]
    return entry


def _bytes_moved(spec, shape, dtype: str) -> float:
    params = inspect.signature(spec.bytes_moved).parameters
    return spec.bytes_moved(shape, dtype) if len(params) >= 2 else spec.bytes_moved(shape)


def clone_bandwidth(torch, clock, nbytes: float, plan) -> dict | None:
    """Same-run copy bandwidth for the same traffic (read + write = nbytes), the memory roofline."""
    from loop.worker import timing
    from loop.common.stats import summarize

    n = int(nbytes // 2)
    if n < 1024:
        return None
    l2 = timing.l2_bytes(torch)
    nsets = int(min(timing.MAX_CALLS_PER_GRAPH, max(1, -(-3 * l2 // n))))
    srcs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    dsts = [torch.empty_like(s) for s in srcs]
    res = timing.time_gpu(torch, clock, {"clone": lambda j: dsts[j].copy_(srcs[j])}, nsets, plan)
    st = summarize(res.samples_ms["clone"])
    return {"median_ms": st.median_ms, "gbps": 2 * n / (st.median_ms / 1e3) / 1e9, "method": res.method}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loop.worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", type=Path)
    ap.add_argument("--result", type=Path, required=True)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--health", action="store_true", help="a tiny GPU round trip: is the device usable?")
    args = ap.parse_args(argv)
    started = time.time()
    if args.health:
        atomic_write_text(args.result, json.dumps({"schema": RESULT_SCHEMA, **health()}))
        return 0
    if args.probe:
        payload = {"schema": RESULT_SCHEMA, "status": "ok", "probe": probe()}
        atomic_write_text(args.result, json.dumps(payload, indent=1))
        return 0
    job = json.loads(args.job.read_text())
    mode = job.get("mode")
    return write_job_result(args.result, job, started,
                            compile_job if mode == "compile" else profile_job if mode == "profile" else run_job)


def write_job_result(result: Path, job: dict, started: float, work, typed: tuple[tuple[type, str], ...] = ()) -> int:
    """Run `work(job)` and write its payload to `result`, or its failure as a typed status: an
    ImplFailure is the implementation's, `typed` maps a worker's own exception classes to statuses
    (checked next), a SpecError is the spec's, anything else is tileloop's (`harness_error`). The
    payload always carries the schema, the backend and the wall time."""
    try:
        payload = work(job)
    except ImplFailure as exc:
        payload = {"status": exc.status, "failed_impl": exc.label, "message": exc.message, "detail": exc.detail}
    except BaseException as exc:
        status = next((st for cls, st in typed if isinstance(exc, cls)), None)
        if status is None and isinstance(exc, SpecError):
            status = "spec_error"
        payload = ({"status": status, "message": str(exc)} if status else
                   {"status": "harness_error", "message": f"{type(exc).__name__}: {exc}", "detail": _short_tb(exc)})
    payload.update(schema=RESULT_SCHEMA, backend=job.get("backend"), wall_s=round(time.time() - started, 3))
    atomic_write_text(result, json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
