"""Decision-check's plant: real extra work after the target's entry function, as a source file the
judge loads like any implementation (`planted_source`), and its size calibrated by judged
measurements of plain vs planted (`calibrate`), for `loop.tools.decision_check`."""

from __future__ import annotations

from loop import decide
from loop.common.jobs import MAX_PROBES, VERIFY_ROUNDS, seed_for
from loop.common.stats import geomean, paired
from loop.decide.check import next_size
from loop.run.progress import ProgressView

PLANT_START = {"cuda": 1 << 18, "cpu": 1 << 28}  # the second probe: scratch bytes = the arguments' (x1024 interpreted)
PLANT_MAX_SIZE = 1 << 40  # scratch elements per MiB of arguments, at most
PLANT_MAX_ELEMS = {"cuda": 1 << 29, "cpu": 1 << 26}  # 2 GiB / 256 MiB of fp32 scratch, at most
RETRIES = 2  # a calibration measurement the judge refused (uncorroborated) is made again, at most this often

PLANT = '''

# --- decision-check's plant, not part of the kernel: {entry}() as defined above, then real extra work
# on the same stream, an in-place negation of an fp32 scratch buffer of {size} elements per MiB of the
# call's tensor arguments (at least one, at most {cap}), made by the first call with arguments of
# that size (a check or a warm-up, before any timing).
import torch as _decision_check_torch


def _decision_check_plant(entry, size={size}, cap={cap}, device={device!r}):
    torch, scratch = _decision_check_torch, {{}}

    def planted(*args, **kwargs):
        out = entry(*args, **kwargs)
        nbytes = sum(v.numel() * v.element_size() for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))
        n = min(cap, max(1, -(-size * nbytes // (1 << 20))))
        if n not in scratch:
            scratch[n] = torch.ones(n, dtype=torch.float32, device=device)
        scratch[n].neg_()
        return out

    return planted


{entry} = _decision_check_plant({entry})
'''


def planted_source(source: str, entry: str, size: int, device: str) -> str:
    """The target's source with a plant after its entry function (see PLANT): a file the judge loads
    as an implementation like any other."""
    return source.rstrip("\n") + "\n" + PLANT.format(entry=entry, size=int(size), cap=PLANT_MAX_ELEMS[device], device=device)


class Stopped(Exception):
    """A measurement that ends the check: a crash, or any failure of the plant's calibration."""

    def __init__(self, outcome: dict, what: str = ""):
        super().__init__(outcome["message"])
        self.outcome, self.what = outcome, what


def calibrate(judged, plain: str, entry: str, frac: float, policy: decide.Policy, seed: int,
              view: ProgressView) -> tuple[list[dict], int]:
    """The plant's size, searched over judged measurements of plain vs planted so that the planted time
    over all shapes (their geometric mean) is `frac` longer; then measured again in VERIFY_ROUNDS."""
    device, tol = judged.device, max(0.15 * frac, 0.002)
    probes: list[tuple[int, float]] = []
    ratios: dict[int, list[float]] = {}  # size -> planted ratio per shape
    first: dict | None = None
    refused = 0

    def measure(size: int, *where) -> dict:
        nonlocal refused
        view.update(change="calibrating the plant", stage=f"size {size}")
        for again in range(RETRIES + 1):  # a timing refused here decides nothing: measured again, counted
            out = judged.measure(plain, planted_source(plain, entry, size, device), seed_for(seed, *where, again))
            if out["status"] != "uncorroborated" or again == RETRIES:
                break
            refused += 1
        if out["status"] != "ok":
            raise Stopped(out, f"plant calibration (size {size})")
        return out

    def probe(size: int) -> None:
        nonlocal first
        out = measure(size, "calibrate", size)
        first = first or out
        ratios[size] = [1.0 / c.speedup for c in _planted(out, policy)]
        probes.append((size, geomean(ratios[size]) - 1.0))

    probe(1)  # the floor: one extra launch on a few elements
    while len(probes) < MAX_PROBES and min(abs(e - frac) for _, e in probes) > tol:
        rate = (probes[1][1] - probes[0][1]) / (probes[1][0] - 1) if len(probes) > 1 else 0.0
        size = PLANT_START[device] if len(probes) == 1 and probes[0][1] < frac else next_size(probes, frac, PLANT_MAX_SIZE, rate)
        if size is None:
            break
        probe(size)
    size, effect = min(probes, key=lambda p: abs(p[1] - frac))
    pooled: list[tuple[list[float], list[float]]] = [([], []) for _ in first["timing"]["shapes"]]
    rounds: list[list[float]] = [[] for _ in pooled]
    for r in range(VERIFY_ROUNDS[device]):
        out = measure(size, "verify", r)
        for i, (s, c) in enumerate(zip(out["timing"]["shapes"], _planted(out, policy))):
            rounds[i].append(1.0 / c.speedup)
            pooled[i][0].extend(s["impls"]["incumbent"]["samples_ms"])
            pooled[i][1].extend(s["impls"]["candidate"]["samples_ms"])
    note = None
    if effect - frac > tol and size == 1:
        note = f"floor: one extra launch already adds {effect:.1%} (asked {frac:.1%}); the kernel is too short for a smaller plant"
    elif abs(effect - frac) > tol:
        note = f"closest of {len(probes)} probes: {effect:.1%} (asked {frac:.1%})"
    out = []
    for i, s in enumerate(first["timing"]["shapes"]):
        both = paired(s["shape"], *pooled[i], policy.z, 0.0)  # the planted ratio's interval: statistics only, no floor
        out.append({"shape": s["shape"], "asked": frac, "elems": size, "method": s["method"],
                    "kernel_ms": s["impls"]["incumbent"]["median_ms"],
                    "probes": [{"elems": n, "ratio": ratios[n][i]} for n, _ in probes],
                    "ratio": 1.0 / both.speedup, "lo": 1.0 / both.hi, "hi": 1.0 / both.lo, "samples": both.n,
                    "rounds": rounds[i], "refused": refused, "note": note})
    return out, size


def _planted(outcome: dict, policy: decide.Policy):
    """Per shape, the paired comparison with the plain version as incumbent: 1/speedup is planted/plain."""
    return [paired(s["shape"], s["impls"]["incumbent"]["samples_ms"], s["impls"]["candidate"]["samples_ms"], policy.z, 0.0)
            for s in outcome["timing"]["shapes"]]
