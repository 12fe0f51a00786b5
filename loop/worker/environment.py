"""What this machine has: the environment probe (GPU, driver, versions, tileiras and the
architectures it accepts, nvcc and the flags and architectures of CUDA C builds, whether TileLang
imports and its version, ncu) and the health
round trip. Safe without a GPU."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from loop.worker.cuda_build import fingerprint as cuda_c_fingerprint
from loop.worker.failures import load_module
from loop.common import tilelang_install
from loop.common.files import scratch

# A kernel that loops to a runtime bound: the construct the Triton 3.6 interpreter fails on under
# numpy >= 2.4 ("only 0-dimensional arrays can be converted to Python scalars").
INTERPRETER_PROBE = """import triton
import triton.language as tl


@triton.jit
def row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))
"""


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def probe() -> dict:
    """Environment fingerprint and backend facts; safe on a machine without a GPU."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": None, "triton_version": None, "cutile_version": _version("cuda-tile"),
        "numpy_version": _version("numpy"),
        "cuda_available": False, "cuda_reason": None, "gpu": None, "capability": None,
        "driver": None, "cuda_runtime": None, "sm_count": None, "l2_mb": None,
        "clocks": None, "nvtriton": False,
        "tile_env": {k: os.environ[k] for k in ("ENABLE_TILE", "TILEIR_ENABLE_APPROX", "TILEIR_ENABLE_FTZ") if k in os.environ},
    }
    try:
        import torch

        info["torch_version"] = torch.__version__
        info["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(cuda_available=True, gpu=props.name, capability=list(torch.cuda.get_device_capability(0)),
                        sm_count=props.multi_processor_count,
                        l2_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        else:
            info["cuda_reason"] = "no CUDA device visible to torch" if torch.version.cuda else "torch is a CPU-only build"
    except ImportError as exc:
        info["cuda_reason"] = f"torch not importable: {exc}"
    try:
        import triton

        info["triton_version"] = triton.__version__
        info["nvtriton"] = importlib.util.find_spec("triton.backends.tileir") is not None
    except ImportError:
        pass
    info.update(_tileiras_facts())
    tilelang = tilelang_install.status()  # found without importing it (an import takes seconds)
    info.update(tilelang_version=tilelang["version"], tilelang_importable=tilelang["importable"],
                tilelang_reason=tilelang["reason"])
    info.update(cuda_c_fingerprint(info["capability"]))  # nvcc's version, the flags and architectures of CUDA C builds
    info["ncu"] = shutil.which("ncu")
    if info["ncu"]:
        info["ncu_version"] = _first_line([info["ncu"], "--version"], last=True)
    if info["cuda_available"] and info["triton_version"]:
        try:  # which backend Triton's active driver compiles for (nvtriton with ENABLE_TILE=1 says tileir)
            from triton.runtime import driver

            target = driver.active.get_current_target()
            info["triton_active_target"] = str(getattr(target, "backend", target))
        except Exception as exc:  # report, do not fail the probe: doctor shows it
            info["triton_active_target"] = f"error: {type(exc).__name__}: {exc}"[:200]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                fields = [f.strip() for f in out[0].split(",")]
                info["driver"] = fields[0]
                info["clocks"] = {"max_sm_mhz": fields[1], "max_mem_mhz": fields[2], "sm_mhz_now": fields[3], "power_limit_w": fields[4]}
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def health() -> dict:
    """Allocate, compute, copy back, synchronize: a wedged or lost GPU fails or hangs here."""
    import torch

    t0 = time.perf_counter()
    if not torch.cuda.is_available():
        return {"status": "runtime_error", "message": "no CUDA device visible"}
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    total = float((x * 2).sum().item())
    torch.cuda.synchronize()
    expected = float((1 << 20) * ((1 << 20) - 1))
    if total != expected:
        return {"status": "runtime_error", "message": f"GPU arithmetic check gave {total}, expected {expected}"}
    free, total_mem = torch.cuda.mem_get_info()
    return {"status": "ok", "seconds": round(time.perf_counter() - t0, 3), "free_mb": free // 2**20, "total_mb": total_mem // 2**20}


def _first_line(cmd: list[str], last: bool = False) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out[-1] if last else out[0]) if out else None


def _tileiras_facts() -> dict:
    """Which tileiras cuda-tile would use, its version, and the architectures it accepts."""
    path = None
    try:
        from cuda.tile._compile import (
            _find_compiler_bin,  # private, hence guarded: falls back to PATH
        )

        path = _find_compiler_bin().path
    except Exception:
        path = shutil.which("tileiras")
    facts: dict[str, Any] = {"tileiras": path, "tileiras_version": None, "tileiras_archs": []}
    if path:
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
            facts["tileiras_version"] = next((ln.strip() for ln in text.splitlines() if "release" in ln), text.strip()[-80:])
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            help_text = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30).stdout
            import re

            facts["tileiras_archs"] = sorted(set(re.findall(r"=(sm_\d+)\s", help_text)), key=lambda a: int(a[3:]))
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


def interpreter_check(job: dict) -> dict:
    """Run a small kernel with a loop to a runtime bound under the Triton interpreter (the worker runs
    with TRITON_INTERPRET=1) and check its sum: whether `--device cpu` can work on this machine."""
    import torch

    with scratch("interpreter") as tmp:
        path = Path(tmp) / "tileloop_interpreter_probe.py"
        path.write_text(INTERPRETER_PROBE)
        try:
            module = load_module("tileloop_interpreter_probe", path)
            x, out = torch.arange(1, 101, dtype=torch.float32), torch.zeros(1, dtype=torch.float32)
            module.row_sum[(1,)](x, out, 100, BLOCK=32)
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            return {"status": "ok", "interpreter": {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}}
    total = float(out.item())
    return {"status": "ok", "interpreter": {"ok": total == 5050.0, "error": None if total == 5050.0 else
                                            f"a loop to a runtime bound summed to {total}, not 5050"}}
