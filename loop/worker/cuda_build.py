"""CUDA C targets on the worker's side: a `.cu` file built by nvcc into a shared library that exports
`solve`, and that library loaded and called (the language's `compile` and `load` hooks,
`loop.common.language`).

The build (`build`): `nvcc -shared -Xcompiler -fPIC -O3 -lineinfo -Xptxas -v` with one
`-gencode arch=compute_XX,code=sm_XX` per architecture: machine code (SASS) for each, never PTX
alone (a driver older than the toolkit refuses newer PTX). ptxas's report gives registers, spills,
stack and shared memory per kernel and architecture. A failure is the compiler's first error, at
its file:line. Builds are cached by the source's hash, the flags, nvcc's version and the
architectures (one folder per key, written whole or not at all). No GPU is needed, and the built
library is opened here to prove that it exports `solve` (its CUDA runtime starts only when called).

The load (`load_target`): a module whose `solve(**inputs)` (also `run`) builds or takes from the
cache the library for the current device's architecture (at its first call, or when the kernel
process loads it: `_Solve.prepare`) and calls it through `Entry`: `solve`
bound by ctypes (`bind`, its argument types from the C signature), called with the inputs by name
(`arguments`): each tensor's data pointer after checking it (the parameter's dtype, contiguous, on the
device), each scalar's value after checking it against its C type, and for the stream form the
current torch stream; every mismatch named in one line. `Entry` runs a host-only library on CPU
tensors the same way (how the tests exercise it without a GPU); only the build for the device's
architecture and the call of device code need one. `_Solve` keeps what the backend's proof reads
(`loop.worker.proof`): the build it called (library, architectures, key) and how many calls ran;
its `__call__` is the language's launch hook, where a kernel process records launches.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path

from loop.common import cuda_c, nvcc

BASE_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-O3", "-lineinfo", "-Xptxas", "-v")
LIBRARY = "solve.so"
# a scalar parameter's C type -> its ctypes type (every type of cuda_c.SCALAR_KINDS)
_CTYPES = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "unsigned int": ctypes.c_uint, "unsigned": ctypes.c_uint,
           "uint32_t": ctypes.c_uint32, "long": ctypes.c_long, "long long": ctypes.c_longlong,
           "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "short": ctypes.c_short,
           "int16_t": ctypes.c_int16, "char": ctypes.c_byte, "int8_t": ctypes.c_int8, "bool": ctypes.c_bool,
           "float": ctypes.c_float, "double": ctypes.c_double}


class BuildError(Exception):
    """nvcc refused the source: the message is its first error, at file:line."""


@dataclass
class Build:
    """A built library: where it is, what built it, and each kernel's resources per architecture."""

    library: Path
    archs: list[str]
    toolchain: dict
    flags: list[str]
    key: str
    cached: bool
    kernels: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"library": str(self.library), "archs": self.archs, "toolchain": self.toolchain,
                "flags": self.flags, "key": self.key, "cached": self.cached}


def gencode(arch: str) -> list[str]:
    """`-gencode arch=compute_90,code=sm_90` for "sm_90" (an `a` or `f` suffix kept); ValueError otherwise."""
    m = re.fullmatch(r"sm_(\d+[af]?)", arch.strip())
    if m is None:
        raise ValueError(f"architecture must look like sm_90 or sm_100a, got {arch!r}")
    return ["-gencode", f"arch=compute_{m.group(1)},code=sm_{m.group(1)}"]


def flags_for(archs: list[str]) -> list[str]:
    return [*BASE_FLAGS, *(f for arch in archs for f in gencode(arch))]


def default_cache_root() -> Path:
    """Beside this worker's Triton cache (the run's, each implementation's own in a kernel process),
    else the temporary folder."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir) / "cuda-c"
    except ImportError:
        return Path(tempfile.gettempdir()) / "tileloop-cuda-c"


def cache_key(source: bytes, flags: list[str], version: str, archs: list[str]) -> str:
    """The build cache's key: the source's bytes, nvcc's flags, its version and the architectures."""
    blob = json.dumps({"flags": flags, "nvcc": version, "archs": archs}, sort_keys=True).encode()
    return hashlib.sha256(source + b"\0" + blob).hexdigest()[:24]


