"""Timings the kernel processes report, checked against the judge's own clock. Pure functions.

Each kernel process times its implementation with CUDA events or perf_counter in its own process,
where the candidate's code could have replaced them. The judge cannot time a GPU kernel in another
process, but it can time what it asks for: every few samples are one request, and the judge measures
the request's wall time with its own clock (send to answer). Around the rounds it also asks each
process for empty requests (the same samples without the calls: the round trip, the L2 flush and the
synchronize), whose median is that process's overhead. So for each implementation the judge has,
request by request, the claimed time and the wall time of the very same work; the spread of the empty
requests is the jitter a round trip adds or takes away, allowed (with ABS_SLACK) on top of the bands.
A claim is refused when

- a request's samples claim more time than the request took on the judge's clock;
- an implementation's median claim is far below the median wall time of its samples less the
  overhead (a timer that runs slow, a clock scaled down);
- the claimed speedup of the candidate over the incumbent exceeds the speedup of their wall times.

A claim of more time than the work took only harms the claimant (the incumbent runs in a process of
its own, out of the candidate's reach), so beyond the per-sample bound only claims of less time are
refused. Nor may the candidate slow the incumbent: the incumbent's requests right after one of the
candidate's are compared with its requests right after one of its own (`interference`), which work
the candidate left running (a GPU stream, a thread, a helper) would make slower. The bands
(TOLERANCES) leave room for honest noise (the round trip of a pipe, launch latency): a candidate's claimed speedup may exceed its wall-time speedup by at most 5% on CUDA
graphs, 10% eagerly, 15% under the interpreter. A faked gain smaller than its band is not caught.
"""

from __future__ import annotations

import statistics

from loop.common.stats import median_interval

# timing method -> (an implementation's median claim below its median wall time; claimed over wall speedup)
TOLERANCES = {
    "cuda_graph": (0.15, 0.05),
    "cuda_events_l2_flush": (0.25, 0.10),
    "interpreter_wallclock": (0.25, 0.15),
}
# ms a request may take beyond its claim for reasons no empty request shows (freeing the last call's
# outputs, the allocator): tiny beside a GPU request of BATCH_MS, and beside an interpreted kernel call
ABS_SLACK = {"cuda_graph": 0.05, "cuda_events_l2_flush": 0.1, "interpreter_wallclock": 0.5}
SAMPLE_SLACK = (1.01, 0.05)  # a request's claims may exceed its wall time by 1% + 0.05 ms (clock granularity)
EMPTY_REQUESTS = 5  # empty requests per process before and after the rounds
BATCH_MS = 4.0  # work per sample request on a GPU: a round trip of ~0.3 ms is small beside it
MAX_BATCH = 16


def judge_timing(method: str, claimed: dict[str, list[float]], walls: dict[str, list[float]],
                 empties: dict[str, list[float]], pair: tuple[str, str] | None) -> dict:
    """The verdict on one shape's timings. `claimed`: label -> the time each request's samples claim
    (ms, all their work); `walls`: label -> each request's wall time on the judge's clock;
    `empties`: label -> the wall times of its empty requests (their median is the overhead, the
    spread of their middle 80% the jitter a round trip adds or takes away); `pair`: (incumbent,
    candidate) when a speedup is claimed. Returns {ok, reason, method, labels: {claimed_ms, wall_ms, overhead_ms, jitter_ms}},
    and when refused the `label` refused (the candidate for a speedup its wall clock does not bear out)."""
    per_label, ratio = TOLERANCES[method]
    detail: dict = {"method": method, "labels": {}}
    net, jitter = {}, {}
    overhead = {label: statistics.median(e) for label, e in empties.items()}
    for label, claims in claimed.items():
        if why := _over(claims, walls[label]):
            return {**detail, "ok": False, "label": label, "reason": f"{label}: {why}"}
        claim = statistics.median(claims)
        net[label] = max(statistics.median(walls[label]) - overhead[label], 1e-9)
        jitter[label] = _jitter(empties[label], method)
        detail["labels"][label] = {"claimed_ms": round(claim, 5), "wall_ms": round(net[label] + overhead[label], 5),
                                   "overhead_ms": round(overhead[label], 5), "jitter_ms": round(jitter[label], 5)}
        if claim < (net[label] - jitter[label]) * (1 - per_label):
            return {**detail, "ok": False, "label": label, "reason": f"{label}: claimed {claim:.4f} ms per request, but its requests took "
                    f"{net[label]:.4f} ms beyond the overhead on the judge's clock (band {per_label:.0%})"}
    if pair is not None:
        inc, cand = pair
        claimed_speedup = statistics.median(claimed[inc]) / statistics.median(claimed[cand])
        wall_speedup = net[inc] / net[cand]
        most = (net[inc] + jitter[inc]) / max(net[cand] - jitter[cand], 1e-9)  # the most the wall clock allows
        detail.update(claimed_speedup=round(claimed_speedup, 4), wall_speedup=round(wall_speedup, 4))
        if claimed_speedup > most * (1 + ratio):
            return {**detail, "ok": False, "label": cand, "reason": f"claimed speedup {claimed_speedup:.3f}x, but the same samples on "
                    f"the judge's clock show {wall_speedup:.3f}x (band {ratio:.0%})"}
    return {**detail, "ok": True, "reason": ""}


