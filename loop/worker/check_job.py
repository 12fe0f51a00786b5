"""The check job (`mode: check`, for `tileloop check` and `init`): the target and its spec tried the
way a run will use them, every problem listed instead of the first.

In order, each step going on where it can: the spec imports and its names read (every missing or
malformed one, every value left to fill in: `spec_checks.py`), the target imports and its entry
point exists, and then at every correctness shape and dtype: make_inputs (on the right device), the
reference, the kernel, and every output against the reference; flops and bytes_moved at every
benchmark shape. A spec that is not whole still runs what it can (make_inputs, the reference, the
entry point), and a reference that fails at a shape does not keep the kernel from being tried
there. Which of the target's kernels ran is recorded (`launched`), so that a kernel no checked shape
reaches can be named. A problem is {what, where, hint}: where is `file:line` when a line is known.
"""

from __future__ import annotations

import sys
from pathlib import Path

from loop.common.harness import NothingPasses
from loop.worker.correctness import Harness
from loop.worker.failures import KernelFailure, SpecError, call_impl, load_module
from loop.worker.interpreter_limits import failing_line, interpreter_limits
from loop.worker.launches import LaunchRecorder
from loop.worker.proof import pin_autotune_to_first_config, watch_cutile_compiles
from loop.common.spec import Spec
from loop.worker.spec_checks import INPUTS_HINT, Lines, at, entry_point, good_dtypes, partial_checks, problem, \
    spec_problems, template_sizes

__all__ = ["check_job", "interpreter_limits"]

INTERPRETER_HINT = ("the outputs were not compared on the CPU: check on a GPU (tileloop check --device cuda), "
                    "where it runs")


def check_job(job: dict) -> dict:
    import torch

    device, no_gpu = job["device"], False
    if device == "cuda" and not torch.cuda.is_available():  # the spec's side on the CPU, the kernel not run
        device, no_gpu, job = "cpu", True, {**job, "run_kernels": False}
    result = _check(torch, job, device)
    return {**result, "no_gpu": True} if no_gpu else result


def _check(torch, job: dict, device: str) -> dict:
    spec_lines = Lines(Path(job["spec"]), job["spec_shown"])
    target_lines = Lines(Path(job["target"]), job["target_shown"])
    sys.path.insert(0, job["target_dir"])
    if job["backend"] == "cutile":
        watch_cutile_compiles()
    if job["backend"] == "interpreter":
        pin_autotune_to_first_config()
    try:
        module = load_module("tileloop_spec", Path(job["spec"]))
    except BaseException as exc:  # noqa: BLE001 - the user's file failed: that is the finding
        return {"status": "ok", "problems": [problem(f"the spec does not import: {type(exc).__name__}: {exc}",
                                                     spec_lines.of_exception(exc))]}
    problems = spec_problems(torch, module, spec_lines)
    warnings = _unchecked_dtypes(torch, module, device, spec_lines) if job.get("run_kernels", True) else []
    unfilled, estimated = template_sizes(spec_lines)  # named, but they keep nothing else from running
    warnings += estimated
    try:
        target = load_module("tileloop_target", Path(job["target"]))
    except BaseException as exc:  # noqa: BLE001
        problems.append(problem(f"the target does not import: {type(exc).__name__}: {exc}",
                                target_lines.of_exception(exc), "the target's imports must resolve from its folder "
                                "or PYTHONPATH (an installed package it uses, too)"))
        target = None
    if target is not None and entry_point(module, target) is None:
        problems.append(problem(f"the target has no function {getattr(module, 'ENTRY', 'run')!r} to call with the "
                                "inputs", spec_lines.of("ENTRY"), "name it with ENTRY = '<function>', or write an "
                                "adapter entry(target, **inputs) in the spec"))
    if problems:  # the spec is not whole, or there is nothing to call: run what can run
        if target is not None or not job.get("run_kernels", True):  # without the kernel: make_inputs, reference
            fail = lambda exc, where: _kernel_failure(exc, where, device, target_lines)  # noqa: E731
            kernel = target if job.get("run_kernels", True) else None
            problems += one_interpreter_limit(partial_checks(torch, module, kernel, device, spec_lines, fail))
        return {"status": "ok", "problems": problems + unfilled, "warnings": warnings}
    spec = Spec(torch, module)
    recorder = LaunchRecorder(target, job["language"])
    harness = Harness(torch, spec, device)
    with recorder:
        problems += _run_checks(harness, target, spec.entry(target), device, job, spec_lines, target_lines)
    warnings += _hidden(harness, spec_lines)
    problems += _sized(spec, spec_lines)
    interpreter_only = bool(problems) and all("limit" in p for p in problems)
    problems = one_interpreter_limit(problems) + unfilled
    if job.get("run_kernels", True) and not any(d != "bfloat16" or device != "cpu" for d in spec.dtypes):
        problems.append(problem("nothing was checked: the Triton interpreter runs float16 and float32, and DTYPES "
                                "holds bfloat16 only", spec_lines.of("DTYPES"),
                                "add torch.float16 to DTYPES to check on the CPU, or check on a GPU"))
    return {"status": "ok", "problems": problems, "warnings": warnings, "interpreter_only": interpreter_only,
            "launched": sorted(recorder.launched),
            "kernels": recorder.kernels, "called": sorted(recorder.called)}


