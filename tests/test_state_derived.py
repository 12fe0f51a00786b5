"""state.json keeps what results.jsonl cannot give: the best commit, the last iteration, the outcomes,
verdicts, crash causes, the keys tried or cut off, the kinds demoted and the time spent are derived
from the records when a state is loaded (`state.derive`), so that a state and its records never
disagree; an older state.json that still holds them is read, what its records say winning."""

from __future__ import annotations

import json
from dataclasses import fields

from loop.common.messages import Decision
from loop.records.results import Record, append_record
from loop.run import state as st
from test_void import SPEC, run, step  # noqa: F401  (fixture)

RUN = "r"


def record(n: int, status: str, verdict: str, *, key: str | None = None, commit: str | None = None,
           latency_ms: float | None = None, wall_s: float = 1.0, priority: str = "normal",
           sweep: list[str] | None = None) -> Record:
    return Record(run=RUN, iteration=n, optimization=f"change {n}", status=status, correctness="PASS",
                  latency_ms=latency_ms, target_backend="interpreter", backends={}, commit=commit, parent=None,
                  recipe=key, decision=Decision(None if n == 0 else status, verdict, "why", priority=priority),
                  sweep={"values": [{"key": k} for k in sweep]} if sweep is not None else None, wall_s=wall_s)


RECORDS = [
    record(0, "keep", "baseline", commit="a" * 40, latency_ms=2.0, wall_s=1.5),
    record(1, "revert", "no_gain", key="k:x=1", commit="1" * 40, wall_s=2.0),
    record(2, "keep", "improved", key="k:y=sweep", commit="b" * 40, latency_ms=1.5, wall_s=3.0, priority="low",
           sweep=["k:y=2", "k:y=4"]),
    record(3, "crash", "interrupted", key="k:z=1", commit="3" * 40, wall_s=0.0, sweep=["k:z=8", "k:z=9"]),
    record(4, "crash", "compile_error", key="k:w=1", commit="4" * 40, wall_s=0.5),
    record(5, "unmeasured", "void", key="k:z=1", commit="5" * 40, wall_s=0.25),
]


def settings_only() -> st.RunState:
    return st.RunState(run_id=RUN, branch="tileloop/r", origin_branch="main", target="k.py", spec="", language="triton",
                       op="op", device="cpu", target_backend="interpreter", backends=["interpreter"], availability={},
                       base_commit="c" * 40, seed=0, env={}, untracked_at_start=[], policy={})


def test_derive_counts_what_the_records_say():
    t = st.derive(RECORDS, seen=["k:seen=1"], cut=["k:cut=1", "k:cut=2", "k:cut=2"])
    assert (t.best_commit, t.best_latency_ms, t.last_iteration) == ("b" * 40, 1.5, 5)
    assert t.outcomes == ("revert", "keep", "crash", "crash", "unmeasured")
    assert t.verdicts == ("no_gain", "improved", "interrupted", "compile_error", "void")
    assert t.crash_causes == ("interrupted", "compile_error")
    assert t.demoted == ("k:y",)  # kept at a low gain: its kind goes last
    assert t.active_s == 1.5 + 2.0 + 3.0 + 0.0 + 0.5 + 0.25
    # decided keys and a sweep's values are tried; an interrupted sweep's values are not; a key cut off
    # twice (a kill, then a void measurement; a sweep killed twice) counts as tried, once is tried again
    assert set(t.tried) == {"k:seen=1", "k:x=1", "k:y=sweep", "k:y=2", "k:y=4", "k:w=1", "k:z=1", "k:cut=2"}
    assert set(t.interrupted) == {"k:z=1", "k:cut=1", "k:cut=2"}
    assert st.derive([]) == st.Tally() and st.derive([]).last_iteration == -1 and st.derive([]).best_commit == ""
    assert tuple(f.name for f in fields(st.Tally)) == st.DERIVED  # every derived field, and only those, is tallied