def _over(claims: list[float], walls: list[float]) -> str | None:
    """Why some requests claim more time than they took on the judge's clock, or None."""
    over = [(c, w) for c, w in zip(claims, walls) if c > w * SAMPLE_SLACK[0] + SAMPLE_SLACK[1]]
    if not over:
        return None
    c, w = over[0]
    return f"{len(over)} request(s) claim more time than they took on the judge's clock (e.g. {c:.4f} ms in {w:.4f} ms)"


def _jitter(empties: list[float], method: str) -> float:
    """What a round trip adds or takes away: the spread of the middle 80% of the empty requests, plus
    ABS_SLACK."""
    deciles = statistics.quantiles(empties, n=10) if len(empties) > 1 else [0.0] * 9
    return deciles[-1] - deciles[0] + ABS_SLACK[method]


# how much faster an implementation's samples may be than its audited samples (per call, medians)
AUDIT_BAND = {"cuda_graph": 0.10, "cuda_events_l2_flush": 0.15, "interpreter_wallclock": 0.5}
# the most ms of an audited request's wall time allowed as its wake-up (`wake_allowance`): beyond it a
# probe's time is no wake-up but a host's hiccup, or a process's work still running on the device
WAKE_MAX_MS = 1.0
# ... and never more than this multiple of the audited requests' own median claim. An allowance is a
# fixed time: beside requests that claim much less (a batch forced down to one short sample), it would
# let them claim almost nothing; with it, a sampler that claims C for work W is refused below
# (1 - band) * (W - WAKE_SHARE * C - jitter) even with no wake-up of its own: W / C at most
# (1 + WAKE_SHARE * (1 - band)) / (1 - band), about 3.2x on CUDA graphs, for a candidate whose process would
# wake instantly where its incumbent's takes up to WAKE_MAX_MS; within the band where both wake alike.
# 2: an honest autotuned vector_add at 2^20 claimed 0.297 ms beside a
# 0.45 ms wake-up on an H200 (1.5 times its claim); far smaller claims are refused, as they were before.
WAKE_SHARE = 2.0


def wake_allowance(audits: dict[str, list[dict]], empties: dict[str, list[float]]) -> float:
    """What an audited request may take beyond its claim and the overhead of the rounds' empty
    requests for following the judge's writes (ms): the smallest, over every audited implementation,
    of its wake-up probes' median wall time (`Auditor._wake`: an empty request of the same size after
    the same writes and handover) less the median of its empty requests; never below zero, never
    above WAKE_MAX_MS, and zero unless at least two implementations were probed, every one of them.

    A kernel process can tell a probe (empty) from an audit, and a sampler rewritten by the candidate
    can pad its own probes to earn room for audited requests that claim less than their work took;
    the smallest over the implementations is at most the incumbent's, whose process is out of the
    candidate's reach, so padding buys nothing, and a lone implementation's own probes allow nothing.
    What is left to a cheat is the difference between the incumbent's wake-up and its own (a request
    can be answered faster after a stop only by doing less of what every request does), at most
    WAKE_MAX_MS a request and WAKE_SHARE times its claim (`judge_audits`)."""
    wakes = []
    for label, rows in audits.items():
        probes = [r["wake_ms"] for r in rows if r["ok"] and r.get("wake_ms") is not None]
        if not probes:
            return 0.0
        wakes.append(statistics.median(probes) - statistics.median(empties[label]))
    if len(wakes) < 2:
        return 0.0
    return min(max(min(wakes), 0.0), WAKE_MAX_MS)