def fingerprint(capability: list[int] | None) -> dict:
    """The CUDA C build's part of the environment fingerprint (in every record of a run): nvcc's
    release and version and where it came from (not its path), and the flags and architectures a
    kernel process builds with on this device (`capability`; none without a GPU). Nulls where no nvcc
    is found."""
    archs = [f"sm_{capability[0]}{capability[1]}"] if capability else []
    chain = nvcc.toolchain()
    if chain is None:
        return {"nvcc_release": None, "nvcc_version": None, "nvcc_source": None, "nvcc_flags": None,
                "nvcc_archs": archs}
    return {"nvcc_release": chain.release, "nvcc_version": chain.version, "nvcc_source": chain.source,
            "nvcc_flags": flags_for(archs) if archs else list(BASE_FLAGS), "nvcc_archs": archs}


def build(source_path: Path, archs: list[str], cache_root: Path | None = None, shown: str | None = None) -> Build:
    """The library of `source_path` for `archs`, from the cache or built now; BuildError for a
    source nvcc refuses, RuntimeError where no nvcc is found."""
    chain = nvcc.toolchain()
    if chain is None:
        raise RuntimeError(nvcc.why_none())
    missing = [a for a in archs if a.rstrip("af") not in chain.archs]
    if missing:
        raise RuntimeError(f"nvcc {chain.release} at {chain.path} emits no machine code for {', '.join(missing)} "
                           f"(it does for {', '.join(chain.archs)})")
    source = source_path.read_bytes()
    flags = flags_for(archs)
    key = cache_key(source, flags, chain.version, archs)
    folder = (cache_root or default_cache_root()) / key
    if (folder / LIBRARY).is_file() and (folder / "build.json").is_file():
        meta = json.loads((folder / "build.json").read_text())
        return Build(folder / LIBRARY, archs, chain.to_json(), flags, key, True, meta["kernels"])
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    try:
        src = work / source_path.name
        src.write_bytes(source)
        proc = subprocess.run([chain.path, *flags, "-o", str(work / LIBRARY), str(src)], capture_output=True,
                              text=True, cwd=work, timeout=600, check=False)
        if proc.returncode != 0:
            raise BuildError(first_error(proc.stderr + proc.stdout, src.name, shown or str(source_path)))
        kernels = resource_usage(proc.stderr + proc.stdout)
        exported(work / LIBRARY)
        (work / "build.json").write_text(json.dumps({"kernels": kernels, "flags": flags, "nvcc": chain.to_json()}))
        try:
            work.rename(folder)
        except OSError:  # another worker built the same key first: its build stands
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Build(folder / LIBRARY, archs, chain.to_json(), flags, key, False, kernels)


def first_error(log: str, built_name: str, shown: str) -> str:
    """nvcc's first error as `file:line: error: ...` (the target's shown path for the copy it built)."""
    for line in log.splitlines():
        m = re.match(r"(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<what>(?:catastrophic )?error.*)", line)
        if m:
            file = shown if Path(m.group("file")).name == built_name else m.group("file")
            return f"{file}:{m.group('line')}: {m.group('what')}"
    for line in log.splitlines():
        if "error" in line.lower():
            return f"{shown}: {line.strip()}"
    return f"{shown}: nvcc failed: {log.strip().splitlines()[-1] if log.strip() else 'no output'}"


