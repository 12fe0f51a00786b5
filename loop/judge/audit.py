"""Audits of timed requests. The timing loop runs in the kernel process, where the candidate's code
could have rewritten it (`loop.worker.sampler`): skip its calls while a sample is timed, time a
cheaper graph, time fewer calls than it reports. So at a few rounds the judge picks at random, a
timed request is audited:

- fresh inputs (from the system's random source: nothing in the job predicts them), made before the
  round and kept in the judge's own memory, are written into every input set the timed work
  reads, and its output buffers and the graph's own outputs (mapped from the kernel process) are
  poisoned, set after set, by the judge (no L2 flush: one left L2 full
  of dirty lines, and audited graph samples ran up to 8% slower than the rounds' on an H100; written
  in set order, L2 holds the last sets, as after a replay of the rounds);
- one request of the rounds' size is asked for, as in the rounds, timed on the judge's clock from
  the moment its inputs are handed over (nothing is asked of the process between the writes and
  this request, during which it is stopped: no request is untimed); its timed calls must have
  launched the target's kernels;
- right after the answer the judge reads what the timed calls wrote, where they wrote it (its own
  memory, or the kernel process's by IPC handle; under the interpreter a copy into the judge's
  slots, which the judge's clock sees): every set the graph used must be written (no NaN left of the
  poison), and some sets, chosen after the answer, are compared element by element with the
  judge's reference on the fresh inputs.

A CUDA graph makes one call per input set, so every timed call leaves its own outputs. An audit
proves that a sample of this length did the work; `corroborate.judge_audits` then refuses a claim
the audited samples do not bear out (their claims below their wall time, or the other samples
faster than the audited ones).

The first request after such a wait takes longer than the rounds' requests, for reasons no empty
request of the rounds shows (0.3-0.5 ms on an H100 and an H200, beside audited claims of 0.3 ms
for a small vector add). So after each audit the judge writes the same fresh inputs and poison
again, hands them over and times an empty request of the same size (the wake-up probe:
`wake_ms`); `corroborate.wake_allowance` takes the smallest over the implementations."""

from __future__ import annotations

import random
import statistics
import time

from loop.common.harness import Harness
from loop.common.outputs import as_outputs, compare_outputs, poison
from loop.judge.bridge import Bridge
from loop.judge.kernel_process import KernelFailure, KernelProcess, require_launches, sample_times

AUDITS = {"cuda": 4, "cpu": 3}  # audited requests per implementation and shape
MIN_AUDITS = 2  # ... however slow the spec's make_inputs
AUDIT_SETS = 4  # input sets compared element by element per audit (every set is checked for poison)
# seconds of the spec's make_inputs that the fresh inputs of one shape's audits may take: a spec that
# makes its inputs on the CPU (Liger's, 0.3 s a set at 8192x8192) gets fewer sets per graph, then
# fewer audits (never below MIN_AUDITS), and says so in the shape's notes
REFRESH_S = 1.5


def audits_for(device: str) -> int:
    return AUDITS["cuda" if device == "cuda" else "cpu"]


def set_budget(device: str, labels: int) -> float:
    """Seconds of make_inputs the input sets beyond those that exceed L2 may take: as many sets as
    every audit can refresh within REFRESH_S."""
    return REFRESH_S / (audits_for(device) * max(labels, 1))


