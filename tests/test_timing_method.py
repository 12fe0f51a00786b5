"""The timing method of a judged shape (`loop.judge.bench.choose_method`): with a pair, the
incumbent's call decides, so the same incumbent is timed the same way whatever candidate it meets;
a forced method is the one used; without a pair, the slowest deciding call decides."""

from __future__ import annotations

import pytest

from loop.common import timing
from loop.common.messages import JudgeJob
from loop.judge.bench import GRAPH_SAMPLE_LIMIT, choose_method

PAIR = ("incumbent", "candidate")
SHORT = timing.GRAPH_BELOW_MS / 4  # an incumbent call that CUDA graphs time


def choose(inc: float, cand: float, pair=PAIR, forced=None, nsets: int = 4, most: int = 100, use_graphs=True):
    calls = {"incumbent": inc, "candidate": cand}
    return choose_method(calls, list(calls), pair, use_graphs, nsets, most, forced)


def test_a_slow_candidate_does_not_move_a_short_incumbent_off_graphs():
    alone = choose(SHORT, SHORT)
    beside_slow = choose(SHORT, 2 * timing.GRAPH_BELOW_MS)
    assert alone.graphs and beside_slow.graphs
    assert alone.calls == beside_slow.calls == timing.calls_per_graph(SHORT, 4)
    assert "candidate" in beside_slow.why and "as many calls" in beside_slow.why
    assert "incumbent" in alone.why


def test_the_same_incumbent_gets_the_same_method_whatever_the_candidate():
    candidates = [SHORT / 3, SHORT, 0.9 * timing.GRAPH_BELOW_MS, 1.5 * timing.GRAPH_BELOW_MS]
    got = {(c.graphs, c.calls) for c in (choose(SHORT, cand) for cand in candidates)}
    assert len(got) == 1


def test_a_long_incumbent_is_timed_eagerly_whatever_the_candidate():
    for cand in (SHORT, 4 * timing.GRAPH_BELOW_MS):
        c = choose(2 * timing.GRAPH_BELOW_MS, cand)
        assert not c.graphs and c.calls == 1 and "incumbent" in c.why


def test_a_candidate_whose_graph_would_run_too_long_sends_both_to_eager_and_says_why():
    inc = 0.001  # 1 us: a graph of many calls
    calls = timing.calls_per_graph(inc, 4)
    intended = max(timing.SAMPLE_TARGET_MS, inc * calls)
    just_in = choose(inc, 0.99 * GRAPH_SAMPLE_LIMIT * intended / calls)
    too_long = choose(inc, 1.01 * GRAPH_SAMPLE_LIMIT * intended / calls)
    assert just_in.graphs
    assert not too_long.graphs and "would take" in too_long.why and "candidate" in too_long.why


def test_without_a_pair_the_slowest_deciding_call_decides_as_before():
    c = choose(SHORT, 2 * timing.GRAPH_BELOW_MS, pair=None)
    assert not c.graphs and "candidate" in c.why
    calls = {"impl": SHORT, "torch_eager": 5.0}  # PyTorch's own baseline does not decide
    c = choose_method(calls, ["impl"], None, True, 4, 100)
    assert c.graphs and c.calls == timing.calls_per_graph(SHORT, 4)


@pytest.mark.parametrize("inc, cand", [(SHORT, SHORT), (3.0, 3.0), (0.001, 5.0)])
def test_a_forced_method_is_the_one_chosen(inc, cand):
    graph, eager = choose(inc, cand, forced="graph"), choose(inc, cand, forced="eager")
    assert graph.graphs and graph.forced and "asked for" in graph.why
    assert graph.calls == max(1, min(timing.calls_per_graph(inc, 4), 100))
    assert not eager.graphs and eager.forced and eager.calls == 1
    with pytest.raises(ValueError, match="method"):
        choose(inc, cand, forced="graphs")


def test_calls_never_exceed_the_input_sets_a_graph_may_use():
    assert choose(0.0001, 0.0001, most=3).calls == 3


def test_a_plan_without_graphs_is_eager_unless_graphs_are_forced():
    assert not choose(SHORT, SHORT, use_graphs=False).graphs
    assert choose(SHORT, SHORT, use_graphs=False, forced="graph").graphs


# ----------------------------------------------------------------------------- the judge's Bench uses the choice


class Process:
    """A kernel process that captures a graph when it can (`captures`), and records what it was asked."""

    def __init__(self, captures: bool = True):
        self.captures, self.asked = captures, []

    def send(self, message: dict, label: str) -> None:
        self.asked.append(message)

    def answer(self, message: dict, label: str) -> dict:
        return {"ok": True, "captured": self.captures} if message.get("op") == "capture" else {"ok": True}

    def request(self, message: dict, label: str) -> dict:
        self.send(message, label)
        return self.answer(message, label)


class Audits:
    def timed_as(self, method: str, calls: int, used: int, captured) -> None:
        self.method = method


def bench_method(inc_ms: float, cand_ms: float, method: str | None = None, captures: bool = True):
    from loop.judge.bench import Bench

    kernels = {"incumbent": Process(captures), "candidate": Process(captures)}
    job = JudgeJob("spec.py", ".", "cuda", None, (), ("candidate",), method=method)
    bench = Bench(None, None, None, kernels, job, PAIR)
    prepared = {"incumbent": {"call_ms": inc_ms}, "candidate": {"call_ms": cand_ms}}
    return bench.method(prepared, 4, 8, timing.TimingPlan(), Audits()), kernels


def test_the_judge_times_a_short_incumbent_in_graphs_beside_a_slow_candidate_and_says_why():
    (method, calls, notes), kernels = bench_method(SHORT, 3 * timing.GRAPH_BELOW_MS)
    assert method == "cuda_graph" and calls >= 4
    assert kernels["candidate"].asked[-1] == {"op": "capture", "calls": calls}
    assert "incumbent" in notes[0] and "as many calls" in notes[0]


def test_the_judge_honours_a_forced_method_and_says_when_a_forced_graph_could_not_be_captured():
    (method, calls, notes), kernels = bench_method(3.0, 3.0, "graph")
    assert method == "cuda_graph" and "asked for" in notes[0]
    (method, calls, notes), kernels = bench_method(SHORT, SHORT, "eager")
    assert method == "cuda_events_l2_flush" and calls == 1
    assert not any(m.get("op") == "capture" for m in kernels["incumbent"].asked)
    (method, calls, notes), _ = bench_method(SHORT, SHORT, "graph", captures=False)
    assert method == "cuda_events_l2_flush" and "capture failed" in notes[-1] and "method graph" in notes[-1]
