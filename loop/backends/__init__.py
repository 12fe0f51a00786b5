"""Backends: the ways a target is compiled and run, as a small interface plus a name registry.

| name          | language | device | how                                             |
|---------------|----------|--------|-------------------------------------------------|
| `ptx`         | triton   | cuda   | stock Triton, ENABLE_TILE=0                     |
| `tileir`      | triton   | cuda   | nvtriton with ENABLE_TILE=1 (Blackwell, sm_100+) |
| `cutile`      | cutile   | cuda   | cuda.tile + tileiras                            |
| `interpreter` | triton   | cpu    | TRITON_INTERPRET=1 (timings are CPU interpreter timings, never GPU numbers) |

Availability is decided from a worker probe (`loop.worker --probe`), never by importing kernel
code here. Each worker proves that its backend really ran (see `loop.worker.proof.backend_proof`);
a fallback (e.g. nvtriton silently compiling through PTX) is recorded as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from loop.common.errors import UserError


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""

    def to_json(self) -> dict:
        return {"available": self.available, "reason": self.reason}


@dataclass(frozen=True)
class Backend:
    name: str
    language: str
    device: str  # "cuda" or "cpu"
    env: tuple[tuple[str, str], ...]
    unset: tuple[str, ...]
    check: Callable[[dict], Availability]  # probe -> availability
    timing_label: str  # what its numbers are: "gpu" or "interpreter"

    def environment(self, tile_env: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        if self.name == "tileir":
            for key in ("TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ"):
                env[key] = (tile_env or {}).get(key, "0")
        return env


def tileiras_environment(env: dict) -> list[str]:
    """cuda-tile runs tileiras with CUDA_HOME passed through when tileiras comes from PATH; a
    CUDA_HOME that points at an older toolkit (its libnvvm) then breaks Tile IR compilation.
    Drop CUDA_HOME/CUDA_PATH unless the tileiras in use lives under CUDA_HOME. Returns notes."""
    import shutil

    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    tileiras = shutil.which("tileiras", path=env.get("PATH"))
    under = tileiras and home and os.path.commonpath([os.path.realpath(tileiras), os.path.realpath(home)]) == os.path.realpath(home)
    if home and tileiras and not under:
        env.pop("CUDA_HOME", None)
        env.pop("CUDA_PATH", None)
        return [f"CUDA_HOME={home} unset for the worker: tileiras comes from {tileiras}"]
    return []


def _cuda_ok(probe: dict) -> Availability | None:
    if not probe.get("cuda_available"):
        return Availability(False, probe.get("cuda_reason") or "no CUDA device visible")
    return None


def _check_ptx(probe: dict) -> Availability:
    if (bad := _cuda_ok(probe)) is not None:
        return bad
    if not probe.get("triton_version"):
        return Availability(False, "triton is not importable")
    return Availability(True)


def _check_tileir(probe: dict) -> Availability:
    if (bad := _cuda_ok(probe)) is not None:
        return bad
    if not probe.get("nvtriton"):
        return Availability(False, "nvtriton not installed (triton.backends.tileir is not importable)")
    major = (probe.get("capability") or [0, 0])[0]
    if major < 10:
        cap = ".".join(map(str, probe.get("capability") or []))
        return Availability(False, f"Tile IR through nvtriton needs Blackwell (sm_100+); this GPU is sm_{cap.replace('.', '')}")
    return Availability(True)


def _check_cutile(probe: dict) -> Availability:
    if (bad := _cuda_ok(probe)) is not None:
        return bad
    if not probe.get("cutile_version"):
        return Availability(False, "cuda-tile not installed (pip install cuda-tile[tileiras])")
    if not probe.get("tileiras"):
        return Availability(False, "tileiras not found on PATH (pip install cuda-tile[tileiras])")
    return Availability(True)


def _check_interpreter(probe: dict) -> Availability:
    if not probe.get("triton_version"):
        return Availability(False, "triton is not importable")
    return Availability(True)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("ptx", "triton", "cuda", (("ENABLE_TILE", "0"),),
                ("TRITON_INTERPRET", "TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ"), _check_ptx, "gpu"),
        # Tile IR keeps approx and FTZ off by default; a run that wants them sets them explicitly
        # (they are recorded in the environment fingerprint), never inherited by accident.
        Backend("tileir", "triton", "cuda", (("ENABLE_TILE", "1"),), ("TRITON_INTERPRET",), _check_tileir, "gpu"),
        Backend("cutile", "cutile", "cuda", (), ("TRITON_INTERPRET",), _check_cutile, "gpu"),
        Backend("interpreter", "triton", "cpu", (("TRITON_INTERPRET", "1"), ("ENABLE_TILE", "0")), (), _check_interpreter, "interpreter"),
    )
}


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