def test_state_json_holds_no_derived_field_and_a_load_derives_them(tmp_path):
    state = settings_only()
    state.best_commit, state.last_iteration, state.tried = "f" * 40, 9, ["k:x=1"]  # in memory only
    state.seen = ["k:seen=1"]
    st.save(tmp_path, state)
    data = json.loads(st.state_path(tmp_path, RUN).read_text())
    assert not set(st.DERIVED) & set(data) and data["seen"] == ["k:seen=1"] and data["schema"] == st.STATE_SCHEMA
    for r in RECORDS:
        append_record(st.results_path(tmp_path, RUN), r)
    loaded = st.load(tmp_path, RUN)
    assert st.tally_of(loaded) == st.derive(RECORDS, seen=["k:seen=1"])
    # a derived field written into state.json is not read: the records say it
    st.state_path(tmp_path, RUN).write_text(json.dumps({**data, "best_commit": "f" * 40, "last_iteration": 9}))
    assert (st.load(tmp_path, RUN).best_commit, st.load(tmp_path, RUN).last_iteration) == ("b" * 40, 5)


def test_an_older_state_json_is_read_its_records_winning(tmp_path):
    state = settings_only()
    old = {**st.to_json(state), "schema": "tileloop.state/1", "best_commit": "f" * 40, "best_latency_ms": 9.0,
           "last_iteration": 2, "outcomes": ["keep"], "verdicts": ["improved"], "crash_causes": [], "demoted": [],
           "tried": ["k:x=1", "k:kept=64"], "interrupted": ["k:z=1", "k:sweep=cut"], "active_s": 99.0}
    del old["seen"], old["cut"]
    st.state_path(tmp_path, RUN).parent.mkdir(parents=True)
    st.state_path(tmp_path, RUN).write_text(json.dumps(old))
    for r in RECORDS[:4]:
        append_record(st.results_path(tmp_path, RUN), r)
    loaded = st.load(tmp_path, RUN)
    assert (loaded.best_commit, loaded.last_iteration, loaded.outcomes) == ("b" * 40, 3, ["revert", "keep", "crash"])
    # what its records do not name is kept: a kept version's own key, a sweep cut off before it chose
    assert (loaded.seen, loaded.cut) == (["k:kept=64"], ["k:sweep=cut"])
    assert {"k:x=1", "k:kept=64"} <= set(loaded.tried) and set(loaded.interrupted) == {"k:z=1", "k:sweep=cut"}
    st.save(tmp_path, loaded)  # written back in the new layout
    data = json.loads(st.state_path(tmp_path, RUN).read_text())
    assert data["schema"] == st.STATE_SCHEMA and not set(st.DERIVED) & set(data)
    assert st.tally_of(st.load(tmp_path, RUN)) == st.tally_of(loaded)


def test_the_suite_reads_a_run_through_its_records(tmp_path):
    assert st.view(tmp_path, RUN) is None
    st.save(tmp_path, settings_only())
    assert st.view(tmp_path, RUN)["last_iteration"] == -1 and st.view(tmp_path, RUN)["best_commit"] == ""
    for r in RECORDS[:3]:
        append_record(st.results_path(tmp_path, RUN), r)
    seen = st.view(tmp_path, RUN)
    assert (seen["last_iteration"], seen["best_commit"], seen["target"]) == (2, "b" * 40, "k.py")


def test_the_state_in_memory_is_the_state_a_load_gives(run):
    """What an iteration counts before its record is written (the stop rules read it) is what the
    records give once it is: after void, kept and reverted steps, memory and a fresh load agree."""
    repo, exp, judge = run
    judge.during = lambda root: (root / SPEC).write_text((root / SPEC).read_text() + "\n# touched\n")
    step(exp, 256, key="block=256")  # void: cut off once
    judge.during, judge.raw = None, {"status": "runtime_error", "message": "boom"}
    step(exp, 1024, key="block=1024")  # a crash
    judge.raw = None
    step(exp, 512, key="block=512")  # kept
    assert exp.state.outcomes == ["unmeasured", "crash", "keep"] and exp.state.last_iteration == 3
    assert exp.state.interrupted == ["block=256"] and {"block=1024", "block=512"} <= set(exp.state.tried)
    assert st.tally_of(exp.state) == st.tally_of(st.load(repo, "r"))
    assert exp.state.best_commit == [r for r in exp.records() if r.status == "keep"][-1].commit
