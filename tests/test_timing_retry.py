"""A refused timing is taken again once (`loop.judge.bench.judged_rounds`): noise of the host that
shows in one set of rounds passes in the next, a faked claim is refused in both, and the audited
outputs of every round are compared."""

from __future__ import annotations

from loop.judge.bench import TIMING_RETRIES, judged_rounds

LABELS = ("incumbent", "candidate")
EMPTY = [0.10, 0.11, 0.10, 0.12, 0.10]


def rounds(claim: dict[str, float], wall: dict[str, float], tag: str):
    """Five requests per label, each claiming `claim` ms and taking `wall` ms on the judge's clock,
    with one audited row per label named by `tag`."""
    samples = {lab: [claim[lab]] * 5 for lab in LABELS}
    claims = {lab: [claim[lab]] * 5 for lab in LABELS}
    walls = {lab: [wall[lab] + 0.10] * 5 for lab in LABELS}
    empties = {"batch": {lab: list(EMPTY) for lab in LABELS}}
    audits = {lab: [{"ok": True, "sample_ms": claim[lab], "claim_ms": claim[lab], "wall_ms": wall[lab] + 0.10, "tag": tag}]
              for lab in LABELS}
    follows = {lab: [None] * 5 for lab in LABELS}  # no order: the interference check decides nothing here
    return samples, claims, walls, empties, audits, follows


HONEST = rounds({"incumbent": 2.0, "candidate": 1.0}, {"incumbent": 2.0, "candidate": 1.0}, "honest")
# the candidate's process descheduled for most of its requests: its claims are right, its walls are not
NOISY = rounds({"incumbent": 2.0, "candidate": 1.0}, {"incumbent": 2.0, "candidate": 4.0}, "noisy")
# a candidate whose clock runs at a third of the real rate: the same in every set of rounds
FAKED = rounds({"incumbent": 2.0, "candidate": 0.5}, {"incumbent": 2.0, "candidate": 1.5}, "faked")


def taker(*sets):
    taken = list(sets)
    return lambda: taken.pop(0)


def test_noise_in_one_set_of_rounds_is_taken_again_and_judged_on_the_next():
    samples, verdict, written, notes = judged_rounds(taker(NOISY, HONEST), "interpreter_wallclock", LABELS)
    assert verdict["ok"] and "candidate" in verdict["refused_before"]
    assert samples == HONEST[0]
    assert [row["tag"] for row in written["candidate"]] == ["noisy", "honest"]  # both rounds' outputs compared
    assert len(notes) == 1 and "taken again" in notes[0]


def test_a_faked_clock_is_refused_in_every_set_of_rounds():
    assert TIMING_RETRIES >= 1
    _, verdict, written, notes = judged_rounds(taker(*[FAKED] * (1 + TIMING_RETRIES)), "interpreter_wallclock", LABELS)
    assert not verdict["ok"] and verdict["label"] == "candidate" and "refused_before" in verdict
    assert len(written["candidate"]) == 1 + TIMING_RETRIES and len(notes) == TIMING_RETRIES


def test_rounds_that_pass_are_taken_once():
    _, verdict, written, notes = judged_rounds(taker(HONEST), "interpreter_wallclock", LABELS)
    assert verdict["ok"] and "refused_before" not in verdict and notes == []
    assert [row["tag"] for row in written["incumbent"]] == ["honest"]