def _unchecked_dtypes(torch, module, device: str, lines: Lines) -> list[dict]:
    if device == "cpu" and "bfloat16" in good_dtypes(torch, module):
        return [problem("bfloat16 is not checked on the CPU (the Triton interpreter has no bfloat16)", lines.of("DTYPES"),
                        "tileloop check --device cuda on a GPU checks it")]
    return []


def _run_checks(harness: Harness, target, entry, device: str, job: dict, spec_lines: Lines,
                target_lines: Lines) -> list[dict]:
    spec, out = harness.spec, []
    # the interpreter has no bfloat16; the spec's side alone (no kernel run) is torch's, which has
    dtypes = [d for d in spec.dtypes if not (device == "cpu" and d == "bfloat16" and job.get("run_kernels", True))]
    for dtype in dtypes:
        for shape in spec.correctness_shapes:
            where = at(shape, dtype)
            try:
                if not job.get("run_kernels", True):  # no GPU for the kernel: the spec's side only
                    harness.references(harness.make_inputs(shape, dtype, 12345), shape, dtype)
                    continue
                rec = harness.check_one(target, "candidate", shape, dtype, 12345)
            except SpecError as exc:
                out.append(_spec_error(exc, where, dtype, spec_lines))
                continue
            except KernelFailure as exc:
                out.append(_kernel_failure(exc, where, device, target_lines))
                continue
            except BaseException as exc:  # noqa: BLE001 - make_inputs or reference raised: the spec's
                out.append(problem(f"{type(exc).__name__}: {exc} ({where})", spec_lines.of_exception(exc), INPUTS_HINT))
                out += _kernel_alone(harness, entry, shape, dtype, where, device, target_lines)
                continue
            if not rec["ok"]:
                out.append(_mismatch(rec["reason"], where, spec, target_lines))
    return out


def _hidden(harness: Harness, lines: Lines) -> list[dict]:
    """A tolerance that accepts zeros on most of the outputs that are not zero: a kernel wrong on those
    elements would pass (zeros still fail on the others, so it is a warning, not a refusal)."""
    return [problem(f"atol={atol:g} of {dtype} is larger than most of the nonzero outputs: a kernel wrong on those "
                    f"elements would pass ({at(shape, dtype)})", lines.of("TOLERANCES"),
                    f"an atol of {dtype} below the size of most outputs")
            for shape, dtype, _share, atol in harness.notes]


