"""Backends: the ways a target is compiled and run, one module each, and their name registry.

| name          | language | device | how                                                         |
|---------------|----------|--------|-------------------------------------------------------------|
| `ptx`         | triton   | cuda   | stock Triton, ENABLE_TILE=0 (`ptx.py`)                      |
| `tileir`      | triton   | cuda   | nvtriton with ENABLE_TILE=1, Blackwell sm_100+ (`tileir.py`) |
| `cutile`      | cutile   | cuda   | cuda.tile + tileiras (`cutile.py`)                          |
| `interpreter` | triton   | cpu    | TRITON_INTERPRET=1, interpreter timings (`interpreter.py`)  |

Availability is decided from a worker probe (`python -m loop.worker --probe`), never by importing
kernel code here. Each worker proves that its backend really ran (`loop.worker.proof`); a fallback
(e.g. nvtriton silently compiling through PTX) is recorded as such. A new backend is a module
here with its `Backend` and availability check, an entry in BACKENDS and in `for_language`, and
its proof in `loop.worker.proof`.
"""

from __future__ import annotations

from loop.backends.base import Availability, Backend
from loop.backends.cutile import CUTILE, tileiras_environment
from loop.backends.interpreter import INTERPRETER
from loop.backends.ptx import PTX
from loop.backends.tileir import TILEIR
from loop.common.errors import UserError

__all__ = ["Availability", "Backend", "BACKENDS", "applicable", "availability", "choose", "default_target",
           "for_language", "get", "tileiras_environment"]

BACKENDS: dict[str, Backend] = {b.name: b for b in (PTX, TILEIR, CUTILE, INTERPRETER)}


def get(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}") from None


def for_language(language: str, device: str) -> list[Backend]:
    """Every backend a run of this language on this device reports on, in display order."""
    if device == "cpu":
        names = ["interpreter", "ptx", "tileir"] if language == "triton" else ["cutile"]
    else:
        names = ["ptx", "tileir"] if language == "triton" else ["cutile"]
    return [BACKENDS[n] for n in names]


def availability(backend: Backend, probe: dict, device: str) -> Availability:
    if backend.device != device:
        if device == "cpu":
            return Availability(False, "--device cpu")
        return Availability(False, "interpreter backend is only used with --device cpu")
    return backend.check(probe)


def default_target(language: str, device: str, avail: dict[str, Availability]) -> str:
    if device == "cpu":
        if language != "triton":
            raise UserError("--device cpu runs Triton targets only (cuTile has no CPU interpreter)")
        return "interpreter"
    if language == "cutile":
        return "cutile"
    return "tileir" if avail.get("tileir", Availability(False)).available else "ptx"


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
