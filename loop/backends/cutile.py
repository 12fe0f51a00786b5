"""`cutile`: cuTile kernels (`cuda.tile`) compiled by tileiras (CUDA 13.4 Tile IR), on a CUDA GPU."""

from __future__ import annotations

import os
import shutil

from loop.backends.base import Availability, Backend, cuda_missing


def check(probe: dict) -> Availability:
    if (bad := cuda_missing(probe)) is not None:
        return bad
    if not probe.get("cutile_version"):
        return Availability(False, "cuda-tile not installed (pip install cuda-tile[tileiras])")
    if not probe.get("tileiras"):
        return Availability(False, "tileiras not found on PATH (pip install cuda-tile[tileiras])")
    return Availability(True)


def tileiras_environment(env: dict) -> list[str]:
    """cuda-tile runs tileiras with CUDA_HOME passed through when tileiras comes from PATH; a
    CUDA_HOME that points at an older toolkit (its libnvvm) then breaks Tile IR compilation.
    Drop CUDA_HOME/CUDA_PATH unless the tileiras in use lives under CUDA_HOME. Returns notes."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    tileiras = shutil.which("tileiras", path=env.get("PATH"))
    under = tileiras and home and os.path.commonpath([os.path.realpath(tileiras), os.path.realpath(home)]) == os.path.realpath(home)
    if home and tileiras and not under:
        env.pop("CUDA_HOME", None)
        env.pop("CUDA_PATH", None)
        return [f"CUDA_HOME={home} unset for the worker: tileiras comes from {tileiras}"]
    return []



CUTILE = Backend("cutile", "cutile", "cuda", (), ("TRITON_INTERPRET",), check, "gpu")
