"""TileLang targets on the worker's side: each kernel the entry point compiles, built ahead of time for
an explicit CUDA target without a GPU (the language's `compile` hook, `loop.common.language`).

TileLang compiles when a `@tilelang.jit` kernel is called (`JITImpl.compile`: the lazy form's
`kernel(M, N, ...)`, the eager form's `kernel(tensors)`). Here that compile is made for the target
the run's architecture maps to (`arch_target`: `sm_90a` for sm_90, whose WGMMA and register
reconfiguration need the arch-specific target; `sm_100a` for sm_100): TileLang's own target
detection (`target="auto"`) needs a GPU and is never asked. The kernel the entry point then calls is
a stand-in (`_Compiled`) that runs nothing and hands back empty outputs of the shapes and dtypes the
kernel declares, so an entry point that launches several kernels reaches them all.

TileLang's kernel caches are off for the time of the builds (nothing of another run or shape is
reused: its autotuner once reused one shape's result for another), so every kernel is built here;
the machine code nvcc makes for it (`tilelang.contrib.nvcc.compile_cuda`, watched) is read with
cuobjdump (registers, stack, static shared and local memory per function), and the dynamic shared
memory and threads per block from the lowered device module.

In the judge's kernel process (`loop.worker.serve`) a target loads as a Python module and its kernels
compile at their first call on the device: `use_own_cache` first makes TileLang's kernel cache the
implementation's own folder and its default target the device's (explicit: what its `target="auto"`
picks on a GPU, `sm_90a` on sm_90), and `compiled_kernels` reads back, for the backend's proof, each
kernel the target's `@tilelang.jit` functions hold: its target and the cache folder it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any

from loop.common import tilelang_install
from loop.worker.aot import _patched, fake_cuda, resource_usage


def arch_target(cap: int) -> str:
    """The TileLang target architecture for a run's `sm_<cap>`: arch-specific (`sm_90a`, `sm_100a`)
    from Hopper on, where TileLang's kernels need it; plain below."""
    if cap <= 0:
        raise ValueError(f"architecture must be a positive compute capability, got {cap}")
    return f"sm_{cap}a" if cap >= 90 else f"sm_{cap}"


def target_of(cap: int) -> dict[str, str]:
    """The explicit target TileLang compiles for: a CUDA kind and its architecture."""
    return {"kind": "cuda", "arch": arch_target(cap)}


CACHE_FOLDER = "tilelang"  # TileLang's kernel cache, in an implementation's own cache folder


def use_own_cache(own: str, cap: int) -> str:
    """In a kernel process, before the implementation (and TileLang with it) is imported: TileLang's
    kernel cache made the `tilelang` folder of the implementation's own cache folder `own`
    (`loop.common.namespaces.own_triton_cache`, where another implementation's is hidden), or turned
    off where there is none (""), so that implementations never share compiled kernels; and its
    default target pinned to the device's (`target_of(cap)`, a kernel's own `target=` still wins).
    Returns the cache folder ("" when off)."""
    os.environ["TILELANG_DEFAULT_TARGET"] = json.dumps(target_of(cap))
    if not own:
        os.environ["TILELANG_DISABLE_CACHE"] = "1"
        return ""
    folder = os.path.join(own, CACHE_FOLDER)
    os.makedirs(folder, exist_ok=True)
    os.environ["TILELANG_CACHE_DIR"] = folder
    return folder


def kernel_arch(kernel) -> str | None:
    """The architecture a compiled TileLang kernel was built for ("sm_90a"); None where it says none."""
    target = getattr(kernel, "target", None)
    attrs = getattr(target, "attrs", None)
    arch = attrs.get("arch") if attrs is not None else None
    return str(arch) if arch else None


def jit_functions(module) -> dict[str, Any]:
    """The `@tilelang.jit` functions a module defines, by the name of the function each decorates."""
    return {_name(obj): obj for obj in vars(module).values()
            if type(obj).__name__ == "JITImpl" and getattr(getattr(obj.func, "orig_func", None), "__module__", None)
            == module.__name__}


def compiled_kernels(module) -> list[dict]:
    """Each kernel the module's `@tilelang.jit` functions hold compiled (one per set of compile
    arguments): the function's name, the kernel's symbol, the architecture it was built for, the cache
    folder it was saved to or loaded from (None: uncached) and the kernel's `id` (as
    `loop.worker.proof.watch_tilelang_compiles` records the kernels compiled in this process)."""
    out = []
    for name, impl in jit_functions(module).items():
        held = [*getattr(impl, "_kernel_cache", {}).values(), *getattr(impl, "_tuner_cache", {}).values()]
        for kernel in {id(k): k for k in held}.values():
            func = getattr(kernel, "prim_func", None)
            symbol = func.attrs.get("global_symbol") if func is not None and func.attrs is not None else None
            out.append({"kernel": name, "symbol": str(symbol) if symbol else None, "arch": kernel_arch(kernel),
                        "cache_path": getattr(kernel, "_tilelang_cache_path", None), "id": id(kernel)})
    return out


@contextlib.contextmanager
def uncached():
    """TileLang's kernel caches (in memory and on disk) off for the time of the builds."""
    import tilelang

    was = tilelang.is_cache_enabled()
    tilelang.disable_cache()
    try:
        yield
    finally:
        if was:
            tilelang.enable_cache()


