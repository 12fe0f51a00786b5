"""One judged measurement, as the orchestrator asked for it in a job file (`loop.measure.evaluate`):

1. one kernel process per implementation is started first (they import torch and the
   implementations while the judge reads the spec), the spec loaded here, and refused if it imports
   the target;
2. each implementation named in `check` is checked at every correctness shape and dtype
   (`loop.judge.checks`), the kernels it launched recorded; then every implementation of the job on
   shapes and input magnitudes the judge draws (`loop.judge.drawn`, unless the job says `drawn: false`);
3. every implementation is timed at the benchmark shapes, the timings corroborated and the timed
   work's outputs checked again (`loop.judge.bench`);
4. the checked implementation's process says which backend compiled its kernels.

The result has the schema of a worker's result (`tileloop.worker/1`), with `corroboration` per
timed shape; a refused timing is status `uncorroborated`, charged to the implementation whose timing
it was (an incumbent's failure is the incumbent's: `failed_impl` "incumbent"), and `isolation` (what
of the boundary around the kernel processes was in force: `loop.judge.fork`)."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

from loop.common import timing
from loop.common.errors import SpecError
from loop.common.harness import Harness
from loop.common.messages import JudgeJob, Timing
from loop.common.spec import Spec
from loop.judge import fork, references
from loop.judge.bench import Bench
from loop.judge.bridge import Bridge
from loop.judge.checks import check_all
from loop.judge.drawn import judge_draws
from loop.judge.kernel_process import KernelFailure, KernelProcess, KernelSideError, Pool, ask_all


def judge_job(job: JudgeJob, workdir: Path, name: str, pool: Pool | None = None, phases: Phases | None = None) -> dict:
    spec_source = Path(job.spec).read_bytes()  # read before any kernel code runs: what the judge executes
    impls = {i.label: {"impls": [i.to_json()], "torch_providers": []} for i in job.impls}
    impls.update({p: {"impls": [], "torch_providers": [p]} for p in job.torch_providers})
    # one kernel process per implementation, all started first (they import torch and compile while
    # the judge reads the spec): a candidate's code never shares a process with what it is timed against
    phases = phases or Phases()
    pool = pool or Pool(workdir, name, 0, None)
    kernels = {label: pool.take(label, job.device) for label in impls}
    pool.close()
    isolation: dict = {}  # read once the kernel processes' pids are known (a zygote's: once it is ready)
    everyone = dict(kernels)  # to end, whatever leaves `kernels` on the way
    bridge, report = None, None
    try:
        torch = warm(job.device)
        phases.mark("judge_cuda")
        spec = load_spec(torch, job, spec_source)
        phases.mark("judge_ready")
        isolation = fork.isolation([k.proc.pid for k in kernels.values()])
        loaded = ask_all(kernels, {label: {"op": "load", "spec": job.spec, "target_dir": job.target_dir,
                                           "device": job.device, "backend": job.backend, **what}
                                   for label, what in impls.items()})
        for label, answer in loaded.items():
            phases.kernel(label, answer.get("marks"))
        if job.references:  # the spec's named public kernels, each in a process of its own
            refs = references.start(spec, job, workdir, name, set(kernels))
            everyone.update(refs)
            report = references.load(refs, job)
            kernels.update({ref: k for ref, k in refs.items() if report[ref]["status"] == "ok"})
        phases.mark("kernels_loaded")
        bridge = Bridge(torch, kernels, job.device)
        return {**measure(torch, spec, bridge, kernels, job, phases, report), "phases_s": phases.spans,
                "isolation": isolation}
    except KernelFailure as failure:
        return {**failure.result(), "isolation": isolation}
    except KernelSideError as error:
        if error.status == "spec_error":
            raise SpecError(error.message) from None
        raise RuntimeError(f"in the kernel process: {error.message}\n{error.detail}") from None
    finally:
        for kernel in everyone.values():  # first the processes that map the shared memory, then the memory
            kernel.close()
        if bridge is not None:
            bridge.close()


def warm(device: str | None):
    """torch, and the judge's CUDA context made (once) when the measurement is on the GPU."""
    import torch

    if device == "cpu":
        torch.set_num_threads(1)  # its few small references need no thread pool spinning beside the kernel processes
    if device == "cuda" and torch.cuda.is_available():
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    return torch


def load_spec(torch, job: JudgeJob, source: bytes) -> Spec:
    """The spec, executed by the judge from the bytes it read before any kernel process started (a
    kernel process cannot rewrite the file in between); a spec that imports the target (or a copy of
    an implementation) would put candidate code in the judge's process, and is refused."""
    sys.path.insert(0, job.target_dir)
    module = types.ModuleType("tileloop_judge_spec")
    module.__file__ = job.spec
    sys.modules[module.__name__] = module
    exec(compile(source, job.spec, "exec"), module.__dict__)  # noqa: S102 - the user's spec, as load_module would
    spec = Spec(torch, module)
    forbidden = {Path(i.path).resolve() for i in job.impls}
    if job.target:
        forbidden.add(Path(job.target).resolve())
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve() in forbidden:
            raise SpecError(f"the spec imports the target ({Path(path).name}): the reference must not run kernel code; "
                            "use the target only through ENTRY or an entry(target, **inputs) adapter")
    return spec


