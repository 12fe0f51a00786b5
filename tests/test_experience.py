"""Experience stays in its lane: every entry carries its timing mode and device; a GPU backend's
recommendation reads GPU entries only (never interpreter timings, never entries of unknown mode
written before the mode was recorded), an unmeasured entry counts for nothing, and the
recommendation says how many entries it used, in JSON and in text."""

from __future__ import annotations

import json

from loop.cli import main
from loop.records import experience
from loop.records.experience import Entry


def entry(kind: str, outcome: str, speedup: float | None, timing: str, backend: str = "ptx", **kw) -> Entry:
    base = dict(op="softmax", kernel_class="norm-like", language="triton", backend=backend, arch="sm_90", kind=kind,
                key=f"{kind}-key", optimization=kind, outcome=outcome, verdict="improved" if outcome == "keep" else "x",
                speedup=speedup, run="r", date="d", timing=timing, device="NVIDIA H100" if timing == "gpu" else "CPU")
    return Entry(**{**base, **kw})


def write(path, entries, old_lines=()) -> None:
    for e in entries:
        experience.append(e, path)
    with open(path, "a") as fh:
        for line in old_lines:
            fh.write(json.dumps(line) + "\n")


def old_entry(kind: str) -> dict:
    """An entry as written before the timing mode was recorded (no timing, no device)."""
    e = entry(kind, "keep", 3.0, "gpu").__dict__.copy()
    e.pop("timing"), e.pop("device")
    return e


def test_gpu_recommendations_read_gpu_entries_only(tmp_path):
    path = tmp_path / "exp.jsonl"
    write(path, [entry("block", "keep", 1.2, "gpu"), entry("block", "revert", 0.99, "gpu"),
                 entry("persistent", "keep", 4.0, "interpreter", backend="interpreter", arch="cpu"),
                 entry("persistent", "keep", 4.0, "interpreter", backend="interpreter", arch="cpu"),
                 entry("num_warps", "unmeasured", None, "gpu")],
          old_lines=[old_entry("eviction")])
    loaded = experience.load(path)
    assert [e.timing for e in loaded][-1] == experience.UNKNOWN  # an old entry reads as unknown mode
    rec = experience.recommend(loaded, "norm-like", "ptx", "sm_90")
    assert rec.lane == "gpu" and rec.used == 2 and [r["kind"] for r in rec.rows] == ["block"]
    assert rec.left_out == {"of another timing mode": 2, "of unknown timing mode": 1, "unmeasured": 1}
    assert "ranked from 2 gpu entries" in rec.text() and "1 of unknown timing mode" in rec.text()
    for backend in ("tileir", "cutile"):  # no history of their own: other GPU backends, never the interpreter
        other = experience.recommend(loaded, "norm-like", backend)
        assert other.lane == "gpu" and {r["kind"] for r in other.rows} == {"block"}
        assert "any gpu backend" in other.scope
    interp = experience.recommend(loaded, "norm-like", "interpreter")
    assert interp.lane == "interpreter" and interp.used == 2 and [r["kind"] for r in interp.rows] == ["persistent"]


def test_unmeasured_entries_are_no_tries(tmp_path):
    rows = experience.stats([entry("num_warps", "unmeasured", None, "interpreter"),
                             entry("num_warps", "keep", 1.1, "interpreter")])
    assert rows == [{"kind": "num_warps", "tries": 1, "kept": 1, "kept_fraction": 1.0, "crash_fraction": 0.0,
                     "geomean_speedup_kept": 1.1}]


def test_recommend_on_the_command_line_says_what_it_used(tmp_path, monkeypatch, capsys):
    path = tmp_path / "exp.jsonl"
    monkeypatch.setenv("TILELOOP_EXPERIENCE", str(path))
    write(path, [entry("block", "keep", 1.2, "gpu"), entry("persistent", "keep", 4.0, "interpreter",
                                                            backend="interpreter")])
    assert main(["experience", "recommend", "--kernel-class", "norm-like", "--backend", "ptx", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lane"] == "gpu" and out["rows_used"] == 1 and [r["kind"] for r in out["recommend"]] == ["block"]
    assert out["left_out"]["of another timing mode"] == 1
    assert main(["experience", "recommend", "--kernel-class", "norm-like", "--backend", "ptx"]) == 0
    assert "ranked from 1 gpu entry" in capsys.readouterr().out
    assert main(["experience", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["timing"], e["device"]) for e in listed] == [("gpu", "NVIDIA H100"), ("interpreter", "CPU")]
