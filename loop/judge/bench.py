"""Timing, judged: the judge makes the input sets the timed calls rotate over (in its own memory,
shared with every kernel process), has each implementation's process warm up and take one sample
at a time, interleaved ABBA by the judge, audits a few timed requests at random (fresh inputs,
poisoned outputs, what the timed calls wrote compared with its own reference: `audit`), and checks
the claims against its own clock and the audited samples, and the incumbent's requests right after
the candidate's against those right after its own (`corroborate`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from loop.common import arena as shared
from loop.common import timing
from loop.common.harness import Harness
from loop.common.jobs import TIMING_METHODS, seed_for
from loop.common.messages import JudgeJob
from loop.common.outputs import as_outputs
from loop.judge import audit, choose_forms, corroborate
from loop.judge.audit import Auditor
from loop.judge.bridge import Bridge
from loop.judge.kernel_process import KernelProcess, ask_all, last_asked, require_launches, sample_times, time_of


class Bench:
    """The timed shapes of one judged measurement: one kernel process per implementation, their
    samples interleaved by the judge (ABBA per round), every request also timed on its clock."""

    def __init__(self, torch, harness: Harness, bridge: Bridge, kernels: dict[str, KernelProcess], job: JudgeJob,
                 pair: tuple[str, str] | None):
        self.torch, self.harness, self.bridge, self.kernels, self.job = torch, harness, bridge, kernels, job
        self.labels, self.pair = list(kernels), pair
        self.order = round_order(self.labels, pair)
        self.targets = set(job.labels())  # their timed calls must launch their kernels

    def ask(self, label: str, message: dict) -> dict:
        return self.kernels[label].request(message, label)

    def shape(self, shape: tuple, dtype: str, plan: timing.TimingPlan) -> dict:
        torch, harness, device = self.torch, self.harness, self.job.device
        base_seed = seed_for(self.job.seed, "bench", shape, dtype)
        started = time.perf_counter()
        first = harness.make_inputs(shape, dtype, base_seed)
        making = time.perf_counter() - started  # seconds of make_inputs so far
        in_bytes = sum(v.numel() * v.element_size() for v in first.values() if isinstance(v, torch.Tensor))
        nsets, notes = timing.rotating_sets(torch, in_bytes, device)
        most = timing.most_sets(in_bytes, nsets, device)  # a CUDA graph may use more: one set per call
        refs = as_outputs(harness.reference(first))
        slot_bytes = sum(r.numel() * 8 + 512 for _, r in refs if isinstance(r, torch.Tensor)) + 512 * (len(refs) + 1)
        self.bridge.fit(most * (shared.tensor_bytes(first) + 256 * (len(first) + 1)) + slot_bytes)
        live, encoded = [], []
        budget = audit.set_budget(device, len(self.labels))  # sets beyond nsets: as many as the audits can refresh
        for j in range(most):
            if j >= nsets and making > budget:
                break
            started = time.perf_counter()
            inputs = first if j == 0 else harness.make_inputs(shape, dtype, base_seed + j)
            encoded.append(self.bridge.share(inputs))
            live.append(inputs)
            making += time.perf_counter() - started
        del first
        self.bridge.handover()
        set_s = making / len(live)
        prepared = {lab: self.ask(lab, {"op": "prepare", "label": lab, "sets": encoded}) for lab in self.labels}
        auditor = Auditor(torch, harness, self.bridge, self.kernels, live, (shape, dtype), refs, device, set_s,
                          self.targets)
        method, calls, more = self.method(prepared, nsets, len(live), plan, auditor)
        more += auditor.note(len(self.labels))
        samples, corroboration, written, again = judged_rounds(
            lambda: self.rounds(plan, method, calls, prepared, auditor), method, self.pair)
        more += again
        tuned = {lab: self.ask(lab, {"op": "tuned", "label": lab}).get("tuned") for lab in self.labels}
        recheck = {lab: audit.verdict(written[lab]) for lab in self.labels}
        flops, nbytes = harness.spec.flops(shape, dtype), harness.spec.bytes_moved(shape, dtype)
        impls = {}
        for lab in self.labels:
            impls[lab] = {**timing.in_units(samples[lab], flops, nbytes), "peak_mem_mb": prepared[lab].get("peak_mem_mb")}
            if tuned[lab]:
                impls[lab]["tuned"] = tuned[lab]
        entry = {"shape": list(shape), "dtype": dtype, "method": method, "calls_per_sample": calls,
                 "notes": notes + more, "impls": impls, "recheck": recheck, "corroboration": corroboration,
                 "flops": flops, "bytes": nbytes}
        if device == "cuda" and self.job.clone_bandwidth:
            # in the judge's own process, by the shape's method (the clone's own method is in the result)
            entry["clone"] = timing.clone_bandwidth(torch, self.harness.clock, nbytes, plan, method)
            timing.add_clone_fractions(entry)
            checked = {lab: impls[lab].get("gbps") for lab in self.job.check if lab in impls}
            why = corroborate.beyond_copy(checked, (entry["clone"] or {}).get("gbps")) if corroboration["ok"] else None
            if why:
                entry["corroboration"] = {**corroboration, "ok": False, "reason": why}
            if timing.compute_bound(flops, nbytes):  # a dot kernel's roofline: the device's matmul rate, same run
                entry["matmul"] = timing.device_matmul_rate(torch, self.harness.clock, dtype, plan)
                timing.add_matmul_fractions(entry)
        return entry

    def method(self, prepared: dict, nsets: int, most: int, plan: timing.TimingPlan,
               auditor: Auditor) -> tuple[str, int, list[str]]:
        """How every implementation is timed at this shape: the same way for all (CUDA graphs of the
        same number of calls, one per input set, when `choose_method` says so and every capture works;
        else eagerly over `nsets` sets, as every implementation is where one of them cannot be captured:
        `choose_forms.eager_only`). The notes say why (`choose_method`'s reason first)."""
        if self.job.device != "cuda":
            auditor.timed_as("interpreter_wallclock", 1, 1, None)
            return "interpreter_wallclock", 1, []
        # the implementations under study decide; PyTorch's own baselines (`report --measure`, `compare`)
        # are timed the same way, and a slow eager one does not push everything off CUDA graphs
        deciding = [lab for lab in self.labels if lab not in set(self.job.torch_providers)] or self.labels
        calls_ms = {lab: time_of(prepared[lab], "call_ms", lab) for lab in self.labels}
        choice = choose_method(calls_ms, deciding, self.pair, plan.use_graphs, nsets, most, self.job.method,
                               choose_forms.eager_only(self.job.impls))
        notes = [choice.why]
        if choice.graphs:
            calls = choice.calls
            captured = ask_all(self.kernels, {lab: {"op": "capture", "calls": calls} for lab in self.labels})
            notes += [str(c["note"]) for c in captured.values() if c.get("note")]
            asked = " (CUDA graphs were asked for: method graph)" if choice.forced else ""
            if all(c.get("captured") for c in captured.values()):
                why = auditor.timed_as("cuda_graph", calls, calls, captured)
                if why is None:
                    return "cuda_graph", calls, notes
                notes.append(f"{why}: timed eagerly{asked}")
            else:
                failed = ", ".join(lab for lab, c in captured.items() if not c.get("captured"))
                notes.append(f"CUDA graph capture failed for {failed}: timed eagerly{asked}")
        for lab in self.labels:
            self.ask(lab, {"op": "eager", "sets": nsets})
        auditor.timed_as("cuda_events_l2_flush", 1, nsets, None)
        return "cuda_events_l2_flush", 1, notes

    def rounds(self, plan: timing.TimingPlan, method: str, calls: int, prepared: dict,
               auditor: Auditor) -> tuple[dict, dict, dict, dict, dict, dict]:
        """Samples of every implementation, interleaved ABBA a request at a time (a request takes a few
        samples back to back, BATCH_MS of work, so that the round trip is small beside it), each request
        also timed on the judge's clock; a few audited requests per implementation at rounds picked at
        random (each followed by its wake-up probe, `Auditor._wake`: the row's `wake_ms`); and each
        process's empty requests before and after the rounds (its overhead and
        jitter, for requests of the rounds' size). The order is `round_order`'s, so that the
        incumbent's requests come right after the candidate's in some rounds and right after its own
        in the others. Returns (samples, claimed and wall time per request, empties, audits, and per
        request the label of the request sent just before it: `follows`)."""
        samples: dict[str, list[float]] = {lab: [] for lab in self.labels}
        claims: dict[str, list[float]] = {lab: [] for lab in self.labels}
        walls: dict[str, list[float]] = {lab: [] for lab in self.labels}
        empties: dict[str, dict[str, list[float]]] = {"batch": {lab: [] for lab in self.labels}}
        audits: dict[str, list[dict]] = {lab: [] for lab in self.labels}
        follows: dict[str, list[str | None]] = {lab: [] for lab in self.labels}
        sample_ms = max(time_of(prepared[lab], "call_ms", lab) for lab in self.labels) * calls
        batch = 1 if method == "interpreter_wallclock" else int(min(corroborate.MAX_BATCH, max(
            1, corroborate.BATCH_MS // max(sample_ms, 1e-3))))
        self._empty(empties, batch)
        if method == "interpreter_wallclock":  # as long as the budget lasts, within min_reps..max_reps
            deadline = time.perf_counter() + plan.budget_s * len(self.labels)
            more = lambda n: n < plan.max_reps and (n < plan.min_reps or time.perf_counter() < deadline)  # noqa: E731
            audited = auditor.rounds(self.labels, plan.min_reps)
        else:  # as many samples as the budget allows by the estimated call time
            call_ms = sum(time_of(prepared[lab], "call_ms", lab) for lab in self.labels)
            reps = timing.rounds(plan, call_ms * calls / 1e3, len(self.labels))
            more = lambda n: n < reps  # noqa: E731
            audited = auditor.rounds(self.labels, -(-reps // batch))
        rnd = 0
        while more(rnd * batch):
            if method == "interpreter_wallclock":  # every sample audited (cheap at the interpreter's shapes)
                for lab in timing.abba(self.order, rnd):
                    auditor.stage(lab)
                    follows[lab].append(self._label_of(last_asked()))
                    row = auditor.audit(lab)
                    audits[lab].append(row)
                    samples[lab].append(row["sample_ms"])
                    claims[lab].append(row["claim_ms"])
                    walls[lab].append(row["wall_ms"])
                    self._empty(empties, batch, labels=[lab], times=1)  # the overhead of this moment of the host
                rnd += 1
                continue
            for lab in audited.get(rnd, []):
                auditor.stage(lab)
            for lab in timing.abba(self.order, rnd):
                follows[lab].append(self._label_of(last_asked()))
                started = time.perf_counter()
                got = self.ask(lab, {"op": "sample", "first": rnd * batch, "n": batch})
                walls[lab].append((self.kernels[lab].answered_at - started) * 1e3)  # not the judge's look for strays after it
                ms = sample_times(got, batch, lab)
                if lab in self.targets:
                    require_launches(got, batch, lab)
                samples[lab] += ms
                claims[lab].append(sum(ms) * calls)
            for lab in audited.get(rnd, []):
                audits[lab].append(auditor.audit(lab, batch))
            rnd += 1
        self._empty(empties, batch)
        return samples, claims, walls, empties, audits, follows

    def _label_of(self, kernel: KernelProcess | None) -> str | None:
        """The label of one of this measurement's kernel processes, None for none of them."""
        return next((lab for lab, k in self.kernels.items() if k is kernel), None)

    def _empty(self, empties: dict[str, dict[str, list[float]]], batch: int, labels: list[str] | None = None,
               times: int = corroborate.EMPTY_REQUESTS) -> None:
        """Empty requests of the rounds' size (audited ones are too): `times` per label, their wall
        times the overhead a request pays. Under the interpreter one also follows each audited sample,
        so that a host whose load changes during the rounds (a CPU shared with other work) gives the
        overhead of the rounds' own moments, not only of before and after them."""
        for _ in range(times):
            for lab in labels or self.labels:
                started = time.perf_counter()
                self.ask(lab, {"op": "sample", "first": 0, "n": batch, "empty": True})
                empties["batch"][lab].append((self.kernels[lab].answered_at - started) * 1e3)


# A shape whose timing the judge refused is timed again, once, from fresh rounds (new audited rounds
# drawn), and judged on those alone: a claim that holds only in the refused rounds was noise of the
# host (a process descheduled on a loaded machine, a busy PCIe link), while a faked claim is refused
# again. The price: a cheat near its band gets a second draw of the noise. Audited outputs of both
# rounds are compared.
TIMING_RETRIES = 1


def round_order(labels: list[str], pair: tuple[str, str] | None) -> list[str]:
    """The order of a round's requests (reversed every other round: `timing.abba`): the incumbent of
    a pair first, the others as given. ABBA with the incumbent at an end repeats it across every
    other round's boundary (incumbent, candidate | candidate, incumbent | incumbent, ...), so that
    some of its requests come right after the candidate's and as many right after its own, which
    `corroborate.interference` compares; in the middle of three or more it would never follow itself."""
    if pair is None or pair[0] not in labels:
        return list(labels)
    return [pair[0]] + [lab for lab in labels if lab != pair[0]]


def judged_rounds(take: Callable[[], tuple[dict, dict, dict, dict, dict, dict]], method: str,
                  pair: tuple[str, str] | None) -> tuple[dict, dict, dict[str, list[dict]], list[str]]:
    """Rounds from `take()` (`Bench.rounds`' tuple) and their verdict (`corroborate`: the claims
    against the judge's clock, the incumbent's requests after the candidate's against those after its
    own, then the audited requests), taken again up to
    TIMING_RETRIES times while refused. Returns the samples and verdict of the last rounds (with
    `refused_before`, the earlier refusal, when there was one), the audited outputs of every round
    taken (all of them compared) and a note per retry."""
    written: dict[str, list[dict]] = {}
    notes: list[str] = []
    refused = None
    for attempt in range(1 + TIMING_RETRIES):
        samples, claims, walls, empties, audits, follows = take()
        for lab, rows in audits.items():
            written[lab] = written.get(lab, []) + rows
        verdict = corroborate.judge_timing(method, claims, walls, empties["batch"], pair)
        slowed = corroborate.interference(method, claims, follows, pair)
        if slowed is not None and not slowed["ok"]:
            # first: an incumbent slowed by the candidate's leftover work fails the other checks too (its
            # audited requests, after the candidate's, slower than its others), and that is the candidate's doing
            verdict = {**verdict, "ok": False, "label": slowed["label"], "check": "interferes",
                       "reason": slowed["reason"]}
        elif verdict["ok"]:
            verdict = corroborate.judge_audits(verdict, audits, empties["batch"], samples)
        if slowed is not None:
            verdict = {**verdict, "interference": slowed}
        if refused is not None:
            verdict = {**verdict, "refused_before": refused}
        if verdict["ok"] or attempt == TIMING_RETRIES:  # passed, or the last refusal stands
            break
        refused = verdict["reason"]
        notes.append(f"timing refused ({refused[:200]}): the rounds taken again and judged on their own")
    return samples, verdict, written, notes


GRAPH_SAMPLE_LIMIT = 20  # a graph sample may take this many times the intended sample time, no more


@dataclass(frozen=True)
class MethodChoice:
    """How a shape is to be timed: CUDA graphs of `calls` calls each, or eagerly (calls 1); why, and
    whether the job asked for it (`forced`)."""

    graphs: bool
    calls: int
    why: str
    forced: bool = False


def choose_method(call_ms: dict[str, float], deciding: list[str], pair: tuple[str, str] | None, use_graphs: bool,
                  nsets: int, most: int, forced: str | None = None,
                  eager_only: dict[str, str] | None = None) -> MethodChoice:
    """The timing method of a shape, from each implementation's call time (ms).

    With a pair (incumbent, candidate), the incumbent's call decides, so that the same incumbent is
    timed the same way whatever candidate it meets: CUDA graphs when its call is shorter than
    GRAPH_BELOW_MS, of the calls its call time asks for; a longer call of another implementation is
    timed in a graph of as many calls, unless that graph would take more than GRAPH_SAMPLE_LIMIT times
    the intended sample (then every implementation is timed eagerly). Without a pair (a report's
    measurement, compare), the slowest call of the implementations in `deciding` decides. `forced`
    ("graph" or "eager", the job's `method`) overrides the choice, except that an implementation
    in `eager_only` (label -> why: a CUDA C solve that synchronises) makes every one eager, graphs
    asked for or not: its capture would fail or record a graph without the work."""
    if forced is not None and forced not in TIMING_METHODS:
        raise ValueError(f"unknown timing method {forced!r}; valid: {', '.join(TIMING_METHODS)}")
    if forced == "eager":
        return MethodChoice(False, 1, "timed eagerly: asked for (method eager)", True)
    if eager_only:
        labels = sorted(eager_only)
        asked = "; CUDA graphs were asked for (method graph) and not tried" if forced == "graph" else ""
        return MethodChoice(False, 1, f"{eager_only[labels[0]]} ({', '.join(labels)}){asked}", forced == "graph")
    incumbent = pair[0] if pair and pair[0] in call_ms else None
    basis = incumbent or max(deciding, key=lambda lab: call_ms[lab])
    base = call_ms[basis]
    calls = max(1, min(timing.calls_per_graph(base, nsets), most))
    if forced == "graph":
        return MethodChoice(True, calls, f"CUDA graphs of {calls} call(s): asked for (method graph); a call of "
                                         f"{basis} takes {base:.3f} ms", True)
    if not use_graphs:
        return MethodChoice(False, 1, "timed eagerly: the timing plan does not use CUDA graphs")
    whose = "the incumbent's call" if incumbent else f"the slowest call ({basis})"
    if base >= timing.GRAPH_BELOW_MS:
        return MethodChoice(False, 1, f"timed eagerly: {whose} takes {base:.3f} ms (CUDA graphs below "
                                      f"{timing.GRAPH_BELOW_MS} ms)")
    why = f"CUDA graphs of {calls} call(s): {whose} takes {base:.3f} ms (below {timing.GRAPH_BELOW_MS} ms)"
    if incumbent is None:
        return MethodChoice(True, calls, why)
    intended = max(timing.SAMPLE_TARGET_MS, base * calls)
    longest = max(call_ms, key=lambda lab: call_ms[lab])
    if call_ms[longest] * calls > GRAPH_SAMPLE_LIMIT * intended:
        return MethodChoice(False, 1, f"timed eagerly: a graph of {calls} call(s) of {longest} ({call_ms[longest]:.3f} "
                                      f"ms a call) would take {call_ms[longest] * calls:.1f} ms, over "
                                      f"{GRAPH_SAMPLE_LIMIT}x the {intended:.2f} ms sample {whose} asks for")
    slow = [lab for lab in call_ms if call_ms[lab] >= timing.GRAPH_BELOW_MS]
    if slow:
        why += "; " + ", ".join(f"{lab} ({call_ms[lab]:.3f} ms a call)" for lab in slow) + " in graphs of as many calls"
    return MethodChoice(True, calls, why)