def judge_audits(verdict: dict, audits: dict[str, list[dict]], empties: dict[str, list[float]],
                 samples: dict[str, list[float]]) -> dict:
    """`verdict` (judge_timing's, ok) checked against the audited requests (`loop.judge.audit`), whose
    outputs prove that their samples did the work: each audited request's claim within its wall time
    (as any request's), the audited claims not far below their wall time beyond the overhead of an
    empty request of the same size (`empties`) and the wake-up every implementation's probes show
    (`wake_allowance`, at most WAKE_SHARE times their claim), and the other samples (`samples`, per
    call) not faster than the audited ones by more than AUDIT_BAND. Audits that found wrong outputs
    are the judge's other refusal (`incorrect`), not this one's. Adds per label {audits, audited_ms, timed_over_audited, audited_claim_ms,
    audited_wall_ms, shared_audit_offset_ms, audit_wake_ms (its own probes beyond the overhead, where
    probed)} and `audit_wake_allowed_ms`."""
    method = verdict["method"]
    per_label = TOLERANCES[method][0]
    medians = {label: _medians([r for r in rows if r["ok"]], samples[label]) for label, rows in audits.items()}
    wake = wake_allowance(audits, empties)
    verdict = {**verdict, "labels": {label: dict(v) for label, v in verdict["labels"].items()},
               "audit_wake_allowed_ms": round(wake, 5)}
    for label, rows in audits.items():
        rows = [r for r in rows if r["ok"]]
        if not rows:
            continue
        claims, walls = [r["claim_ms"] for r in rows], [r["wall_ms"] for r in rows]
        timed, audited = medians[label]
        shared = shared_offset(medians, label)
        jitter = _jitter(empties[label], method)
        net = statistics.median(walls) - statistics.median(empties[label])
        verdict["labels"].setdefault(label, {}).update(
            audits=len(rows), audited_ms=round(audited, 5), timed_over_audited=round(timed / max(audited, 1e-12), 4),
            audited_claim_ms=round(statistics.median(claims), 5), audited_wall_ms=round(statistics.median(walls), 5),
            shared_audit_offset_ms=round(shared, 5))
        probes = [r["wake_ms"] for r in rows if r.get("wake_ms") is not None]
        if probes:
            verdict["labels"][label]["audit_wake_ms"] = round(statistics.median(probes) - statistics.median(empties[label]), 5)
        audited -= shared
        if why := _over(claims, walls):
            return {**verdict, "ok": False, "label": label, "reason": f"{label}: audited: {why}"}
        allowed = min(wake, WAKE_SHARE * statistics.median(claims))
        if statistics.median(claims) < (net - allowed - jitter) * (1 - per_label):
            return {**verdict, "ok": False, "label": label, "reason": f"{label}: audited requests claimed {statistics.median(claims):.4f} ms, "
                    f"but took {net:.4f} ms beyond the overhead on the judge's clock"
                    + (f", {allowed:.4f} ms of it allowed as the wake-up after the judge's writes" if allowed else "")
                    + f" (band {per_label:.0%})"}
        if timed < audited * (1 - AUDIT_BAND[method]):
            return {**verdict, "ok": False, "label": label, "reason": f"{label}: timed at {timed:.5f} ms per call, but {audited:.5f} ms "
                    f"when the timed work was audited (band {AUDIT_BAND[method]:.0%}"
                    + (f", after {shared:.5f} ms that audits added to the other implementations" if shared else "")
                    + "): the samples no one checked did less work"}
    return verdict


def _medians(rows: list[dict], samples: list[float]) -> tuple[float, float] | None:
    """(median timed sample, median audited sample) of one implementation, None without an audit."""
    if not rows:
        return None
    audited = statistics.median(r["sample_ms"] for r in rows)
    return (statistics.median(samples) if samples else audited), audited


def shared_offset(medians: dict[str, tuple[float, float] | None], label: str) -> float:
    """What an audit adds to every implementation's samples alike, as the other implementations of
    the measurement show it: the smallest of their (audited - timed) per call, never below zero; 0.0
    where no other was audited. An audited request follows the judge's own writes of every input set;
    on an H100, timed eagerly after an L2 flush, audited calls of two honest softmax candidates
    (autotune, whole row) at 3200x16384 took 28-31 us more than their timed ones (0.11-0.14 ms calls:
    20-25%, past the band), and both were refused; their incumbent, a slower kernel, stayed within it.
    A sampler that skips work when no one checks shows its skipped work on top of what its partner
    shows, and is refused as before; the partner's offset is its own requests', which a stopped
    candidate does not run in."""
    others = [m[1] - m[0] for other, m in medians.items() if other != label and m is not None]
    return max(0.0, min(others)) if others else 0.0


# an implementation may not claim to move the spec's bytes faster than this multiple of the copy
# bandwidth the judge measured itself at the same shape
BEYOND_COPY = 2.0


