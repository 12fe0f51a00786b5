"""The timing method of a judged shape (`loop.judge.bench.choose_method`): with a pair, the
incumbent's call decides, so the same incumbent is timed the same way whatever candidate it meets;
a forced method is the one used; without a pair, the slowest deciding call decides."""

from __future__ import annotations

import pytest

from loop.common import timing
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
