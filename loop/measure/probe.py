"""The environment probe: a worker (`python -m loop.worker --probe`) reports the GPU, driver,
versions and tools of this machine; the orchestrator never imports torch or triton to find out."""

from __future__ import annotations

from pathlib import Path

from loop.common.errors import UserError
from loop.common.settings import Settings
from loop.measure.launch import run_worker
from loop.common.files import scratch


def probe_environment(root: Path, settings: Settings) -> dict:
    with scratch("probe") as tmp:
        workdir = Path(tmp)
        result = run_worker(workdir, None, None, settings, workdir / "triton-cache", timeout_s=300, name="probe")
    if result.get("status") != "ok":
        raise UserError(f"environment probe failed: {result.get('message')}", hint=(result.get("log_tail") or "")[-300:])
    return result["probe"]
