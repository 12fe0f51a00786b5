"""A run's persistent state: `sandbox/<run>/state.json`, rewritten atomically at every stage.

The state names the in-flight iteration and its stage (sweep, apply, commit, measure, decide,
record), so that `tileloop resume` after a kill at any point can finish or record it exactly once;
a sweep (`loop.run.sweep`) runs before anything is applied, so a kill there records nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.messages import Inflight

STATE_SCHEMA = "tileloop.state/1"
SANDBOX = "sandbox"
FINGERPRINT_KEYS = ("gpu", "capability", "driver", "cuda_runtime", "torch_version", "triton_version",
                    "cutile_version", "nvtriton")
LANGUAGE_FINGERPRINT_KEYS = {"cuda": ("nvcc_version", "nvcc_flags")}  # the toolchain that builds that language's kernels


def fingerprint_keys(language: str) -> tuple[str, ...]:
    """The environment keys a run's timings depend on: every run's, and its language's toolchain."""
    return FINGERPRINT_KEYS + LANGUAGE_FINGERPRINT_KEYS.get(language, ())


@dataclass
class RunState:
    run_id: str
    branch: str
    origin_branch: str | None
    target: str  # relative to the repository root
    spec: str
    language: str
    op: str
    device: str
    target_backend: str
    backends: list[str]  # reported on every iteration, in display order
    availability: dict[str, dict]  # name -> {"available": bool, "reason": str}
    base_commit: str  # where the branch started
    seed: int
    env: dict  # environment fingerprint from the worker probe
    untracked_at_start: list[str]
    policy: dict
    archs: list[str] = field(default_factory=lambda: ["sm_90", "sm_100"])  # ahead-of-time compile gate
    mode: str = "agent"  # agent (step) | run (unattended)
    worker_timeout_s: float = 600.0  # hard limit per worker process (compile, each backend)
    harness: dict | None = None  # external run: {test_cmd, bench_cmd, bench_repeats} (loop.external), else None
    best_commit: str = ""
    best_latency_ms: float | None = None
    last_iteration: int = -1  # -1 before the baseline is recorded
    outcomes: list[str] = field(default_factory=list)  # keep | revert | crash per iteration >= 1
    verdicts: list[str] = field(default_factory=list)
    crash_causes: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)  # recipe kinds kept at low gain
    tried: list[str] = field(default_factory=list)  # candidate keys already evaluated
    interrupted: list[str] = field(default_factory=list)  # candidate (or sweep) keys cut off once by a kill (retried once)
    skip_recipes: list[str] = field(default_factory=list)  # recipe ids this run never proposes (--skip-recipe)
    active_s: float = 0.0  # time spent in iterations, summed over sessions
    inflight: Inflight | None = None
    stopped: dict | None = None
    created: str = ""
    schema: str = STATE_SCHEMA
    # the records as tileloop last wrote them (`Run.seal`): results.jsonl and perf_results.md
    # ({bytes, sha256}), the best commit, the snapshot of the git files; "state" hashes the rest of this file
    records_seal: dict = field(default_factory=dict)

    def fingerprint(self) -> dict:
        return {k: self.env.get(k) for k in fingerprint_keys(self.language)}


def run_dir(root: Path, run_id: str) -> Path:
    return root / SANDBOX / run_id


def state_path(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "state.json"


def content_digest(data: dict) -> str:
    """The hash of a state's content, less the hash itself (kept in records_seal["state"])."""
    seal = {k: v for k, v in (data.get("records_seal") or {}).items() if k != "state"}
    rest = {k: v for k, v in data.items() if k != "records_seal"}
    return hashlib.sha256(json.dumps([rest, seal], sort_keys=True).encode()).hexdigest()


def save(root: Path, state: RunState) -> str:
    """Write state.json with the hash of its own content; return the text written."""
    data = to_json(state)
    data["records_seal"] = state.records_seal = {**state.records_seal, "state": content_digest(data)}
    text = json.dumps(data, indent=1, sort_keys=True)
    atomic_write_text(state_path(root, state.run_id), text)
    return text


def to_json(state: RunState) -> dict:
    """The state as state.json holds it (the in-flight marker as `Inflight.to_json` writes it)."""
    return {**asdict(state), "inflight": state.inflight.to_json() if state.inflight else None}


def intact(root: Path, run_id: str) -> bool:
    """Whether state.json is as tileloop wrote it (its content matches its own hash); a state written
    before the hash was kept, or none yet, counts as intact."""
    path = state_path(root, run_id)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return not path.exists()
    if not isinstance(data, dict):
        return False
    seal = data.get("records_seal", {})
    return "records_seal" not in data or (isinstance(seal, dict) and seal.get("state") == content_digest(data))


def load(root: Path, run_id: str) -> RunState:
    path = state_path(root, run_id)
    if not path.exists():
        raise UserError(f"no run {run_id!r} in {root / SANDBOX}", hint="tileloop status lists runs; tileloop init starts one")
    data = json.loads(path.read_text())
    if data.get("schema") != STATE_SCHEMA:
        raise UserError(f"run {run_id} has state schema {data.get('schema')!r}, this tileloop reads {STATE_SCHEMA}")
    names = {f.name for f in fields(RunState)}
    state = RunState(**{k: v for k, v in data.items() if k in names})
    return replace(state, inflight=Inflight.from_json(state.inflight)) if state.inflight else state


def set_current(root: Path, run_id: str) -> None:
    atomic_write_text(root / SANDBOX / "CURRENT", run_id + "\n")


def current(root: Path, run_id: str | None) -> str:
    if run_id:
        return run_id
    path = root / SANDBOX / "CURRENT"
    if not path.exists():
        raise UserError("no tileloop run in this repository", hint="start one with: tileloop init <target>")
    return path.read_text().strip()


def current_or_none(root: Path) -> str | None:
    """The current run's id, or None when there is none (or the one named has no state)."""
    path = root / SANDBOX / "CURRENT"
    rid = path.read_text().strip() if path.exists() else ""
    return rid if rid and state_path(root, rid).exists() else None


def list_runs(root: Path) -> list[str]:
    base = root / SANDBOX
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "state.json").exists())
