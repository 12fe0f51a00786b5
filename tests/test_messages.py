"""The typed messages of an iteration (loop.common.messages): each reads the dicts the run wrote before
it was typed and writes them back key for key, and each JSON Schema that describes one agrees with it."""

from __future__ import annotations

import json
import typing
from dataclasses import fields, replace
from pathlib import Path

import pytest
from cli_schema import resolve

from loop.common import messages
from loop.common.messages import (Change, Corroboration, Decision, Failure, ImplTiming, Inflight, JobImpl, JudgeJob, Recheck,
                                  ShapeTiming, Stop, Timing)
from loop.records.results import Record

ROOT = Path(__file__).resolve().parent.parent
PARTS = {"change": Change, "decision": Decision, "stop": Stop, "failure": Failure}

SHA = "0123456789abcdef0123456789abcdef01234567"
SWEEP = {"key": "sweep:BLOCK", "values": [{"key": "BLOCK=64", "value": 64}], "chosen": 64}

# the in-flight markers as each stage wrote them into state.json (sorted, as state.json holds them)
INFLIGHT = [
    {"iteration": 0, "stage": "start", "optimization": "baseline"},  # init
    {"iteration": 0, "stage": "verify", "optimization": "baseline"},  # the baseline, verified
    {"iteration": 3, "stage": "sweep", "key": "sweep:BLOCK", "optimization": "BLOCK over 64, 128",
     "hypothesis": "a larger block", "recipe": "block-size", "kind": "launch"},
    {"iteration": 2, "stage": "apply", "key": "block-size:BLOCK=64", "optimization": "BLOCK 128 -> 64",
     "hypothesis": "", "recipe": "block-size"},
    {"iteration": 2, "stage": "apply", "key": "sweep:BLOCK", "optimization": "BLOCK 128 -> 64",
     "hypothesis": "h", "recipe": "block-size", "sweep": SWEEP},
    {"iteration": 1, "stage": "commit", "optimization": "my edit", "hypothesis": "h", "recipe": None, "key": None,
     "started": "2026-01-01T00:00:00+00:00", "kind": "agent"},  # an agent's edit: no key, no recipe
    {"iteration": 1, "stage": "measure", "optimization": "my edit", "hypothesis": "h", "recipe": None, "key": None,
     "started": "2026-01-01T00:00:00+00:00", "kind": "agent", "commit": SHA},
    {"iteration": 4, "stage": "record", "optimization": "o", "hypothesis": "h", "recipe": "r", "key": "k",
     "started": "2026-01-01T00:00:00+00:00", "kind": "launch", "sweep": SWEEP, "commit": SHA},
]


@pytest.mark.parametrize("written", INFLIGHT, ids=lambda d: f"{d['iteration']}-{d['stage']}")
def test_an_inflight_marker_reads_and_writes_back_the_dict_the_run_wrote(written):
    marker = Inflight.from_json(written)
    assert marker.to_json() == written
    assert list(marker.to_json()) == sorted(written)  # state.json's order


def test_a_stage_moves_the_marker_and_keeps_the_commit_once_made():
    marker = Inflight(1, "commit", "o", key=None, hypothesis="h", recipe=None, started="t", kind="agent")
    assert "commit" not in marker.to_json()
    committed = marker.at("verify", SHA)
    assert (committed.stage, committed.commit) == ("verify", SHA) and committed.at("measure").commit == SHA
    assert marker.stage == "commit"  # frozen: a stage makes a new marker


def test_the_baseline_marker_names_no_candidate():
    assert Inflight(0, "start", "baseline").to_json() == {"iteration": 0, "optimization": "baseline", "stage": "start"}
    assert set(Inflight(1, "apply", "o").to_json()) == {"iteration", "stage", "optimization", "key", "hypothesis", "recipe"}


# ------------------------------------------------------------------------------------ the record's parts