def _kernel_alone(harness: Harness, entry, shape, dtype: str, where: str, device: str, lines: Lines) -> list[dict]:
    """The kernel at a shape where the reference failed: its own failure is named too (nothing compared)."""
    try:
        inputs = harness.make_inputs(shape, dtype, 12345)
    except BaseException:  # noqa: BLE001 - make_inputs failed: already named
        return []
    try:
        call_impl("candidate", "call", entry, **inputs)
    except KernelFailure as exc:
        return [_kernel_failure(exc, where, device, lines)]
    return []


def _spec_error(exc: SpecError, where: str, dtype: str, lines: Lines) -> dict:
    """A spec the harness refused at a shape, said where to fix it."""
    message = str(exc)
    if isinstance(exc, NothingPasses):
        return problem(f"{exc.blind.what} would pass the comparison: a kernel that does nothing would be judged "
                       f"correct ({where})", lines.of(exc.blind.fix_in), exc.blind.fix)
    if "all-zero input" in message:
        return problem(f"{message} ({where})", lines.of("make_inputs"), "random inputs: torch.randn, never zeros")
    return problem(f"{message} ({where})", lines.of_exception(exc))


def _mismatch(reason: str, where: str, spec: Spec, lines: Lines) -> dict:
    if reason.startswith("the kernel gave"):
        called = "the spec's entry()" if spec.adapter is not None else f"{spec.entry_name}()"
        return problem(f"outputs do not match the reference: {reason} ({where})", lines.shown,
                       f"reference returns one value per value {called} returns, in order; to compare only some, "
                       "return those from an adapter entry(target, **inputs) in the spec")
    return problem(f"outputs do not match the reference: {reason} ({where})", lines.shown,
                   "the kernel, the reference or TOLERANCES is wrong at this shape")


def _kernel_failure(exc: KernelFailure, at: str, device: str, lines: Lines) -> dict:
    if device == "cpu":
        found = interpreter_limits(lines.path.read_text(errors="replace"), exc.message,
                                   failing_line(exc, lines.path))
        if found:
            return {**problem(f"the Triton interpreter cannot run {found[0]} ({at})", f"{lines.shown}:{found[1]}",
                              INTERPRETER_HINT), "limit": found, "at": at}
    return problem(f"the kernel failed: {exc.status}: {exc.message[:300]} ({at})", lines.shown,
                   "fix the kernel, or the inputs make_inputs gives it")


def one_interpreter_limit(problems: list[dict]) -> list[dict]:
    """The interpreter's limits as one problem: where the first shape failed, the others the target
    holds (another kernel's, reached at other shapes) named in it; per shape, so that the orchestrator
    lists the shapes once."""
    limits = list(dict.fromkeys(p["limit"] for p in problems if "limit" in p))
    if not limits:
        return problems
    (construct, line), others = limits[0], limits[1:]
    also = "".join(f", and at line {n}" if c == construct else f", nor {c} (line {n})" for c, n in others)
    shown = next(p for p in problems if "limit" in p)["where"].rsplit(":", 1)[0]
    return [problem(f"the Triton interpreter cannot run {construct}{also} ({p['at']})", f"{shown}:{line}",
                    INTERPRETER_HINT) if "limit" in p else p for p in problems]


def _sized(spec: Spec, lines: Lines) -> list[dict]:
    out = []
    for name in ("flops", "bytes_moved"):
        for shape in spec.benchmark_shapes:
            for dtype in spec.dtypes:
                try:
                    value = getattr(spec, name)(shape, dtype)
                    if not value >= 0:
                        raise ValueError(f"gave {value}")
                except BaseException as exc:  # noqa: BLE001
                    out.append(problem(f"{name}({shape}, torch.{dtype}) failed: {type(exc).__name__}: {exc}",
                                       lines.of(name), f"{name}(shape, dtype) gets a shape tuple and a torch.dtype"))
                    break
            else:
                continue
            break
    return out
