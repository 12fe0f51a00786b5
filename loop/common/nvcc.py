"""The CUDA C compiler: which nvcc builds a `.cu` target, its version, and the architectures it can
target (read by the worker's build and by `tileloop doctor`).

The pip wheels' nvcc comes first (`pip install -e '.[cuda]'`: nvidia-cuda-nvcc and its companions put
it under site-packages/nvidia/cu13/bin), then the one on PATH. Found without importing anything of
CUDA (the wheels' namespace package is located, not imported).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "pip install -e '.[cuda]'"


@dataclass(frozen=True)
class Toolchain:
    """An nvcc found: its path, its release (e.g. "13.5"), its full version line, the machine code it emits."""

    path: str
    release: str
    version: str
    archs: tuple[str, ...]
    source: str  # "pip" (the wheels) or "PATH"

    def to_json(self) -> dict:
        return {"nvcc": self.path, "release": self.release, "version": self.version, "archs": list(self.archs),
                "source": self.source}


def _wheel_nvcc() -> Path | None:
    """nvcc from the nvidia-cuda-nvcc wheel (nvidia/cu*/bin/nvcc), the newest CUDA major first."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = [p for root in spec.submodule_search_locations for p in Path(root).glob("cu*/bin/nvcc") if p.is_file()]
    return max(found, key=lambda p: p.parent.parent.name) if found else None


def find_nvcc() -> tuple[str, str] | None:
    """(path, where from: "pip" or "PATH") of the nvcc to use, or None."""
    wheel = _wheel_nvcc()
    if wheel is not None:
        return str(wheel), "pip"
    on_path = shutil.which("nvcc")
    return (on_path, "PATH") if on_path else None


def _output(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def toolchain() -> Toolchain | None:
    """The nvcc to use, with its version and the sm_XX codes it emits; None where none is found
    (`why_none` says what to install)."""
    found = find_nvcc()
    if found is None:
        return None
    path, source = found
    text = _output([path, "--version"])
    m = re.search(r"release (\d+\.\d+), (V[\d.]+)", text)
    if m is None:
        return None
    archs = tuple(a for a in _output([path, "--list-gpu-code"]).split() if a.startswith("sm_"))
    return Toolchain(path, m.group(1), m.group(2), archs, source)


def why_none() -> str:
    """Why no CUDA C build can run here, with the install that brings one."""
    return f"no nvcc found (neither the pip wheels' nor one on PATH): {INSTALL_HINT}"