def written_records() -> list[dict]:
    """Every record the repository keeps as a run wrote it: the golden session's and the documented runs'
    (of earlier versions too: decisions before `remeasured`, stop states before `timing`)."""
    out = json.loads((ROOT / "tests" / "golden" / "records.json").read_text())
    for path in sorted((ROOT / "docs" / "results").rglob("*results.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in out if isinstance(r, dict) and r.get("schema") == "tileloop.record/1"]


def test_every_part_of_every_written_record_reads_and_writes_back_key_for_key():
    records = written_records()
    shapes = {(name, tuple(sorted(r[name]))) for r in records for name in PARTS if r.get(name)}
    assert {("decision", ("reason", "verdict")), ("stop", ("reason", "state")), ("failure", ("message", "status"))} <= shapes
    for r in records:
        for name, kind in PARTS.items():
            if r.get(name):
                assert kind.from_json(r[name]).to_json() == r[name], (name, r[name])
        written = Record.from_json(r).to_json()  # a record before `change` was kept gets {}, as it did untyped
        assert {name: written[name] for name in PARTS} == {"change": {}, "failure": None, **{k: r[k] for k in PARTS if k in r}}


def test_the_record_keeps_its_parts_typed_and_writes_the_same_dicts():
    change = Change(frozenset({"launch", "code"}), ("num_warps",), "", True, "can show")
    decision = Decision("keep", "improved", "1.1x", 1.1, 1.05, 1.15, shapes=[{"shape": [8], "speedup": 1.1}],
                        remeasured=False)
    rec = Record(run="r", iteration=1, optimization="o", status="keep", correctness="PASS", latency_ms=1.0,
                 speedup=1.1, target_backend="ptx", backends={}, commit=None, parent=None, change=change, decision=decision,
                 stop=Stop("continue", "", "gpu"), failure=None)
    d = rec.to_json()
    assert d["change"] == {"kinds": ["launch", "code"], "details": ["num_warps"], "hint": "", "measurable": True,
                           "reason": "can show"}
    assert list(d["decision"]) == ["action", "verdict", "reason", "speedup", "lo", "hi", "priority", "stop_after",
                                   "shapes", "remeasured"]
    assert d["stop"] == {"state": "continue", "reason": "", "timing": "gpu"} and d["failure"] is None
    back = Record.from_json(json.loads(json.dumps(d)))
    assert back == rec and (back.lo, back.hi, back.verdict) == (1.05, 1.15, "improved")
    baseline = Decision(None, "baseline", "iteration 0: the code as given")
    assert baseline.to_json() == {"verdict": "baseline", "reason": "iteration 0: the code as given"}
    bare = Record.from_json({**d, "change": {}, "decision": baseline.to_json(), "stop": {}, "failure": None})
    assert (bare.change, bare.stop, bare.decision) == (None, None, baseline)
    assert Failure.from_json({"status": "interrupted", "message": "m"}) == Failure("interrupted", "m")
    with pytest.raises(ValueError, match="unknown change kind"):
        Change.from_json({"kinds": ["colour"], "details": [], "hint": ""})


# ------------------------------------------------------------------------------ the judge's timing result

JUDGED = ROOT / "tests" / "fixtures" / "judge" / "interpreter-paired.result.json"  # a CPU run's judge, as written


def test_the_judges_timing_result_reads_and_writes_back_the_result_file_byte_for_byte():
    text = JUDGED.read_text()
    raw = json.loads(text)
    timing = Timing.from_json(raw["timing"])
    assert json.dumps({**raw, "timing": timing.to_json()}, indent=1, default=str) == text
    shape = timing.shapes[0]
    assert (timing.dtype, timing.device, shape.method) == (raw["timing"]["dtype"], "cpu", "interpreter_wallclock")
    for label in ("incumbent", "candidate"):
        written = raw["timing"]["shapes"][0]["impls"][label]
        assert shape.samples(label) == tuple(written["samples_ms"]) and shape.impls[label].median_ms == written["median_ms"]
        assert shape.recheck[label].ok and shape.recheck[label].audits == written["nrep"]
    assert shape.corroboration.ok and shape.corroboration.claimed_speedup == raw["timing"]["shapes"][0]["corroboration"][
        "claimed_speedup"]
    with pytest.raises(KeyError, match="no timing of sweep-64"):
        shape.samples("sweep-64")


def test_an_external_harness_timing_and_a_refused_one_read_and_write_back():
    harness = {"shapes": [{"shape": ["n=4096"], "record": {"n": 4096}, "impls": {"candidate": {"samples_ms": [1.0, 2.0]},
                                                                                "incumbent": {"samples_ms": [3, 4.5]}}}]}
    timing = Timing.from_json(harness)
    assert timing.to_json() == harness and json.dumps(timing.to_json()) == json.dumps(harness)
    assert timing.shapes[0].samples("incumbent") == (3, 4.5) and timing.shapes[0].record == {"n": 4096}
    refused = {"ok": False, "label": "candidate", "reason": "candidate: claimed 0.1 ms", "method": "cuda_graph",
               "labels": {}, "refused_before": "candidate: x", "newer": [1]}  # a key no part names is kept as written
    corr = Corroboration.from_json(refused)
    assert (corr.ok, corr.label, corr.refused_before) == (False, "candidate", "candidate: x")
    assert json.dumps(corr.to_json()) == json.dumps(refused)
    made = ShapeTiming((8,), {"a": ImplTiming((1.0,), median_ms=1.0)}, method="cuda_graph", recheck={"a": Recheck(True, 3)})
    assert made.to_json() == {"shape": [8], "impls": {"a": {"samples_ms": [1.0], "median_ms": 1.0}}, "method": "cuda_graph",
                              "recheck": {"a": {"ok": True, "audits": 3}}}
    assert ShapeTiming.from_json(made.to_json()) == made
    with pytest.raises(ValueError, match="ShapeTiming without impls"):
        ShapeTiming.from_json({"shape": [8]})


# ------------------------------------------------------------------------------------ the judge's job

# jobs as the orchestrator writes them: an iteration's (`loop.measure.evaluate`), compare's, the report's final
# measurement, decision-check's with the shapes and dtype asked for, a replayed failure's
JOBS = [
    {"spec": "k/spec.py", "target_dir": "k", "target": "k/t.py", "device": "cpu", "backend": "interpreter",
     "impls": [{"label": "incumbent", "path": "w/t__incumbent.py"}, {"label": "candidate", "path": "w/t__candidate.py"}],
     "check": ["candidate"], "seed": 338886905, "bench": True, "timing": {"min_reps": 5, "max_reps": 15, "budget_s": 0.5}},
    {"spec": "k/spec.py", "target_dir": "k", "device": "cuda", "backend": "ptx", "impls": [{"label": "mine", "path": "m.py"}],
     "torch_providers": ["torch_eager"], "check": ["mine"], "seed": 1234, "bench": True, "check_benchmark_shapes": False,
     "references": True},
    {"spec": "k/spec.py", "target_dir": "k", "target": None, "device": "cuda", "backend": "ptx", "impls": [],
     "check": ["candidate"], "seed": 7, "bench": True, "timing": {}, "bench_shapes": [[256, 64]], "bench_dtype": "float16",
     "method": "eager", "drawn": False, "draws": [{"shape": [3]}], "dtypes": ["float32"], "correctness_shapes": [[8]]},
]


@pytest.mark.parametrize("written", JOBS, ids=("iteration", "compare", "asked"))
def test_a_judges_job_reads_and_writes_back_the_file_the_orchestrator_wrote(written):
    job = JudgeJob.from_json(written)
    assert json.dumps(job.to_json(), indent=1) == json.dumps(written, indent=1)
    assert job.labels() == [i["label"] for i in written["impls"]] and job.check == tuple(written["check"])


def test_a_job_made_by_the_orchestrator_is_the_dict_it_wrote_before_and_a_bad_one_is_refused():
    written = JOBS[0]
    made = JudgeJob("k/spec.py", "k", "cpu", "interpreter", (JobImpl("incumbent", "w/t__incumbent.py"),
                    JobImpl("candidate", "w/t__candidate.py")), ("candidate",), 338886905, "k/t.py", timing=written["timing"])
    assert json.dumps(made.to_json(), indent=1) == json.dumps(written, indent=1)
    assert made == JudgeJob.from_json(written)
    asked = replace(made, method="graph", bench_shapes=((256,),), timing={})
    assert list(asked.to_json())[-2:] == ["bench_shapes", "method"] and asked.to_json()["bench_shapes"] == [[256]]
    job = JudgeJob.from_json(JOBS[1])  # what a job leaves out reads as the judge's default
    assert (job.bench, job.drawn, job.clone_bandwidth, job.timing, job.draws, job.target) == (True, True, True, {}, None, None)
    with pytest.raises(ValueError, match="JudgeJob without spec"):
        JudgeJob.from_json({k: v for k, v in written.items() if k != "spec"})


# ------------------------------------------------------------------------------ the schemas agree with them


def inflight_schema() -> dict:
    marker = resolve("common.json#/$defs/run_status")["properties"]["inflight"]
    return next(alt for alt in marker["anyOf"] if alt.get("type") == "object")


# each JSON Schema (loop/cli/schema) that describes a message, with the message's type
DESCRIBED = {"common.json#/$defs/change": Change, "common.json#/$defs/decision": Decision,
             "common.json#/$defs/stop": Stop, "common.json#/$defs/failure": Failure, "run_status.inflight": Inflight}


def schema_of(where: str) -> dict:
    return inflight_schema() if where == "run_status.inflight" else resolve(where)


def literal_values(tp) -> set[str] | None:
    """The values a field's Literal allows (inside `X | None` too), or None for a field of no Literal."""
    if typing.get_origin(tp) is typing.Literal:
        return set(typing.get_args(tp))
    found = [v for arg in typing.get_args(tp) if (v := literal_values(arg)) is not None]
    return set().union(*found) if found else None


def enum_of(prop: dict) -> set[str] | None:
    """The values a schema property allows: its enum, or its array items' enum."""
    if "enum" in prop:
        return set(prop["enum"]) - {None}
    return set(prop.get("items", {}).get("enum", ())) or None


def disagreements(kind: type, schema: dict) -> list[str]:
    """Where a message's dataclass and the schema that describes it disagree: a required property that is
    no field, a field the schema does not describe, a field's closed set of values that is not the
    schema's enum."""
    names, props = {f.name for f in fields(kind)}, schema["properties"]
    out = [f"required {name!r} is no field" for name in sorted(set(schema.get("required", ())) - names)]
    out += [f"field {name!r} is not described" for name in sorted(names - set(props))]
    hints = typing.get_type_hints(kind)
    for name in sorted(names & set(props)):
        allowed = set(typing.get_args(messages.ChangeKind)) if name == "kinds" else literal_values(hints[name])
        listed = enum_of(props[name])
        if allowed != listed and (allowed is not None or listed is not None):
            out.append(f"field {name!r}: the type allows {sorted(allowed or ())}, the schema {sorted(listed or ())}")
    return out


@pytest.mark.parametrize("where", DESCRIBED)
def test_each_schema_of_a_message_agrees_with_its_dataclass(where):
    assert disagreements(DESCRIBED[where], schema_of(where)) == []


def test_a_schema_and_a_dataclass_that_drifted_apart_disagree():
    stop = json.loads(json.dumps(resolve("common.json#/$defs/stop")))
    del stop["properties"]["timing"]
    stop["required"].append("when")
    decision = json.loads(json.dumps(resolve("common.json#/$defs/decision")))
    decision["properties"]["verdict"]["enum"].remove("void")
    assert disagreements(Stop, stop) == ["required 'when' is no field", "field 'timing' is not described"]
    assert disagreements(Decision, decision) and "void" in disagreements(Decision, decision)[0]
