"""Timer tampering: the timing functions are captured before any kernel code is imported, and a
job checks after each stage that the target has not replaced them (a candidate that patches the
clock would time itself)."""

from __future__ import annotations

import time

from loop.worker.failures import KernelFailure


def timer_identities(torch) -> dict:
    watched = {"time.perf_counter": (time, "perf_counter")}
    if hasattr(torch, "cuda"):
        watched.update({"torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event")})
        ev = torch.cuda.Event
        watched.update({"Event.record": (ev, "record"), "Event.elapsed_time": (ev, "elapsed_time"),
                        "CUDAGraph.replay": (torch.cuda.CUDAGraph, "replay")})
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in watched.items()}


def check_tamper(torch, watch: dict, stage: str):
    changed = [name for name, (owner, attr, orig) in watch.items() if getattr(owner, attr) is not orig]
    if changed:
        raise KernelFailure("incorrect", "candidate", f"timer tampering detected after {stage}: {', '.join(changed)} replaced")
