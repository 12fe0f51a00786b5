"""Ahead-of-time compilation for GPUs that are not here (worker side; no GPU needed).

The target's own `run(**inputs)` is called with CPU tensors from the spec, while its launches
are intercepted: Triton launches compile for a fake driver whose target is the requested
architecture (`JITFunction.run(..., warmup=True)`, every autotune config), and cuTile launches
are captured and exported with `cuda.tile.compilation.export_kernel(..., output_format="cubin")`.
A wrapper that tunes with `cuda.tile.tune.exhaustive_search` (which needs a GPU to time anything)
meets a stand-in that captures the launch of every config of its search space instead, with the
config's hints, and answers the first config as the best: every config is compiled.
Registers, stack and local memory (spills) come from `cuobjdump -res-usage` on each cubin.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from loop.common.language import get_language, resolve

SM_COUNTS = {80: 108, 86: 84, 89: 128, 90: 132, 100: 148, 103: 148, 120: 84}


def parse_arch(text: str) -> int:
    m = re.fullmatch(r"sm_(\d+)a?", text.strip())
    if not m:
        raise ValueError(f"architecture must look like sm_90 or sm_100, got {text!r}")
    return int(m.group(1))


class _FakeProps:
    def __init__(self, cap: int):
        self.major, self.minor = divmod(cap, 10)
        self.multi_processor_count = SM_COUNTS.get(cap, 132)
        self.name = f"AOT target sm_{cap}"
        self.L2_cache_size = 50 * 2**20
        self.total_memory = 80 * 2**30


@contextlib.contextmanager
def _patched(obj, name: str, value):
    had = hasattr(obj, name)
    old = getattr(obj, name, None)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def fake_cuda(torch, cap: int):
    """torch.cuda queries a launch wrapper may make, answered for the target architecture."""
    props = _FakeProps(cap)

    class _Stream:  # streams and events a wrapper creates: inert, there is nothing to order here
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

        def synchronize(self):
            pass

    with contextlib.ExitStack() as stack:
        for name, value in (("Stream", _Stream), ("Event", _Stream), ("stream", lambda *a, **k: contextlib.nullcontext()),
                            ("current_stream", lambda *a, **k: None), ("current_device", lambda: 0),
                            ("get_device_capability", lambda *a: (props.major, props.minor)),
                            ("get_device_properties", lambda *a: props), ("is_available", lambda: True),
                            ("device_count", lambda: 1), ("synchronize", lambda *a: None),
                            ("is_current_stream_capturing", lambda: False)):
            stack.enter_context(_patched(torch.cuda, name, value))
        yield


def cuobjdump() -> str | None:
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def resource_usage(cubin: bytes) -> list[dict]:
    """Per function: registers, stack, shared and local (spill) bytes, from cuobjdump -res-usage."""
    tool = cuobjdump()
    if tool is None:
        return [{"note": "cuobjdump not found: registers and spills not reported"}]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([tool, "-res-usage", fh.name], capture_output=True, text=True, timeout=60).stdout
    funcs, name = [], None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Function "):
            name = line[len("Function "):].rstrip(":")
        elif line.startswith("REG:") and name:
            fields = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line))
            funcs.append({"function": name, "registers": int(fields.get("REG", 0)), "stack": int(fields.get("STACK", 0)),
                          "shared": int(fields.get("SHARED", 0)), "local": int(fields.get("LOCAL", 0)),
                          "spills": int(fields.get("LOCAL", 0)) > 0 or int(fields.get("STACK", 0)) > 0})
    return funcs


def _triton_compile(torch, load_target, call_run, cap: int) -> list[dict]:
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    class FakeDriver:
        def __init__(self, target):
            self.target = target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            return torch.device("cpu")

        def is_active(self):
            return True

    compiled: list[Any] = []
    real_run = JITFunction.run

    def jit_run(self, *args, grid, warmup, **kwargs):
        kernel = real_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self, kernel))
        return kernel

    def autotune_run(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        for config in self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs:
            if config.pre_hook is not None:
                with contextlib.suppress(Exception):  # hooks that touch device state have nothing to do here
                    config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            self.fn.run(*args, **kwargs, **config.all_kwargs())
        self.nargs = None

    previous = driver._active  # reading driver.active would initialise the real (absent) GPU driver
    driver.set_active(FakeDriver(GPUTarget("cuda", cap, 32)))
    try:
        with _patched(JITFunction, "run", jit_run), _patched(Autotuner, "run", autotune_run), fake_cuda(torch, cap):
            module = load_target()
            call_run(module)
    finally:
        driver._active = previous
    out = []
    for fn, kernel in compiled:
        md = kernel.metadata
        out.append({"kernel": getattr(fn, "__name__", str(fn)), "ir": sorted(kernel.asm.keys()),
                    "num_warps": getattr(md, "num_warps", None), "num_stages": getattr(md, "num_stages", None),
                    "shared_bytes": getattr(md, "shared", None), "cubin_bytes": len(kernel.asm.get("cubin", b"")),
                    "resources": resource_usage(kernel.asm["cubin"]) if "cubin" in kernel.asm else []})
    return out


def _cutile_signature(torch, kernel, args):
    import cuda.tile as ct
    from cuda.tile.compilation import (
        ArrayConstraint,
        CallingConvention,
        ConstantConstraint,
        KernelSignature,
        ScalarConstraint,
    )

    dtypes = {torch.float16: ct.float16, torch.bfloat16: ct.bfloat16, torch.float32: ct.float32,
              torch.float64: ct.float64, torch.int32: ct.int32, torch.int64: ct.int64, torch.int8: ct.int8,
              torch.uint8: ct.uint8, torch.bool: ct.bool_}
    pyfunc = kernel._annotated_function.pyfunc
    params = list(inspect.signature(pyfunc).parameters.values())
    cons = []
    for p, a in zip(params, args):
        if "ConstantAnnotation" in repr(p.annotation):
            cons.append(ConstantConstraint(a))
        elif isinstance(a, torch.Tensor):
            contiguous_last = a.ndim and a.stride(-1) == 1
            cons.append(ArrayConstraint(dtypes[a.dtype], a.ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                                        alias_groups=(), may_alias_internally=False,
                                        stride_constant=[None] * (a.ndim - 1) + [1] if contiguous_last else None,
                                        base_addr_divisible_by=16))
        elif isinstance(a, bool):
            cons.append(ScalarConstraint(ct.bool_))
        elif isinstance(a, int):
            cons.append(ScalarConstraint(ct.int32 if -2**31 <= a < 2**31 else ct.int64))
        elif isinstance(a, float):
            cons.append(ScalarConstraint(ct.float32))
        else:
            raise TypeError(f"cannot describe argument {p.name}={type(a).__name__} for ahead-of-time export")
    return KernelSignature(cons, CallingConvention.cutile_python_v1()).with_mangled_symbol(pyfunc.__name__)


def _capture_search(launches: list):
    """A stand-in for `cuda.tile.tune.exhaustive_search` that times nothing: it records the launch
    of every config (kernel with the config's hints, arguments) and answers the first config."""
    import cuda.tile as ct
    from cuda.tile.tune import Measurement, TuningResult

    def search(search_space, stream, grid_fn, kernel, args_fn, hints_fn=None, **options):
        configs = list(search_space)
        if not configs:
            raise ValueError("Search space is empty.")
        for cfg in configs:
            grid_fn(cfg)  # a grid that cannot be built fails here as it would on the GPU
            base = kernel if isinstance(kernel, ct.kernel) else kernel(cfg)
            hints = hints_fn(cfg) if hints_fn is not None else {}
            launches.append((base.replace_hints(**hints), tuple(args_fn(cfg))))
        measured = tuple(Measurement(config=cfg, mean_us=0.0, num_samples=0, error_margin_us=0.0) for cfg in configs)
        return TuningResult(best=measured[0], successes=measured, failures=())

    return search


def _hints(kernel) -> dict:
    """The compiler hints a kernel object carries that differ from the defaults (JSON-safe)."""
    opts = kernel._compiler_options
    out = {}
    for name, default in (("occupancy", None), ("num_ctas", None), ("num_worker_warps", None), ("opt_level", 3)):
        value = getattr(opts, name, default)
        if value != default:
            out[name] = value if isinstance(value, int) else str(value)
    return out


def _cutile_compile(torch, load_target, call_run, cap: int) -> list[dict]:
    import io

    import cuda.tile as ct
    import cuda.tile.tune as tune
    from cuda.tile.compilation import export_kernel
    from cuda.tile.tune import _tune

    launches = []

    def capture(stream, grid, kernel, kernel_args, **kwargs):
        launches.append((kernel, tuple(kernel_args)))

    search = _capture_search(launches)
    with (_patched(ct, "launch", capture), _patched(tune, "exhaustive_search", search),
          _patched(_tune, "exhaustive_search", search), fake_cuda(torch, cap)):
        module = load_target()
        call_run(module)
    out, seen = [], set()
    for kernel, args in launches:
        sig = _cutile_signature(torch, kernel, args)
        hints = _hints(kernel)
        if (sig.symbol, repr(hints)) in seen:  # one compile per signature and hints (tuned configs differ in both)
            continue
        seen.add((sig.symbol, repr(hints)))
        buf = io.BytesIO()
        export_kernel(kernel, [sig], buf, gpu_code=f"sm_{cap}", output_format="cubin")
        cubin = buf.getvalue()
        out.append({"kernel": kernel._annotated_function.pyfunc.__name__, "symbol": sig.symbol, "hints": hints,
                    "ir": ["tileir", "cubin"], "cubin_bytes": len(cubin), "resources": resource_usage(cubin)})
    return out


def compile_all(torch, spec, target_path: Path, language: str, archs: list[str], load_module, classify,
                dtypes: list[str] | None = None) -> dict:
    """Compile the target for every architecture and dtype (`dtypes`: a subset of the spec's
    DTYPES, for a worker given one part of the gate); errors are data, per arch and dtype."""
    unknown = [d for d in dtypes or [] if d not in spec.dtypes]
    if unknown:
        raise ValueError(f"dtypes {unknown} are not in the spec's DTYPES {list(spec.dtypes)}")
    shape = spec.correctness_shapes[-1]
    results = []
    os.environ.pop("TRITON_INTERPRET", None)
    for arch in archs:
        cap = parse_arch(arch)
        for dtype in (dtypes or spec.dtypes):
            inputs = spec.make_inputs(shape, dtype, 0, "cpu")
            counter = {"n": 0}

            def load_target():
                counter["n"] += 1
                return load_module(f"tileloop_aot_{cap}_{dtype}_{counter['n']}", target_path)

            def call_run(module):
                spec.entry(module)(**inputs)

            entry = {"arch": arch, "dtype": dtype, "shape": list(shape)}
            try:
                fn = resolve(get_language(language).compile)
                entry["kernels"] = fn(torch, load_target, call_run, cap)
                entry["ok"] = bool(entry["kernels"])
                if not entry["kernels"]:
                    entry["error"] = "run() launched no kernel"
            except Exception as exc:  # a kernel that does not compile is data, per arch and dtype
                entry.update(ok=False, status=classify(exc, "compile"), error=f"{type(exc).__name__}: {exc}"[:3000])
            results.append(entry)
    return {"ok": all(r["ok"] for r in results), "results": results}