class Phases:
    """Seconds from the judge's start to the end of each phase (where a measurement's time goes),
    the kernel processes' own steps (torch imported, CUDA context, ready, implementations loaded) on
    the same timeline."""

    def __init__(self, started: float | None = None):
        self.started = started or time.time()
        self.spans: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.spans[name] = round(time.time() - self.started, 3)

    def kernel(self, label: str, marks) -> None:
        if isinstance(marks, dict):  # the kernel process's word, kept for the logs: it decides nothing
            for step, at in marks.items():
                if isinstance(at, (int, float)) and not isinstance(at, bool):
                    self.spans[f"{label}.{step}"] = round(float(at) - self.started, 3)


def measure(torch, spec: Spec, bridge: Bridge, kernels: dict[str, KernelProcess], job: JudgeJob, phases: Phases,
            report: dict | None) -> dict:
    device = job.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the judge was asked for cuda but no CUDA device is visible")
    harness = Harness(torch, spec, device, timing._Clock(torch) if device == "cuda" else None)
    dtypes, skipped = list(job.dtypes or spec.dtypes), []
    if device == "cpu" and "bfloat16" in dtypes:
        dtypes.remove("bfloat16")
        skipped.append("bfloat16: the Triton interpreter does not support bf16")
    shapes = [tuple(s) for s in job.correctness_shapes or spec.correctness_shapes]
    if job.check_benchmark_shapes:  # `compare --full-check`: every dtype at the full benchmark shapes too
        shapes += [s for s in spec.benchmark_shapes if s not in shapes]
    checks, launched, called, failed = check_all(harness, bridge, kernels, job, dtypes, shapes)
    phases.mark("checked")
    correctness = {"passed": failed is None, "checks": checks, "skipped": skipped, "launched": launched, "called": called}
    if failed is not None:
        return {"status": "incorrect", "failed_impl": failed["label"], "message": failed["reason"], "correctness": correctness}
    result: dict = {"status": "ok", "correctness": correctness}
    if job.drawn:  # shapes and magnitudes the judge draws: every implementation on the same draws
        result["drawn"], failed = judge_draws(harness, bridge, kernels, job, dtypes, shapes)
        phases.mark("drawn")
        if failed is not None:
            correctness["passed"] = False
            return {**result, "status": "incorrect", "failed_impl": failed["label"], "message": failed["reason"]}
    if report is not None:  # checked like the implementations; only the correct ones are timed beside them
        references.check(harness, bridge, kernels, job, dtypes, shapes, report)
        for ref in [r for r, entry in report.items() if entry["status"] != "ok" and r in kernels]:
            kernels.pop(ref).close()
        result["references"] = report
    if job.bench:
        result["timing"] = timed(torch, harness, bridge, kernels, job, dtypes)
        phases.mark("timed")
        if report is not None:
            references.settle(result, report)
        if (bad := _first_bad(Timing.from_json(result["timing"]), job)) is not None:
            return {**result, **bad}
    result["proof"] = _proof(kernels, job)
    phases.mark("proved")
    return result


def _proof(kernels: dict[str, KernelProcess], job: JudgeJob) -> dict | None:
    """Which backend compiled the kernels, from the process of the implementation checked (or the last)."""
    label = job.check[0] if job.check and job.check[0] in kernels else list(kernels)[-1]
    return kernels[label].request({"op": "proof"}, label).get("proof")


def timed(torch, harness: Harness, bridge: Bridge, kernels: dict[str, KernelProcess], job: JudgeJob,
          dtypes: list[str]) -> dict:
    spec, device = harness.spec, job.device
    dtype = job.bench_dtype or dtypes[0]
    shapes = job.bench_shapes or (spec.interpreter_shapes if device == "cpu" else spec.benchmark_shapes)
    pair = ("incumbent", "candidate") if {"incumbent", "candidate"} <= set(kernels) else None
    bench = Bench(torch, harness, bridge, kernels, job, pair)
    plan = timing.TimingPlan(**job.timing)
    return {"dtype": dtype, "device": device, "shapes": [bench.shape(tuple(s), dtype, plan) for s in shapes]}


def _first_bad(timing_result: Timing, job: JudgeJob) -> dict | None:
    """The timed run's first refusal: an output it wrote wrong, or a timing the judge's clock does not
    bear out."""
    for s in timing_result.shapes:
        for label, rc in (s.recheck or {}).items():
            if not rc.ok:
                return {"status": "incorrect", "failed_impl": label,
                        "message": f"output written by the timed run is wrong at {list(s.shape)}: {rc.reason}"}
    for s in timing_result.shapes:
        corr = s.corroboration
        if corr is not None and not corr.ok:  # charged to the implementation whose timing was refused, the incumbent's to the incumbent
            named = [lab for lab in s.impls if str(corr.reason).startswith(f"{lab}:")]  # beyond_copy's
            charged = corr.label or (named[0] if named else job.check[0] if job.check else "candidate")
            return {"status": "uncorroborated", "failed_impl": charged,
                    "message": f"timing refused at {list(s.shape)}: {corr.reason}"}
    return None
