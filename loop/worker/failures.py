"""Calling kernel code: every call into the target goes through `call_impl`, which types whatever
it raises (compile_error, runtime_error, oom) as a `KernelFailure` (loop/common/errors.py, the type
the judge reads back), the kernel's failure as data. A `SpecError` is the spec's failure (not the
kernel's); anything else is tileloop's own bug."""

from __future__ import annotations

import traceback

from loop.common.errors import KernelFailure, SpecError
from loop.common.spec import load_module

__all__ = ["KernelFailure", "SpecError", "call_impl", "classify", "load_module", "short_traceback"]

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


def classify(exc: BaseException, stage: str) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if any(m in text for m in OOM_MARKERS):
        return "oom"
    if any(m.lower() in text.lower() for m in STICKY_CUDA):
        return "runtime_error"
    if stage == "import" or isinstance(exc, SyntaxError) or any(m in text for m in COMPILE_MARKERS):
        return "compile_error"
    return "runtime_error"


def short_traceback(exc: BaseException, limit: int = 4000) -> str:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return tb[-limit:]


def call_impl(label: str, stage: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, KernelFailure, SpecError):
        raise
    except BaseException as exc:  # kernel code may raise anything: that is data, typed here
        raise KernelFailure(classify(exc, stage), label, f"{type(exc).__name__}: {exc}"[:2000], short_traceback(exc)) from exc