def resource_usage(log: str) -> list[dict]:
    """Per kernel and architecture, from `-Xptxas -v`: registers, spill stores and loads (bytes),
    stack frame and shared memory (bytes)."""
    out: list[dict] = []
    current: dict | None = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(?P<sym>[^']+)' for '(?P<arch>sm_\w+)'", line)
        if m:
            current = {"symbol": m.group("sym"), "kernel": demangle(m.group("sym")), "arch": m.group("arch"),
                       "registers": None, "spills": 0, "spill_loads": 0, "stack": 0, "shared": 0}
            out.append(current)
            continue
        if current is None:
            continue
        if (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current.update(stack=int(m.group(1)), spills=int(m.group(2)), spill_loads=int(m.group(3)))
        if (m := re.search(r"Used (\d+) registers", line)):
            current["registers"] = int(m.group(1))
        if (m := re.search(r"(\d+) bytes smem", line)):
            current["shared"] = int(m.group(1))
    return out


def demangle(symbol: str) -> str:
    """The kernel's name without its C++ mangling (`_Z10add_kernelPKfS0_Pfi` -> add_kernel)."""
    m = re.match(r"_Z(\d+)", symbol)
    if m is None:
        return symbol
    n = int(m.group(1))
    return symbol[m.end():m.end() + n]


def exported(library: Path) -> None:
    """Open the library (no GPU needed: its runtime starts at the first call) and find `solve` in it."""
    try:
        bind(library, [])
    except LoadError as exc:
        raise BuildError(str(exc)) from None


def cuda_compile(torch, load_target, call_run, cap: int) -> list[dict]:
    """The compile gate's build of a CUDA C target for one architecture (the language's `compile`):
    one row per kernel, with its resources and what built it."""
    module = load_target()
    module.solve.dry = True
    call_run(module)  # the spec's inputs against solve's parameters: names, tensor or scalar, dtypes
    done = module.build([f"sm_{cap}"])
    rows = []
    for k in done.kernels:
        rows.append({"kernel": k["kernel"], "symbol": k["symbol"], "ir": ["sass"],
                     "resources": [{"registers": k["registers"], "spills": k["spills"], "local": k["stack"],
                                    "shared": k["shared"]}],
                     "shared_bytes": k["shared"], "build": done.to_json()})
    return rows


class LoadError(Exception):
    """A library that cannot be called as the target's entry point (no `solve` exported)."""


def argtype(p: cuda_c.Param):
    """The ctypes type `solve` takes for a parameter: a pointer (a tensor's data, the stream) or the
    scalar's own C type."""
    return ctypes.c_void_p if p.pointer or p.stream else _CTYPES[p.ctype]


def _fits(value: int, ctype) -> bool:
    if ctype is ctypes.c_bool:
        return value in (0, 1)
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype(-1).value == -1
    return -(1 << (bits - 1)) <= value < (1 << (bits - 1)) if signed else 0 <= value < (1 << bits)


def _scalar(p: cuda_c.Param, value) -> tuple[object, str | None]:
    """The Python value passed for a scalar parameter, or why the value given cannot be."""
    if p.kind == "int":
        if not isinstance(value, int):
            return None, f"{p.name}: {p.describe()} is given {type(value).__name__} {value!r}, not an integer"
        if not _fits(int(value), _CTYPES[p.ctype]):
            return None, f"{p.name}: {p.describe()} is given {value}, which a C {p.ctype} cannot hold"
        return int(value), None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{p.name}: {p.describe()} is given {type(value).__name__} {value!r}, not a number"
    return float(value), None


def arguments(torch, params: list[cuda_c.Param], inputs: dict, device: str | None) -> list:
    """solve's arguments in its parameters' order, from the inputs by name: each tensor's data pointer
    (checked: its dtype the parameter's, contiguous, on `device`), each scalar's value (checked against
    its C type), the current stream for the stream form's cudaStream_t; TypeError, one line, naming
    every mismatch. `device` None: the checks that need no device only (the compile gate's dry call)."""
    wrong = cuda_c.mismatches(params, {k: isinstance(v, torch.Tensor) for k, v in inputs.items()})
    args = []
    for p in params:
        if p.stream:
            args.append(torch.cuda.current_stream().cuda_stream if device == "cuda" else None)
            continue
        if p.name not in inputs or isinstance(inputs[p.name], torch.Tensor) != p.pointer:
            continue  # named by mismatches
        value = inputs[p.name]
        if not p.pointer:
            value, why = _scalar(p, value)
            wrong += [why] if why else []
            args.append(value)
            continue
        if str(value.dtype) != f"torch.{p.dtype}":
            wrong.append(f"{p.name}: {p.describe()} is given {value.dtype}")
        elif device is not None and (value.device.type != device or not value.is_contiguous()):
            wrong.append(f"{p.name}: {p.describe()} needs a contiguous tensor on {device}, got one on {value.device}"
                         + ("" if value.is_contiguous() else ", strided"))
        args.append(value.data_ptr())
    if wrong:
        raise TypeError("; ".join(wrong))
    return args


def bind(library: Path, params: list[cuda_c.Param]):
    """`solve` of a shared library, its argument types those of `params`; LoadError where it exports none."""
    try:
        fn = getattr(ctypes.CDLL(str(library)), cuda_c.ENTRY)
    except AttributeError:
        raise LoadError(f"{library.name} exports no {cuda_c.ENTRY}: declare it extern \"C\"") from None
    except OSError as exc:
        raise LoadError(f"{library.name} cannot be loaded: {str(exc).splitlines()[0]}") from None
    fn.restype = None
    fn.argtypes = [argtype(p) for p in params]
    return fn


class Entry:
    """`solve` of a built library, called with inputs by name on `device` ("cuda"; "cpu" for a host-only
    library): the arguments checked and mapped by `arguments`, then one ctypes call."""

    def __init__(self, library: Path, params: list[cuda_c.Param], device: str = "cuda"):
        self.params, self.device = params, device
        self.fn = bind(library, params)

    def __call__(self, **inputs) -> None:
        import torch

        self.fn(*arguments(torch, self.params, inputs, self.device))


class _Solve:
    """`solve(**inputs)`: the target's entry point, called with the spec's inputs by name; built (or
    taken from the cache) for the current device's architecture at the first call, or before it
    (`prepare`). Named `solve` of its target's module (`__name__`, `__module__`), as a launch
    recorder names the kernels it sees; `built` and `calls` are what the backend's proof reads."""

    def __init__(self, path: Path, params: list[cuda_c.Param], form: str, module: str = ""):
        self.path, self.params, self.form = path, params, form
        self.__name__, self.__module__ = cuda_c.ENTRY, module
        self.dry = False  # True: check the arguments and call nothing (no GPU is needed)
        self.built: Build | None = None  # the library the calls go to
        self.calls = 0  # calls that reached the library and returned
        self._entry: Entry | None = None

    def prepare(self, arch: str) -> Build:
        """Build (or take from the cache) the library for `arch` ("sm_90") and bind its solve."""
        return self.attach(build(self.path, [arch], shown=self.path.name), "cuda")

    def attach(self, built: Build, device: str) -> Build:
        """Call `built`'s library from now on, with tensors on `device`."""
        self._entry = Entry(built.library, self.params, device)
        self.built = built
        return built

    def _bound(self, torch) -> Entry:
        if self._entry is None:
            major, minor = torch.cuda.get_device_capability()
            self.prepare(f"sm_{major}{minor}")
        return self._entry

    def __call__(self, **inputs) -> None:
        import torch

        if self.dry:  # the compile gate: the spec's inputs checked against the parameters, nothing run
            arguments(torch, self.params, inputs, None)
            return
        self._bound(torch)(**inputs)  # on a GPU (a host-only library attached: on the CPU)
        self.calls += 1


def load_target(name: str, path: Path) -> types.ModuleType:
    """A CUDA C target as the worker calls it (the language's `load`): `solve` and `run` (the same
    entry point), its `SIGNATURE`, its `FORM`, and `build(archs)` for the compile gate."""
    source = path.read_text()
    params = cuda_c.solve_signature(source, path.name)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.SIGNATURE = params
    module.FORM = cuda_c.timed_form(source, path.name)  # SYNCHRONISING (timed eagerly) or STREAM
    module.solve = module.run = _Solve(path, params, module.FORM, name)
    module.build = lambda archs: build(path, archs, shown=path.name)
    return module