def beyond_copy(gbps: dict[str, float | None], clone_gbps: float | None, limit: float = BEYOND_COPY) -> str | None:
    """Why a claimed timing is no timing of the work, or None: `gbps` (label -> the spec's bytes over
    the claimed median time) above `limit` times `clone_gbps`, the device copy bandwidth the judge
    measured in its own process. The judge checks outputs at a replay, not at the timed calls, and a
    kernel process that skips the work only while it is timed (its sampler rewritten) claims times its
    wall clock bears out; no kernel moves its bytes at twice the copy bandwidth, so such a claim is
    refused on the GPU. Smaller fakes, and compute-bound kernels, are not caught here (docs/architecture.md)."""
    if not clone_gbps:
        return None
    for label, rate in gbps.items():
        if rate and rate > limit * clone_gbps:
            return (f"{label}: claimed {rate:.0f} GB/s for the spec's bytes, over {limit:g}x the copy bandwidth the "
                    f"judge measured ({clone_gbps:.0f} GB/s): the timed calls cannot have done the work (or the spec's "
                    "bytes_moved counts more than the kernel moves)")
    return None


# How much slower the incumbent's requests right after the candidate's may be than its requests right
# after its own (the low end of the interval of their ratios' median, per method): the claimed-over-wall speedup band
# of TOLERANCES, the most of a speedup the judge already lets through unexplained, since slowing the
# incumbent is one more way to a speedup the candidate did not earn. Honest pairs differ by what a
# switch between two processes costs (a GPU context switch, caches the other process filled), far
# below these.
INTERFERENCE_BAND = {method: bands[1] for method, bands in TOLERANCES.items()}
INTERFERENCE_Z = 2.576  # as sure of the slowdown as the decision (loop.decide.rules.Policy.z) is of a kept speedup
INTERFERENCE_PAIRS = 5  # fewer pairs of requests than this (a short run) decide nothing


def interference(method: str, claimed: dict[str, list[float]], follows: dict[str, list[str | None]] | None,
                 pair: tuple[str, str] | None) -> dict | None:
    """Whether the candidate slowed the incumbent: None without a pair (or without the order of the
    requests), else {ok, reason, n, band, and with pairs enough after_candidate_ms, after_itself_ms,
    slower, lo, hi; `label`, the candidate, when refused}. `claimed`: label -> each request's claimed
    time (ms); `follows`: label -> the label of the request sent just before each of them (None for
    none, or one outside the pair). The incumbent's requests right after one of the candidate's and
    right after one of its own are paired in order (the rounds interleave them, so each pair is close
    in time); when the low end of a distribution-free interval of their ratios' median
    (`loop.common.stats.median_interval`: a load that comes and goes, as on a CPU shared with other
    work, widens it rather than passing for an effect) of how much slower the first are exceeds
    INTERFERENCE_BAND the candidate is refused: the work it leaves running after its answers (a
    kernel on its own GPU stream, which no stopped process tree stops; a thread or helper, where its
    tree is not stopped) slowed the incumbent it is timed against. Not symmetric: a slow incumbent
    cannot help the candidate."""
    if pair is None or follows is None:
        return None
    inc, cand = pair
    order = list(zip(claimed.get(inc, []), follows.get(inc, [])))
    after_cand = [c for c, before in order if before == cand]
    after_self = [c for c, before in order if before == inc]
    n = min(len(after_cand), len(after_self))
    band = INTERFERENCE_BAND[method]
    detail = {"ok": True, "reason": "", "n": n, "band": band}
    if n < INTERFERENCE_PAIRS or min(after_cand[:n] + after_self[:n]) <= 0:
        return detail
    ratios = [a / b for a, b in zip(after_cand[:n], after_self[:n])]
    slower = statistics.median(ratios)
    lo, hi = median_interval(ratios, INTERFERENCE_Z)
    detail.update(after_candidate_ms=round(statistics.median(after_cand[:n]), 5),
                  after_itself_ms=round(statistics.median(after_self[:n]), 5), slower=round(slower, 4),
                  lo=round(lo, 4), hi=round(hi, 4))
    if lo > 1 + band:
        detail.update(ok=False, label=cand, reason=f"{cand}: interferes: the {inc} ran {slower - 1:.0%} "
                      f"slower right after the {cand}'s requests than after its own ({n} pairs of requests, interval "
                      f"{lo:.3f}-{hi:.3f}x, band {band:.0%}): work the {cand} left running after "
                      "answering (a GPU stream, a thread, a helper) slowed what it is timed against")
    return detail