class Auditor:
    """The audits of one timed shape. `live`: the input sets as the judge keeps them (shared with
    the kernel processes); `point`: (shape, dtype); `refs`: the reference's outputs at the first set
    (their shapes size the slots and bound what the judge maps)."""

    def __init__(self, torch, harness: Harness, bridge: Bridge, kernels: dict[str, KernelProcess], live: list[dict],
                 point: tuple, refs: list, device: str, set_s: float = 0.0, targets: set[str] = frozenset()):
        self.torch, self.harness, self.bridge, self.kernels = torch, harness, bridge, kernels
        self.live, self.point, self.refs, self.device = live, point, refs, device
        self.set_s = set_s  # seconds the spec's make_inputs took per input set
        self.targets = targets  # the labels whose timed calls must launch their own kernels
        self.rng = random.SystemRandom()
        self.used, self.method, self.calls = 1, "interpreter_wallclock", 1
        self.graph_outputs: dict[str, list[list]] = {}  # label -> per set, the graph's outputs mapped here
        self.slots: tuple[list, list] | None = None
        self.staged: dict[str, tuple] = {}  # label -> (fresh inputs, the eager set, references), until its audit
        self.most = 0

    def timed_as(self, method: str, calls: int, used: int, captured: dict[str, dict] | None) -> str | None:
        """The method the rounds use, over the first `used` input sets; a CUDA graph's outputs mapped
        once (they stay where they are from replay to replay). Returns why the graph cannot be audited
        (an output that is no tensor), or None."""
        self.method, self.calls, self.used = method, calls, used
        self.most = 4 * max([r.numel() for _, r in self.refs if isinstance(r, self.torch.Tensor)] or [0]) + 4096
        if self.device != "cuda":
            self.slots = self.bridge.slots(self.refs)
        for label, answer in (captured or {}).items():
            sets = answer.get("outputs")
            if not isinstance(sets, dict) or sorted(sets) != sorted(str(j) for j in range(used)):
                raise KernelFailure("runtime_error", label, "the kernel process did not say where its graph's outputs are")
            if any(i.get("kind") == "value" for items in sets.values() if isinstance(items, list) for i in items):
                return f"{label}: an output that is no tensor cannot be audited in a CUDA graph"
            self.bridge.label = label
            self.graph_outputs[label] = [self.bridge.outputs(sets[str(j)], [], self.live[j], self.most)
                                         for j in range(used)]
        return None

    def rounds(self, labels: list[str], rounds: int) -> dict[int, list[str]]:
        """At which rounds each implementation is audited (after the round's requests)."""
        rounds = max(rounds, 1)
        count = min(self.count(len(labels)), rounds)
        plan: dict[int, list[str]] = {}
        for label in labels:
            for r in self.rng.sample(range(rounds), count):
                plan.setdefault(r, []).append(label)
        return plan

    def count(self, labels: int) -> int:
        """Audits per implementation: AUDITS, fewer when refreshing every set would take more than
        REFRESH_S (never below MIN_AUDITS)."""
        affordable = int(REFRESH_S / max(self.used * self.set_s * labels, 1e-9))
        return min(audits_for(self.device), max(MIN_AUDITS, affordable))

    def note(self, labels: int) -> list[str]:
        """What the shape's notes say when the spec's make_inputs cut the audits short."""
        count = self.count(labels)
        if count >= audits_for(self.device):
            return []
        return [f"{count} audited requests per implementation over {self.used} input set(s): the spec's make_inputs "
                f"takes {self.set_s * 1e3:.0f} ms a set (make them on the device for more)"]

    def stage(self, label: str) -> None:
        """Before the round an audit follows: fresh inputs for every set the timed work reads, made in
        the judge's own memory (out of the kernel processes' reach), the sets to compare chosen and
        their references computed. Making inputs can take a second (a spec that makes them on the
        CPU) with the GPU idle; the round's requests run between this and the audit, so the audited
        sample finds the GPU as every sample of the rounds does (seen on an H100: audited samples
        right after a second of make_inputs ran 15-30% slower)."""
        torch, harness = self.torch, self.harness
        shape, dtype = self.point
        fresh = [harness.make_inputs(shape, dtype, self.rng.randrange(1 << 62)) for _ in range(self.used)]
        eager_set = self.rng.randrange(self.used) if self.method != "cuda_graph" else 0
        checked = (self.rng.sample(range(self.used), min(AUDIT_SETS, self.used)) if self.method == "cuda_graph"
                   else [eager_set])
        refs = {j: as_outputs(harness.reference(fresh[j])) for j in checked}
        self.staged[label] = (fresh, eager_set, refs)

    def audit(self, label: str, batch: int = 1) -> dict:
        """One audited request of `label` (staged before the round), of `batch` samples as the rounds'
        requests are (a kernel process cannot tell it from theirs by its size): {sample_ms (their
        median), claim_ms (all their work), wall_ms, ok, reason, and wake_ms when ok (`_wake`)}.
        Nothing is asked of the process between the writes of its fresh inputs and this request, and
        its wall time runs from their handover to the answer; the first request after a wait takes
        longer (0.3-0.5 ms on an H100), which a batch of the rounds' BATCH_MS of work holds within the
        band, but a batch of a few short graph samples (0.3 ms of claims) does not: the probe after it
        measures that cost."""
        fresh, eager_set, refs = self.staged.pop(label)
        kernel = self.kernels[label]
        self._write(label, fresh)
        started = time.perf_counter()  # the audited request is timed from the moment its inputs are handed over
        answer = kernel.request({"op": "sample", "first": eager_set, "n": batch,
                                 "audit": {"slots": self.slots[1] if self.slots else []}}, label)
        wall = (kernel.answered_at - started) * 1e3
        samples = sample_times(answer, batch, label)
        row = {"sample_ms": statistics.median(samples), "claim_ms": sum(samples) * self.calls, "wall_ms": wall,
               "ok": True, "reason": ""}
        self.bridge.label = label
        if self.method == "cuda_graph":
            written = dict(enumerate(self.graph_outputs[label]))
        else:
            written = {eager_set: self.bridge.outputs(answer.get("outputs"), self.slots[0] if self.slots else [],
                                                      self.live[eager_set], self.most)}
        row.update(self._judged(written, refs))
        if row["ok"] and label in self.targets:  # wrong outputs first (the stronger verdict), then how they came
            require_launches(answer, batch, label)
        if row["ok"]:
            row["wake_ms"] = self._wake(label, fresh, eager_set, batch)
        return row

    def _write(self, label: str, fresh: list[dict]) -> None:
        """The judge's writes before an audited request: `fresh` copied into every input set the timed
        work reads and the outputs poisoned, set after set (then the slots), and handed over (a device
        synchronize: the judge's own writes are not the kernel's time)."""
        torch, harness = self.torch, self.harness
        for j in range(self.used):
            for name, value in fresh[j].items():
                if isinstance(value, torch.Tensor) and name not in harness.outputs:
                    self.live[j][name].copy_(value)
            harness.prepare_call(self.live[j])
            for _, t in self.graph_outputs.get(label, [[]] * self.used)[j]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    poison(torch, t)
        for t in self.slots[0] if self.slots else []:
            poison(torch, t)
        self.bridge.handover()

    def _wake(self, label: str, fresh: list[dict], first: int, batch: int) -> float:
        """The wake-up probe after an audit: the judge's writes again (the same fresh inputs, the same
        poison), the same handover, then an empty request of the audit's size, timed as the audit was
        (ms). What it takes beyond the rounds' empty requests is what a request pays for following the
        judge's writes and a stopped wait, without any of the kernel's work. The kernel process can tell
        it from an audit (it is empty) and may pad it; `corroborate.wake_allowance` therefore never
        allows an implementation more than the smallest of every implementation's probes, the others'
        processes being out of its reach. It comes after the audit's outputs are judged, never before
        the audit: a process that found its outputs poisoned in an empty request before an audit of the
        same inputs could compute them there, untimed, and answer the audit from memory; after it, the
        next audit brings inputs of its own. The next request of the rounds overwrites the poison."""
        kernel = self.kernels[label]
        self._write(label, fresh)
        started = time.perf_counter()
        kernel.request({"op": "sample", "first": first, "n": batch, "empty": True}, label)
        return (kernel.answered_at - started) * 1e3

    def _judged(self, written: dict[int, list], refs: dict[int, list]) -> dict:
        """Every set's outputs written (no poison left), the chosen ones equal to the reference."""
        torch = self.torch
        atol, rtol = self.harness.tolerance(self.point[1])
        for j, outputs in written.items():
            for name, o in outputs:
                if isinstance(o, torch.Tensor) and o.is_floating_point() and o.device.type != "meta" \
                        and not bool(torch.isfinite(o).all()):
                    return {"ok": False, "reason": f"input set {j}: output {name or ''} has NaN/inf after an "
                            "audited timed request (unwritten by the timed calls)".replace("  ", " ")}
        for j, ref in refs.items():
            rc = compare_outputs(torch, written[j], ref, atol, rtol)
            if not rc["ok"]:
                return {"ok": False, "reason": f"input set {j} of an audited timed request: {rc.get('reason')}"}
        return {}


def verdict(rows: list[dict]) -> dict:
    """The audits of one implementation at one shape, as the result's `recheck` entry."""
    bad = next((r for r in rows if not r["ok"]), None)
    if bad is not None:
        return {"ok": False, "reason": bad["reason"], "audits": len(rows)}
    return {"ok": True, "audits": len(rows)}
