"""A run with a time budget (a suite's `--per-run` gives each run one) starts no experiment it is not
expected to finish: it takes the first candidate in the order whose expected seconds fit what is left,
and stops by its own rule, saying why, when none does; a suite's run gets a budget below its limit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loop.run import unattended
from loop.suite.runner import budget_args
from playbook import Candidate
from playbook.analysis import Experiment
from playbook.base import experiment


class Analysis:
    """Stands in for the playbook's analysis: each kind's expected seconds, as its cost model gives them."""

    def expected_seconds(self, kind: str, experiment: Experiment = Experiment()) -> float:
        return experiment.seconds()


def cand(key: str, configs: int = 1) -> Candidate:
    return Candidate("recipe", "kind", key, f"change {key}", "", "source", configs=configs)


def fake_run(budget: float | None, active: float) -> tuple[SimpleNamespace, list[str]]:
    lines: list[str] = []
    run = SimpleNamespace(policy=SimpleNamespace(time_budget_s=budget), log=lines.append,
                          state=SimpleNamespace(active_s=active, tried=[], demoted=[], skip_recipes=[]))
    return run, lines


@pytest.fixture
def pool(monkeypatch):
    order = [cand("autotune", configs=12), cand("hint")]  # ~78 s, then ~12 s
    monkeypatch.setattr(unattended, "ranked_experiments", lambda *a: [(c, experiment(c)) for c in order])
    monkeypatch.setattr(unattended, "screen", lambda run, src: SimpleNamespace(why_not=lambda c: None))
    return order


def test_without_a_budget_the_order_stands(pool):
    run, _ = fake_run(None, 1000.0)
    assert unattended.propose(run, "src", Analysis()) == (pool[0], None)


def test_the_first_candidate_that_fits_is_taken_and_the_skip_is_said(pool):
    run, lines = fake_run(100.0, 40.0)  # 60 s left: the autotune (~78 s) does not fit, the hint does
    chosen, why = unattended.propose(run, "src", Analysis())
    assert chosen is pool[1] and why is None
    assert lines and "does not fit in the 60 s left" in lines[0]
    run, _ = fake_run(100.0, 10.0)  # 90 s left: the order stands
    assert unattended.propose(run, "src", Analysis())[0] is pool[0]


def test_nothing_fits_stops_with_why(pool):
    run, _ = fake_run(100.0, 95.0)
    chosen, why = unattended.propose(run, "src", Analysis())
    assert chosen is None and why.startswith("time budget: the shortest experiment left (~12 s, 2 candidates)")


def test_a_suite_run_gets_a_budget_below_its_limit_unless_it_gives_one():
    assert budget_args(None, []) == []
    assert budget_args(140.0, ["--time-budget", "60s"]) == []
    args = budget_args(140.0, ["--device", "cuda"])
    assert args[0] == "--time-budget" and 70 <= float(args[1].rstrip("s")) < 140 - 29
    assert float(budget_args(600.0, [])[1].rstrip("s")) == 510
