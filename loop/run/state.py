"""A run's persistent state: `sandbox/<run>/state.json`, rewritten atomically at every stage.

The state names the in-flight iteration and its stage (sweep, apply, commit, measure, decide,
record), so that `tileloop resume` after a kill at any point can finish or record it exactly once;
a sweep (`loop.run.sweep`) runs before anything is applied, so a kill there records nothing.

state.json keeps only what `results.jsonl` cannot give: the run's settings, the in-flight marker, the
stop, the seal, and two lists of candidate keys no record names (`seen`, `cut`). Everything the
records say (the best commit and its latency, the last iteration, the outcomes, verdicts, crash
causes, the keys tried or cut off, the kinds demoted, the time spent) is `derive`d from them when
the state is loaded, so that a state and its records never disagree.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.messages import Inflight
from loop.records.results import Record, read_records

STATE_SCHEMA = "tileloop.state/2"
OLD_SCHEMAS = ("tileloop.state/1",)  # read (their derivable fields ignored), written as STATE_SCHEMA
CUT_VERDICTS = ("void", "interrupted")  # a key decided so says nothing of its candidate: tried again once
SANDBOX = "sandbox"
FINGERPRINT_KEYS = ("gpu", "capability", "driver", "cuda_runtime", "torch_version", "triton_version",
                    "cutile_version", "nvtriton")
# the toolchain that builds that language's kernels (TileLang lowers through its own TVM, then nvcc)
LANGUAGE_FINGERPRINT_KEYS = {"cuda": ("nvcc_version", "nvcc_flags"), "tilelang": ("tilelang_version", "nvcc_version")}


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
    # derived from results.jsonl (`derive`) when the state is loaded, kept current in memory; never written
    best_commit: str = ""
    best_latency_ms: float | None = None
    last_iteration: int = -1  # -1 before the baseline is recorded
    outcomes: list[str] = field(default_factory=list)  # keep | revert | crash per iteration >= 1
    verdicts: list[str] = field(default_factory=list)
    crash_causes: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)  # recipe kinds kept at low gain
    tried: list[str] = field(default_factory=list)  # candidate keys already evaluated
    interrupted: list[str] = field(default_factory=list)  # candidate (or sweep) keys cut off once by a kill (retried once)
    active_s: float = 0.0  # time spent in iterations, summed over sessions
    # written: what no record names
    seen: list[str] = field(default_factory=list)  # keys tried that no record names: the kept versions' own values
    cut: list[str] = field(default_factory=list)  # sweep keys a kill cut off before they chose (no record), one per kill
    skip_recipes: list[str] = field(default_factory=list)  # recipe ids this run never proposes (--skip-recipe)
    inflight: Inflight | None = None
    stopped: dict | None = None
    created: str = ""
    schema: str = STATE_SCHEMA
    # the records as tileloop last wrote them (`Run.seal`): results.jsonl and perf_results.md
    # ({bytes, sha256}), the best commit, the snapshot of the git files; "state" hashes the rest of this file
    records_seal: dict = field(default_factory=dict)

    def fingerprint(self) -> dict:
        return {k: self.env.get(k) for k in fingerprint_keys(self.language)}


@dataclass(frozen=True)
class Tally:
    """What a run's records say of it: the best version, the last iteration, what the stop rules and the
    proposers count. `derive` computes it from results.jsonl; state.json never holds it."""

    best_commit: str = ""  # the last kept record's commit ("" before the baseline)
    best_latency_ms: float | None = None
    last_iteration: int = -1  # -1 before the baseline is recorded
    outcomes: tuple[str, ...] = ()  # keep | revert | crash | unmeasured per iteration >= 1
    verdicts: tuple[str, ...] = ()
    crash_causes: tuple[str, ...] = ()
    demoted: tuple[str, ...] = ()  # recipe kinds kept at low gain
    tried: tuple[str, ...] = ()  # candidate keys already evaluated (a run's `seen` first)
    interrupted: tuple[str, ...] = ()  # keys cut off once (a kill, a void measurement): tried again once
    active_s: float = 0.0  # time spent in iterations, summed over sessions


DERIVED = tuple(f.name for f in fields(Tally))  # RunState's fields that results.jsonl gives (`derive`)


def cut_off(tally: Tally, key: str) -> Tally:
    """`key` cut off (a kill, a void measurement): the first time it is tried again, then it counts as tried."""
    if key in tally.interrupted:
        return replace(tally, tried=tally.tried + (key,))
    return replace(tally, interrupted=tally.interrupted + (key,))


def counted(tally: Tally, record: Record) -> Tally:
    """An experiment's decision counted (before its record is written, the stop rules read it): its
    outcome, verdict and crash cause; its key tried (or cut off once); its sweep's values tried (not
    an interrupted sweep's); its kind demoted when it was kept at a low gain."""
    verdict = str(record.verdict)
    t = replace(tally, outcomes=tally.outcomes + (record.status,), verdicts=tally.verdicts + (verdict,),
                crash_causes=tally.crash_causes + ((verdict,) if record.status == "crash" else ()))
    key = record.recipe  # an experiment's candidate key (a sweep's: the sweep's); None for an agent's edit
    if key and verdict in CUT_VERDICTS:
        t = cut_off(t, key)
    elif key:
        t = replace(t, tried=t.tried + (key,))
    if record.sweep and verdict != "interrupted":  # every value a sweep measured is tried
        values = [v["key"] for v in record.sweep.get("values", [])]
        t = replace(t, tried=t.tried + tuple(k for i, k in enumerate(values) if k not in t.tried and k not in values[:i]))
    if record.status == "keep" and key and record.decision is not None and record.decision.priority == "low":
        t = replace(t, demoted=t.demoted + (key.split("=")[0],))
    return t


