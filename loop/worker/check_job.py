"""The check job (`mode: check`, for `tileloop check` and `init`): the target and its spec tried the
way a run will use them, every problem listed instead of the first.

In order, each step going on where it can: the spec imports and its names read (every malformed
one), the target imports and its entry point exists, and then at every correctness shape and dtype:
make_inputs (on the right device), the reference, the kernel, and every output against the
reference; flops and bytes_moved at every benchmark shape. Which of the target's kernels ran is
recorded (`launched`), so that a kernel no checked shape reaches can be named. A problem is
{what, where, hint}: where is `file:line` when a line is known.
"""

from __future__ import annotations

import ast
import sys
import traceback
from pathlib import Path

from loop.worker.correctness import Harness
from loop.worker.failures import ImplFailure, SpecError, load_module
from loop.worker.launches import LaunchRecorder
from loop.worker.proof import pin_autotune_to_first_config, watch_cutile_compiles
from loop.common.spec import Spec, dtype_name, shapes_of

REQUIRED = ("make_inputs", "reference", "CORRECTNESS_SHAPES", "BENCHMARK_SHAPES", "DTYPES", "TOLERANCES", "flops",
            "bytes_moved")
CALLABLE = ("make_inputs", "reference", "flops", "bytes_moved")


def problem(what: str, where: str = "", hint: str = "") -> dict:
    return {"what": what, "where": where, "hint": hint}


class Lines:
    """file:line of a file's top-level names, and of the innermost frame of a traceback in that file."""

    def __init__(self, path: Path, shown: str):
        self.path, self.shown = path, shown
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError, UnicodeDecodeError):
            tree = ast.Module(body=[], type_ignores=[])
        self.names: dict[str, int] = {}
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for name in [getattr(node, "name", None)] + [getattr(t, "id", None) for t in targets]:
                if name:
                    self.names.setdefault(name, node.lineno)

    def of(self, name: str) -> str:
        return f"{self.shown}:{self.names[name]}" if name in self.names else self.shown

    def of_exception(self, exc: BaseException) -> str:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == self.path]
        return f"{self.shown}:{frames[-1].lineno}" if frames else self.shown


def spec_problems(torch, module, lines: Lines) -> list[dict]:
    """Every malformed or missing name of the spec, each on its own."""
    out = [problem(f"the spec has no {name}", lines.shown, "see the spec contract in README.md (tileloop spec writes "
                   "a skeleton)") for name in REQUIRED if not hasattr(module, name)]
    out += [problem(f"{name} is not a function", lines.of(name), f"def {name}(...)") for name in CALLABLE
            if hasattr(module, name) and not callable(getattr(module, name))]
    dtypes = []
    for i, d in enumerate(getattr(module, "DTYPES", None) or []):
        try:
            dtypes.append(dtype_name(torch, d, f"DTYPES[{i}]"))
        except SpecError as exc:
            out.append(problem(str(exc), lines.of("DTYPES"), "torch.float16 or 'float16'"))
    tolerances = {}
    for key, value in (getattr(module, "TOLERANCES", None) or {}).items():
        try:
            tolerances[dtype_name(torch, key, "TOLERANCES key")] = tuple(float(v) for v in value)
        except (SpecError, TypeError, ValueError) as exc:
            out.append(problem(str(exc) if isinstance(exc, SpecError) else f"TOLERANCES[{key!r}] must be (atol, rtol)",
                               lines.of("TOLERANCES"), "{torch.float16: (1e-3, 1e-3)}"))
    out += [problem(f"TOLERANCES has no entry for {d}", lines.of("TOLERANCES"), f"add {d!r}: (atol, rtol)")
            for d in dtypes if d not in tolerances]
    for name in ("CORRECTNESS_SHAPES", "BENCHMARK_SHAPES", "INTERPRETER_SHAPES"):
        if getattr(module, name, None) is not None:
            try:
                shapes_of(getattr(module, name), name)
            except SpecError as exc:
                out.append(problem(str(exc), lines.of(name), "a list of tuples of ints, e.g. [(4096, 1024), (1, 7)]"))
    return out


