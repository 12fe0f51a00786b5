"""The backend interface: what a backend is (its language, device, environment, availability check
and what its timings are), and what a probe says about its availability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""

    def to_json(self) -> dict:
        return {"available": self.available, "reason": self.reason}


@dataclass(frozen=True)
class Backend:
    name: str
    language: str
    device: str  # "cuda" or "cpu"
    env: tuple[tuple[str, str], ...]  # set for its workers
    unset: tuple[str, ...]  # removed from its workers' environment
    check: Callable[[dict], Availability]  # probe -> availability
    timing_label: str  # what its numbers are: "gpu" or "interpreter"
    explicit: tuple[str, ...] = ()  # always set for its workers: the user's value, else "0" (never inherited by accident)

    def environment(self, user_env: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        for key in self.explicit:
            env[key] = (user_env or {}).get(key, "0")
        return env


def cuda_missing(probe: dict) -> Availability | None:
    """Unavailable with the probe's reason when no CUDA device is visible, else None."""
    if not probe.get("cuda_available"):
        return Availability(False, probe.get("cuda_reason") or "no CUDA device visible")
    return None