def finished(tally: Tally, record: Record) -> Tally:
    """A record written: the last iteration, the time spent, and the best version if it was kept."""
    t = replace(tally, last_iteration=record.iteration, active_s=tally.active_s + record.wall_s)
    return replace(t, best_commit=record.commit or "", best_latency_ms=record.latency_ms) if record.status == "keep" else t


def derive(records: Iterable[Record], seen: Iterable[str] = (), cut: Iterable[str] = ()) -> Tally:
    """The tally of a run from its records, with the keys no record names: `seen` (tried), `cut` (sweeps
    a kill cut off, one per kill)."""
    t = Tally(tried=tuple(dict.fromkeys(seen)))
    for key in cut:
        t = cut_off(t, key)
    for r in records:
        t = finished(counted(t, r) if r.iteration >= 1 else t, r)
    return t


def tally_of(state: RunState) -> Tally:
    """The state's derived fields as they are in memory."""
    return Tally(**{name: tuple(value) if isinstance(value, list) else value
                    for name, value in ((name, getattr(state, name)) for name in DERIVED)})


def as_fields(tally: Tally) -> dict:
    """The tally as the state's fields hold it (lists, as the proposers extend them)."""
    return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(tally).items()}


def settle(state: RunState, tally: Tally) -> None:
    """The state's derived fields set from `tally`."""
    for name, value in as_fields(tally).items():
        setattr(state, name, value)


def recount(state: RunState, records: list[Record]) -> None:
    """The state's derived fields computed again from the run's records: what is in memory is what a load gives."""
    settle(state, derive(records, state.seen, state.cut))


def run_dir(root: Path, run_id: str) -> Path:
    return root / SANDBOX / run_id


def state_path(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "state.json"


def results_path(root: Path, run_id: str) -> Path:
    return run_dir(root, run_id) / "results.jsonl"


def readable_records(path: Path) -> list[Record]:
    """The run's records for its tally: all of them, or those before a line that cannot be read (a
    rewrite that the seal check refuses with its own message, `Run.check_records`)."""
    try:
        return read_records(path)
    except (ValueError, TypeError, KeyError, AttributeError):
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, TypeError, KeyError, AttributeError):
                break
        return out


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
    """The state as state.json holds it: none of its derived fields, the in-flight marker as
    `Inflight.to_json` writes it."""
    data = {k: v for k, v in asdict(state).items() if k not in DERIVED}
    return {**data, "inflight": state.inflight.to_json() if state.inflight else None}


def from_json(data: dict, records: list[Record]) -> RunState:
    """The state from state.json's content and the run's records. A state written before the derived
    fields were left out keeps what its records do not say: its tried keys as `seen`, its interrupted
    ones as `cut`; the rest of what it holds is ignored (the records say it)."""
    names = {f.name for f in fields(RunState)} - set(DERIVED)
    state = RunState(**{k: v for k, v in data.items() if k in names})
    state.seen, state.cut = unrecorded(data, records)
    state.schema = STATE_SCHEMA
    if state.inflight:
        state.inflight = Inflight.from_json(state.inflight)
    recount(state, records)
    return state


def unrecorded(data: dict, records: list[Record]) -> tuple[list[str], list[str]]:
    """The keys state.json holds that no record names (`seen`, `cut`); from a state written before they
    were kept apart, its tried and interrupted keys that its records do not give."""
    if data.get("schema") not in OLD_SCHEMAS:
        return list(data.get("seen") or []), list(data.get("cut") or [])
    base = derive(records)
    return ([k for k in dict.fromkeys(data.get("tried") or []) if k not in base.tried],
            [k for k in dict.fromkeys(data.get("interrupted") or []) if k not in base.interrupted])


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
    """The run's state: state.json's content, its derived fields from results.jsonl."""
    path = state_path(root, run_id)
    if not path.exists():
        raise UserError(f"no run {run_id!r} in {root / SANDBOX}", hint="tileloop status lists runs; tileloop init starts one")
    data = json.loads(path.read_text())
    if data.get("schema") not in (STATE_SCHEMA, *OLD_SCHEMAS):
        raise UserError(f"run {run_id} has state schema {data.get('schema')!r}, this tileloop reads {STATE_SCHEMA}")
    return from_json(data, readable_records(results_path(root, run_id)))


def view(root: Path, run_id: str) -> dict | None:
    """The run's state as a plain dict (state.json's content with the derived fields from results.jsonl),
    for readers that look at a run without opening it (the suite); None when there is no state.json."""
    path = state_path(root, run_id)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    records = readable_records(results_path(root, run_id))
    return {**data, **as_fields(derive(records, *unrecorded(data, records)))}


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
