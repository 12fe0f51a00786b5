"""Correctness, judged: every check's inputs made and kept by the judge, the implementation run in
the kernel process on the judge's memory, its outputs compared here with the judge's reference."""

from __future__ import annotations

from loop.common import arena as shared
from loop.common.harness import Harness
from loop.common.jobs import seed_for
from loop.common.messages import JudgeJob
from loop.judge.bridge import Bridge
from loop.judge.kernel_process import KernelProcess


def remote_call(bridge: Bridge, kernel: KernelProcess, label: str):
    """The Harness's `call` for `label`: inputs shared (the harness's dict then holds the very
    tensors the kernel ran on, for the unmodified-inputs check), slots for the reference's outputs,
    one call in the kernel process, its outputs read from the judge's memory."""
    torch = bridge.torch

    def call(inputs: dict, refs: list) -> list:
        need = shared.tensor_bytes(inputs) + sum(
            shared.span_bytes(r) * 8 // max(r.element_size(), 1) + 256 for _, r in refs if isinstance(r, torch.Tensor))
        bridge.fit(need + 256 * (len(refs) + 1))
        encoded = bridge.share(inputs)
        slots, descs = bridge.slots(refs)
        bridge.handover()
        answer = kernel.request({"op": "call", "label": label, "inputs": encoded, "slots": descs}, label)
        return bridge.outputs(answer.get("outputs"), slots, inputs)

    return call


def check_all(harness: Harness, bridge: Bridge, kernels: dict[str, KernelProcess], job: JudgeJob, dtypes: list[str],
              shapes: list[tuple]) -> tuple[list[dict], dict, dict, dict | None]:
    """Every label of `job.check` at every dtype and shape, launches recorded per label.
    Returns (the checks, launched, called, the first failing check or None)."""
    checks: list[dict] = []
    launched: dict[str, list[str]] = {}
    called: dict[str, list[str]] = {}
    for label in job.check:
        bridge.label, kernel = label, kernels[label]
        call = remote_call(bridge, kernel, label)
        kernel.request({"op": "record", "label": label, "on": True}, label)
        for dtype in dtypes:
            for shape in shapes:
                rec = harness.check_with(call, label, shape, dtype, seed_for(job.seed, label, tuple(shape), dtype))
                checks.append(rec)
                if not rec["ok"]:
                    return checks, launched, called, rec
        seen = kernel.request({"op": "record", "label": label, "on": False}, label)
        launched[label] = sorted(str(x) for x in seen.get("launched", []))  # the target's kernels the checks ran
        called[label] = sorted(str(x) for x in seen.get("called", []))  # and its host functions
    return checks, launched, called, None
