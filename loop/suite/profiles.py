"""Why a tuned op misses a target, in Nsight Compute's words: after a suite run's final measurement
on a GPU, a best version that misses one of the unattended targets (`loop.suite.unattended`) is
profiled by `tileloop profile` at the shape and dtype where the clone target is judged (the final
measurement's largest), on the backend the run tuned it on. Its bottleneck class, cause and the
metrics behind them go into the suite entry (`profile`), and the results page quotes them as the
first words of that row's "why".

A profile that cannot be made (no ncu, no permission to read the counters, the kernel failing
under replay, the time limit) is kept as what it is, with ncu's or tileloop's own reason: the page
says "no profile: <why>", never a class it did not measure."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

PROFILE_S = 300.0  # ncu replays every profiled launch once per pass of its metrics: minutes at the largest shapes
# ncu's metrics quoted on the page, by their short names (loop.tools.ncu.METRICS), in this order
QUOTED = (("memory_pct", "memory"), ("dram_pct", "DRAM"), ("compute_pct", "SM"),
          ("achieved_occupancy_pct", "occupancy"), ("tensor_pipe_pct", "tensor pipe"))


def command(target: str, run_id: str, largest: dict | None, backend: str | None) -> list[str]:
    """`tileloop profile` of `target`'s best version in run `run_id` (its stored profile is the
    run's), at `largest`'s shape and dtype (the final measurement's largest row) on `backend`."""
    cmd = [sys.executable, "-m", "loop", "profile", target, "--run", run_id, "--json"]
    if largest and largest.get("shape"):
        cmd += ["--shape", str(largest["shape"])]  # as the final measurement writes it: 4096x8192
    if largest and largest.get("dtype"):
        cmd += ["--dtype", str(largest["dtype"])]
    if backend:
        cmd += ["--backend", backend]
    return cmd


def profile_best(run_root: Path, target: str, entry: dict, env: dict, popen, done, timeout_s: float = PROFILE_S) -> dict:
    """Run `command` in `run_root` (`popen`/`done`: the suite's `Children`, so that a killed suite
    takes it down) and return what the entry keeps of it (`kept`)."""
    cmd = command(target, entry["run"], entry.get("final_largest"), entry.get("target_backend"))
    started = time.monotonic()
    proc = popen(cmd, cwd=run_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        got = _printed(*proc.communicate(timeout=timeout_s), proc.returncode)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        got = {"status": "timeout", "error": f"tileloop profile ran past {timeout_s:.0f} s"}
    finally:
        done(proc)
    return {**got, "command": cmd, "wall_s": round(time.monotonic() - started, 1)}


def _printed(out: str, err: str, returncode: int | None) -> dict:
    """What the entry keeps of what `tileloop profile --json` printed (`kept`), or why it printed no payload."""
    try:
        payload = json.loads(out) if out.strip() else None
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        return kept(payload)
    tail = (err or out or "").strip().splitlines()[-1:] or [f"exit {returncode}, no output"]
    return {"status": "error", "error": f"tileloop profile: {tail[0][:300]}"}


def kept(payload: dict) -> dict:
    """What an entry keeps of a profile's payload (`loop.tools.profile.run`): where it was taken,
    and either the bottleneck of its longest kernel with that kernel's metrics, or why there is none."""
    out = {k: payload.get(k) for k in ("status", "shape", "dtype", "backend", "gpu", "ncu_version", "stored")}
    bottleneck = payload.get("bottleneck")
    if payload.get("status") != "ok" or not bottleneck:
        return {**out, "status": payload.get("status") or "error", "error": payload.get("error") or "no bottleneck given"}
    return {**out, "kernel": bottleneck.get("kernel"), "class": bottleneck.get("class"), "cause": bottleneck.get("cause"),
            "reasons": list(bottleneck.get("reasons") or []),
            "metrics": {k: v for k, v in (bottleneck.get("evidence") or {}).items() if isinstance(v, (int, float))}}


def note(profile: dict | None) -> str | None:
    """The page's words for an entry's `profile`: None without one."""
    if not profile:
        return None
    if profile.get("status") != "ok":
        return f"no profile: {profile.get('status')}: {str(profile.get('error') or '')[:200]}"
    where = " ".join(str(x) for x in (profile.get("shape"), profile.get("dtype")) if x)
    metrics = profile.get("metrics") or {}
    quoted = ", ".join(f"{label} {metrics[k]:.0f}%" for k, label in QUOTED if isinstance(metrics.get(k), (int, float)))
    head = f"ncu{' at ' + where if where else ''}: {profile.get('class')}" + (f" ({profile['cause']})" if profile.get("cause") else "")
    reasons = [r for r in profile.get("reasons") or [] if r]
    return head + (f" [{quoted}]" if quoted else "") + (": " + "; ".join(reasons) if reasons else "")