@contextlib.contextmanager
def machine_code(made: list[bytes]):
    """Every cubin (or fatbin) nvcc makes for TileLang meanwhile, appended to `made`."""
    from tilelang.contrib import nvcc

    real = nvcc.compile_cuda

    def compile_cuda(code, target_format="ptx", *args, **kwargs):
        binary = real(code, target_format, *args, **kwargs)
        if target_format in ("cubin", "fatbin"):
            made.append(bytes(binary))
        return binary

    nvcc.compile_cuda = compile_cuda
    try:
        yield
    finally:
        nvcc.compile_cuda = real


def launch_facts(kernel) -> list[dict]:
    """Per device function of a compiled kernel: its symbol, threads per block and dynamic shared memory
    (bytes), read from the lowered device module; [] when it is not there (a kernel loaded from a cache)."""
    artifact = getattr(kernel, "artifact", None)
    if artifact is None or artifact.device_mod is None:
        return []
    out = []
    for gv, fn in artifact.device_mod.functions.items():
        attrs = dict(fn.attrs) if fn.attrs is not None else {}
        extent = dict(attrs.get("thread_extent") or {})
        threads = 1
        for axis in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            threads *= int(extent.get(axis, 1))
        out.append({"symbol": str(attrs.get("global_symbol", gv.name_hint)), "threads": threads,
                    "dynamic_shared": int(attrs.get("dyn_shared_memory_buf", 0))})
    return out


class _Compiled:
    """A compiled TileLang kernel as the entry point meets it ahead of time: called, it runs nothing and
    returns empty outputs (the parameters `out_idx` names), their symbolic sizes read from the inputs."""

    def __init__(self, kernel, torch):
        self.kernel, self._torch = kernel, torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __call__(self, *args, **kwargs):
        params = list(self.kernel.params)
        outs = list(self.kernel.out_idx or [])
        inputs = [p for i, p in enumerate(params) if i not in outs]
        sizes: dict[str, int] = {}
        for param, arg in zip(inputs, args):
            for dim, n in zip(param.shape, getattr(arg, "shape", ())):
                if not isinstance(dim, int):
                    sizes[str(dim)] = int(n)
        made = [self._torch.empty([_size(d, sizes) for d in params[i].shape], dtype=params[i].torch_dtype())
                for i in outs]
        return None if not made else made[0] if len(made) == 1 else made


def _size(dim, sizes: dict[str, int]) -> int:
    """An output's size: a constant, or a symbolic size some input has."""
    if isinstance(dim, int):
        return dim
    try:
        return int(dim)  # a constant size
    except (TypeError, ValueError):  # a symbolic one: read from the inputs
        pass
    if str(dim) not in sizes:
        raise ValueError(f"the output's size {dim} is not a size of any input: cannot make it ahead of time")
    return sizes[str(dim)]


def tilelang_compile(torch, load_target, call_run, cap: int) -> list[dict]:
    """The compile gate's build of a TileLang target for one architecture (the language's `compile`):
    one row per kernel the entry point compiled, with its target, resources and launch facts."""
    try:
        from tilelang.jit import JITImpl
    except ImportError as exc:
        raise RuntimeError(f"TileLang cannot be imported ({exc}): {tilelang_install.INSTALL_HINT}") from None

    target = target_of(cap)
    real = JITImpl.compile
    built: list[tuple[str, Any, list[bytes]]] = []

    def compile_for_target(self, *args, **kwargs):
        saved, made = self.target, []
        self.target = target  # the frontend (T.gemm's choice of instructions) and the build both see it
        try:
            with machine_code(made):
                kernel = real(self, *args, **kwargs)
        finally:
            self.target = saved
        built.append((_name(self), kernel, made))
        return _Compiled(kernel, torch)

    with uncached(), _patched(JITImpl, "compile", compile_for_target), fake_cuda(torch, cap):
        module = load_target()
        call_run(module)
    return rows(built, target["arch"])


def _name(impl) -> str:
    """The name of the function `@tilelang.jit` decorates."""
    fn = getattr(impl.func, "orig_func", None)
    return getattr(fn, "__name__", "kernel")


def rows(built: list[tuple[str, Any, list[bytes]]], arch: str) -> list[dict]:
    """The compile gate's rows: one per kernel compiled (the same machine code once), its resources per
    device function from its cubin."""
    out, seen = [], set()
    for name, kernel, binaries in built:
        digest = hashlib.sha256(b"".join(binaries)).hexdigest()[:16]
        if (name, digest) in seen:
            continue
        seen.add((name, digest))
        facts = launch_facts(kernel)
        resources = [r for blob in binaries for r in resource_usage(blob)] or [
            {"note": "no machine code from nvcc was seen (another execution backend, e.g. nvrtc): registers and "
                     "spills not reported"}]
        dynamic = sum(f["dynamic_shared"] for f in facts)
        static = sum(r.get("shared", 0) for r in resources)
        threads = max((f["threads"] for f in facts), default=None)
        out.append({"kernel": name, "symbol": ", ".join(f["symbol"] for f in facts) or None, "target": arch,
                    "ir": ["cuda", "cubin"] if binaries else ["cuda"], "threads": threads, "num_warps": threads // 32 if threads else None,
                    "dynamic_shared_bytes": dynamic, "shared_bytes": static + dynamic,
                    "cubin_bytes": sum(len(b) for b in binaries), "resources": resources})
    return out
