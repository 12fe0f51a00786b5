"""The typed messages of an iteration (loop.common.messages): each reads the dicts the run wrote before
it was typed and writes them back key for key, and each JSON Schema that describes one agrees with it."""

from __future__ import annotations

import pytest

from loop.common.messages import Inflight

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
