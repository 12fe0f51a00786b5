"""Backends: the ways a target is compiled and run, one module each, and their name registry.

| name          | language | device | how                                                         |
|---------------|----------|--------|-------------------------------------------------------------|
| `ptx`         | triton   | cuda   | stock Triton, ENABLE_TILE=0 (`ptx.py`)                      |
| `tileir`      | triton   | cuda   | nvtriton with ENABLE_TILE=1, Blackwell sm_100+ (`tileir.py`) |
| `cutile`      | cutile   | cuda   | cuda.tile + tileiras (`cutile.py`)                          |
| `interpreter` | triton   | cpu    | TRITON_INTERPRET=1, interpreter timings (`interpreter.py`)  |
| `nvcc`        | cuda     | cuda   | CUDA C built by nvcc, called through ctypes (`nvcc.py`)     |
| `tilelang`    | tilelang | cuda   | TileLang's JIT (its TVM, then nvcc) (`tilelang.py`)         |

Availability is decided from a worker probe (`python -m loop.worker --probe`), never by importing
kernel code here. Each worker proves that its backend really ran (`loop.worker.proof`); a fallback
(e.g. nvtriton silently compiling through PTX) is recorded as such. Which backends time a language,
and which decides by default, is the language's entry (`loop.common.language`). A new backend is a
module here with its `Backend` and availability check, an entry in BACKENDS, its name in its
language's entry, and its proof in `loop.worker.proof`.
"""

from __future__ import annotations

from loop.backends.base import Availability, Backend
from loop.backends.cutile import CUTILE, tileiras_environment
from loop.backends.interpreter import INTERPRETER
from loop.backends.nvcc import NVCC
from loop.backends.ptx import PTX
from loop.backends.tileir import TILEIR
from loop.backends.tilelang import TILELANG
from loop.common.errors import UserError
from loop.common.language import get_language, runs_on

__all__ = ["Availability", "Backend", "BACKENDS", "applicable", "availability", "choose", "default_target",
           "for_language", "get", "gpu_backends", "tileiras_environment"]

BACKENDS: dict[str, Backend] = {b.name: b for b in (PTX, TILEIR, CUTILE, INTERPRETER, NVCC, TILELANG)}


def get(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}") from None


def for_language(language: str, device: str) -> list[Backend]:
    """Every backend a run of this language on this device reports on, in display order (the
    language's entry)."""
    return [BACKENDS[n] for n in get_language(language).backends.get(device, ())]


def gpu_backends() -> list[str]:
    """The names of the backends that run on a CUDA GPU, in registry order."""
    return [name for name, backend in BACKENDS.items() if backend.device == "cuda"]


def availability(backend: Backend, probe: dict, device: str) -> Availability:
    if backend.device != device:
        if device == "cpu":
            return Availability(False, "--device cpu")
        return Availability(False, "interpreter backend is only used with --device cpu")
    return backend.check(probe)


def default_target(language: str, device: str, avail: dict[str, Availability]) -> str:
    """The language's preferred backend on this device: the first of its entry's `preferred` that is
    available, else the last; UserError where the language cannot run on the device."""
    entry = get_language(language)
    preferred = entry.preferred.get(device)
    if not preferred:
        raise UserError(f"--device {device} runs {' and '.join(runs_on(device))} targets only "
                        f"({entry.unsupported.get(device, f'{entry.title} does not run there')})")
    return next((n for n in preferred if avail.get(n, Availability(False)).available), preferred[-1])


def applicable(language: str, device: str, requested: str | None) -> list[str]:
    """The backends a run of this language on this device reports on; UserError when `requested`
    (--target-backend) is not one of them. Checked before a probe is spent."""
    names = [b.name for b in for_language(language, device)]
    if requested is not None and requested not in names:
        raise UserError(f"--target-backend {requested} does not apply to a {language} target with "
                        f"--device {device}; valid: {', '.join(names)}")
    return names


def choose(language: str, device: str, probe: dict, requested: str | None) -> tuple[dict[str, Availability], str]:
    """Each applicable backend's availability on this machine, and the target backend (the one whose
    latency decides): the one asked for, else the default; UserError when it is unavailable."""
    names = applicable(language, device, requested)
    avail = {n: availability(BACKENDS[n], probe, device) for n in names}
    chosen = requested or default_target(language, device, avail)
    if not avail[chosen].available:
        raise UserError(f"target backend {chosen} is unavailable: {avail[chosen].reason}")
    return avail, chosen