def check_job(job: dict) -> dict:
    import torch

    device = job["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("worker asked for cuda but no CUDA device is visible")
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
    if problems:
        return {"status": "ok", "problems": problems}
    spec = Spec(torch, module)
    try:
        target = load_module("tileloop_target", Path(job["target"]))
        entry = spec.entry(target)
    except SpecError as exc:
        return {"status": "ok", "problems": [problem(str(exc), target_lines.shown, "ENTRY = '<function>' in the spec")]}
    except BaseException as exc:  # noqa: BLE001
        return {"status": "ok", "problems": [problem(f"the target does not import: {type(exc).__name__}: {exc}",
                                                     target_lines.of_exception(exc))]}
    recorder = LaunchRecorder(target, job["language"])
    with recorder:
        problems += _run_checks(torch, spec, target, entry, device, job, spec_lines, target_lines)
    problems += _sized(spec, spec_lines)
    return {"status": "ok", "problems": problems, "launched": sorted(recorder.launched), "kernels": recorder.kernels,
            "called": sorted(recorder.called)}


def _run_checks(torch, spec: Spec, target, entry, device: str, job: dict, spec_lines: Lines,
                target_lines: Lines) -> list[dict]:
    harness = Harness(torch, spec, device)
    out = []
    dtypes = [d for d in spec.dtypes if not (device == "cpu" and d == "bfloat16")]
    for dtype in dtypes:
        for shape in spec.correctness_shapes:
            at = f"at shape {shape} {dtype}"  # every problem ends with "(at shape ... dtype)": check.py groups by it
            try:
                if not job.get("run_kernels", True):  # cuTile without a GPU: the spec's side only
                    harness.reference(harness.make_inputs(shape, dtype, 12345))
                    continue
                rec = harness.check_one(target, "candidate", shape, dtype, 12345)
            except SpecError as exc:
                out.append(problem(f"{exc} ({at})", spec_lines.of_exception(exc)))
                continue
            except ImplFailure as exc:
                out.append(_kernel_failure(exc, at, device, target_lines))
                continue
            except BaseException as exc:  # noqa: BLE001 - make_inputs or reference raised: the spec's
                where = spec_lines.of_exception(exc)
                out.append(problem(f"{type(exc).__name__}: {exc} ({at})", where,
                                   "make_inputs and reference must work at every correctness shape and dtype"))
                continue
            if not rec["ok"]:
                out.append(problem(f"outputs do not match the reference: {rec['reason']} ({at})", target_lines.shown,
                                   "the kernel, the reference or TOLERANCES is wrong at this shape"))
    return out


def _kernel_failure(exc: ImplFailure, at: str, device: str, lines: Lines) -> dict:
    if device == "cpu":
        found = interpreter_limits(lines.path.read_text(errors="replace"), exc.message)
        if found:
            construct, line = found
            return problem(f"the Triton interpreter cannot run {construct} ({at})", f"{lines.shown}:{line}",
                           "check it on a GPU (tileloop check --device cuda): the GPU path runs it")
    return problem(f"the kernel failed: {exc.status}: {exc.message[:300]} ({at})", lines.shown,
                   "fix the kernel, or the inputs make_inputs gives it")


def interpreter_limits(source: str, message: str) -> tuple[str, int] | None:
    """The construct of `source` that the Triton interpreter's failure `message` points at, and its
    line: `.to()` on a scalar argument (the interpreter passes Python numbers), libdevice and
    tl.extra calls, inline assembly."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    scalars = {a.arg for fn in tree.body if isinstance(fn, ast.FunctionDef) and _is_jit(fn)
               for a in fn.args.args if not a.arg.endswith("_ptr") and a.annotation is None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "to" and isinstance(node.value, ast.Name) \
                and node.value.id in scalars:
            found.append(("scalar", f"`{node.value.id}.to(...)` on a scalar argument (a Python number there)", node.lineno))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and "libdevice" in ast.unparse(node):
            found.append(("libdevice", "libdevice functions", node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in ("inline_asm_elementwise", "extra"):
            found.append(("asm", f"`{ast.unparse(node)}`", node.lineno))
    if not found:
        return None
    scalar_error = "object has no attribute 'to'" in message
    best = next((f for f in found if (f[0] == "scalar") == scalar_error), found[0])
    return best[1], best[2]


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) or "autotune" in ast.unparse(d) for d in fn.decorator_list)


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
