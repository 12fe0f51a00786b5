"""The decision-check job (`mode: decision-check` of `python -m loop.worker`).

Launched by `loop.tools.decision_check` through `loop.measure.launch.run_worker` (own process group,
hard timeout, own TRITON_CACHE_DIR), like every worker job. It

1. loads the spec and the two copies of the target (incumbent, candidate) by path,
2. with `plant`, calibrates per shape a plant: `scratch.neg_()` over an fp32 buffer after `run()`,
   sized by measurement (`next_size`) to add `plant` of the kernel's time, then measures the
   planted ratio again in `verify_rounds` separate rounds,
3. repeats, per trial and scenario (order rotated per trial), one measurement per shape through
   `loop.worker.bench.bench_shape` (the timing rules of an iteration, in this one process, fresh seeded
   inputs), plus a
   second one with new inputs where the loop would decide `remeasure` (a speedup over
   `Policy.suspicious`), as an iteration measures such a candidate again before deciding, and
4. appends one JSON line per event to the job's events file (start, calibration, trial), so
   the orchestrator can follow the run; the result file says how it ended.

Nothing here decides: the orchestrator decides each trial with the loop's own functions.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from loop.common.jobs import MAX_PROBES, seed_for, shape_text
from loop.common.stats import ShapeComparison, paired
from loop.common import timing
from loop.worker.bench import bench_shape
from loop.worker.correctness import Harness
from loop.worker.failures import ImplFailure, call_impl, load_module
from loop.worker.jobs import start_job
from loop.worker.proof import backend_proof
from loop.worker.tamper import check_tamper, timer_identities

PLANT_REF_ELEMS = {"cuda": 1 << 24, "cpu": 1 << 20}  # plant timed alone at this size: the starting slope
PLANT_MAX_ELEMS = {"cuda": 1 << 29, "cpu": 1 << 26}  # 2 GiB / 256 MiB of fp32 scratch
EVENTS_SCHEMA = "tileloop.decision-events/1"


class BadInput(Exception):
    """A shape or dtype that does not fit the spec (found in the worker, which reads the spec)."""


# --------------------------------------------------------------------------- plant size search (pure)


def next_size(probes: Sequence[tuple[int, float]], frac: float, max_elems: int, rate: float) -> int | None:
    """The next scratch size (elements) to try so that the plant adds `frac` to the kernel's time.

    `probes` are (elements, measured effect) pairs, effect = planted/plain - 1; `rate` is the effect
    of one element estimated from the plant timed alone (the slope before two sizes are measured).
    An extra op costs about a + b * elements, so between a size below and a size above the target
    the next size interpolates (kept strictly inside that bracket); with sizes below only, it
    extrapolates with the measured slope (at most 64x at once) or the estimate. None: no size can
    do better (one element already overshoots, the cap is reached, or the bracket is closed).
    """
    tried = {n for n, _ in probes}
    effect = dict(probes)
    above = [n for n, e in probes if e >= frac]
    n_hi = min(above) if above else None
    below = sorted((n, e) for n, e in probes if e < frac and (n_hi is None or n < n_hi))
    if not below:
        if n_hi is None or n_hi <= 1:
            return None
        n = max(1, n_hi // 16)
        return None if n in tried else n
    n_lo, e_lo = below[-1]
    if n_hi is None:
        if n_lo >= max_elems:
            return None
        slope, low, high = rate, 2 * n_lo, max_elems
        if len(below) >= 2 and below[-1][1] > below[-2][1]:
            (n_a, e_a), (n_b, e_b) = below[-2:]
            slope, low, high = (e_b - e_a) / (n_b - n_a), n_lo + max(1, n_lo // 4), 64 * n_lo
        guess = n_lo + (frac - e_lo) / slope if slope > 0 else 16 * n_lo
        n = int(round(min(max(guess, low), high, max_elems)))
    else:
        if n_hi - n_lo <= 1:
            return None
        guess = n_lo + (frac - e_lo) * (n_hi - n_lo) / (effect[n_hi] - e_lo)
        n = int(round(min(max(guess, n_lo + 1), n_hi - 1)))
        if n in tried:
            n = int(round(math.sqrt(n_lo * n_hi)))
    return None if n in tried else n


# --------------------------------------------------------------------------- measurement


class Plant:
    """Real device work after a call: `scratch.neg_()` over `elems` fp32 elements, on the same stream
    (captured into the CUDA graph with the kernel when the loop times with graphs)."""

    def __init__(self, torch, device: str, elems: int):
        self.elems = elems
        self.scratch = torch.ones(elems, dtype=torch.float32, device=device)

    def wrap(self, run):
        """A stand-in that calls `run` (an entry point), then the plant."""
        scratch = self.scratch

        def planted_run(**inputs):
            out = run(**inputs)
            scratch.neg_()
            return out
        return SimpleNamespace(run=planted_run)


class _Events:
    def __init__(self, path: Path):
        self.path = path

    def write(self, **event) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"schema": EVENTS_SCHEMA, **event}) + "\n")
            fh.flush()


def _measure(torch, harness, pair: dict, job: dict, seed: int, shape: tuple, dtype: str, plan) -> dict:
    """One measurement of an (incumbent, candidate) pair exactly as an iteration's worker makes it."""
    entry = bench_shape(torch, harness, pair, {"device": job["device"], "seed": seed, "clone_bandwidth": False},
                        shape, dtype, plan)
    return {"shape": entry["shape"], "dtype": entry["dtype"], "method": entry["method"],
            "calls_per_sample": entry["calls_per_sample"], "notes": entry["notes"],
            "impls": {lab: {"samples_ms": v["samples_ms"], "median_ms": v["median_ms"]} for lab, v in entry["impls"].items()},
            "recheck": {lab: {k: v for k, v in rc.items() if k in ("ok", "reason")} for lab, rc in entry["recheck"].items()}}


def remeasure_wanted(entries: Sequence[dict], policy: dict) -> bool:
    """Whether the loop would measure this trial again: some decision of it (per shape, or over all
    shapes) would be `remeasure`. That is the rule of `loop.decide.decide` read off the paired
    comparisons: no timed output wrong, a speedup over `suspicious` at a shape whose interval is not
    a regression, or over all shapes (several) when no shape is a regression. The worker only
    triggers the second measurement; the orchestrator decides every trial with the loop's own
    functions (a test holds this trigger to them)."""
    if any(not rc["ok"] for e in entries for rc in e["recheck"].values()):
        return False
    comps = [paired(e["shape"], e["impls"]["incumbent"]["samples_ms"], e["impls"]["candidate"]["samples_ms"],
                    policy["z"], policy["noise_floor"]) for e in entries]
    floor, limit = 1.0 - policy["regression"], policy["suspicious"]
    if any(c.hi >= floor and c.speedup > limit for c in comps):
        return True
    overall = math.exp(sum(c.log_effect for c in comps) / len(comps))
    return len(comps) > 1 and all(c.hi >= floor for c in comps) and max(overall, *(c.speedup for c in comps)) > limit

def _planted_ratio(entry: dict, z: float, floor: float) -> ShapeComparison:
    """Paired comparison with the plain version as incumbent: 1/speedup is planted time / plain time."""
    for lab, rc in entry["recheck"].items():
        if not rc["ok"]:
            raise ImplFailure("incorrect", lab, f"plant calibration: output of the timed run is wrong: {rc.get('reason')}")
    return paired(entry["shape"], entry["impls"]["incumbent"]["samples_ms"], entry["impls"]["candidate"]["samples_ms"],
                  z, floor)

def _plant_ms_per_elem(torch, harness, device: str, plan) -> float:
    n = PLANT_REF_ELEMS[device]
    scratch = torch.ones(n, dtype=torch.float32, device=device)
    if device == "cuda":
        res = timing.time_gpu(torch, harness.clock, {"plant": lambda j: scratch.neg_()}, 1, plan)
    else:
        res = timing.time_cpu({"plant": scratch.neg_}, plan)
    return statistics.median(res.samples_ms["plant"]) / n


def calibrate(torch, harness, modules: dict, job: dict, shape: tuple, dtype: str, plan, events: _Events) -> tuple[dict, Plant]:
    device, frac, z = job["device"], float(job["plant"]), float(job["policy"]["z"])
    tol = max(0.15 * frac, 0.002)
    plain, cand = modules["incumbent"], modules["candidate"]
    probes: list[tuple[int, float]] = []
    kernel_ms, method = None, None

    def probe(n: int) -> None:
        nonlocal kernel_ms, method
        events.write(event="calibrating", shape=list(shape), elems=n)
        entry = _measure(torch, harness, {"incumbent": plain, "candidate": Plant(torch, device, n).wrap(harness.spec.entry(cand))}, job,
                         seed_for(job["seed"], "calibrate", shape, n), shape, dtype, plan)
        probes.append((n, 1.0 / _planted_ratio(entry, z, 0.0).speedup - 1.0))
        if kernel_ms is None:
            kernel_ms, method = entry["impls"]["incumbent"]["median_ms"], entry["method"]

    probe(1)  # the floor: one extra launch on one element
    rate = _plant_ms_per_elem(torch, harness, device, plan) / kernel_ms
    while len(probes) < MAX_PROBES and min(abs(e - frac) for _, e in probes) > tol:
        n = next_size(probes, frac, PLANT_MAX_ELEMS[device], rate)
        if n is None:
            break
        probe(n)
    elems, effect = min(probes, key=lambda p: abs(p[1] - frac))
    plant = Plant(torch, device, elems)
    inc_all, cand_all, rounds = [], [], []
    for r in range(int(job["verify_rounds"])):
        entry = _measure(torch, harness, {"incumbent": plain, "candidate": plant.wrap(harness.spec.entry(cand))}, job,
                         seed_for(job["seed"], "verify", shape, r), shape, dtype, plan)
        rounds.append(1.0 / _planted_ratio(entry, z, 0.0).speedup)
        inc_all += entry["impls"]["incumbent"]["samples_ms"]
        cand_all += entry["impls"]["candidate"]["samples_ms"]
    pooled = paired(shape, inc_all, cand_all, z, 0.0)  # the planted ratio's interval: statistics only, no floor
    note = None
    if effect - frac > tol and elems == 1:
        note = f"floor: one extra launch already adds {effect:.1%} (asked {frac:.1%}); the kernel is too short for a smaller plant"
    elif frac - effect > tol and elems >= PLANT_MAX_ELEMS[device]:
        note = f"cap: the largest plant ({elems} elements) adds {effect:.1%} (asked {frac:.1%})"
    elif abs(effect - frac) > tol:
        note = f"closest of {len(probes)} probes: {effect:.1%} (asked {frac:.1%})"
    cal = {"shape": list(shape), "asked": frac, "elems": elems, "method": method, "kernel_ms": kernel_ms,
           "probes": [{"elems": n, "ratio": 1.0 + e} for n, e in probes],
           "ratio": 1.0 / pooled.speedup, "lo": 1.0 / pooled.hi, "hi": 1.0 / pooled.lo, "samples": pooled.n,
           "rounds": rounds, "note": note}
    return cal, plant


def _bench_dtype(spec, job: dict) -> str:
    """The dtype an iteration times (the spec's first; bfloat16 skipped on the interpreter), or --dtype."""
    cpu = job["device"] == "cpu"
    if job.get("dtype"):
        if job["dtype"] not in spec.dtypes:
            raise BadInput(f"--dtype {job['dtype']} is not one of the spec's DTYPES: {', '.join(spec.dtypes)}")
        if cpu and job["dtype"] == "bfloat16":
            raise BadInput("--dtype bfloat16 cannot run under the Triton interpreter (--device cpu)")
        return job["dtype"]
    usable = [d for d in spec.dtypes if not (cpu and d == "bfloat16")]
    if not usable:
        raise BadInput("no dtype of the spec runs under the Triton interpreter (bfloat16 only)")
    return usable[0]


def _shapes(spec, job: dict) -> list[tuple]:
    """--shapes, else the smallest and the largest of the shapes an iteration times on this device."""
    if job["device"] == "cuda":
        timed = list(spec.benchmark_shapes)
    else:
        timed = list(spec.interpreter_shapes)
    timed = [tuple(s) for s in timed]
    if job.get("shapes"):
        ranks = {len(s) for s in timed}
        for s in job["shapes"]:
            if len(s) not in ranks:
                raise BadInput(f"shape {shape_text(s)} has {len(s)} dimension(s); the spec's shapes have "
                               f"{' or '.join(map(str, sorted(ranks)))}, e.g. {shape_text(timed[0])}")
        return [tuple(s) for s in job["shapes"]]
    by_size = sorted(timed, key=math.prod)
    return list(dict.fromkeys([by_size[0], by_size[-1]]))


def worker_job(job: dict) -> dict:
    import torch

    device = job["device"]
    clock = timing._Clock(torch) if device == "cuda" else None  # before any kernel code is imported
    tamper_watch = timer_identities(torch)
    spec = start_job(torch, job)
    harness = Harness(torch, spec, device, clock)
    modules = {impl["label"]: call_impl(impl["label"], "import", load_module, f"tileloop_impl_{impl['label']}",
                                          Path(impl["path"])) for impl in job["impls"]}
    check_tamper(torch, tamper_watch, "import")
    dtype, shapes = _bench_dtype(spec, job), _shapes(spec, job)
    plan = timing.TimingPlan(**job.get("timing", {}))
    events = _Events(Path(job["events"]))
    events.write(event="start", shapes=[list(s) for s in shapes], dtype=dtype, scenarios=job["scenarios"],
                 trials=job["trials"])
    plants: dict[tuple, Plant] = {}
    if job.get("plant"):
        for shape in shapes:
            cal, plants[shape] = calibrate(torch, harness, modules, job, shape, dtype, plan, events)
            events.write(event="calibration", calibration=cal)
    scenarios = list(job["scenarios"])
    policy = job["policy"]  # the orchestrator's
    for t in range(job["trials"]):
        k = t % len(scenarios)  # rotate the order, so no scenario always runs first after a pause
        for scenario in scenarios[k:] + scenarios[:k]:
            entries, pairs = [], []
            for shape in shapes:
                inc, cand = modules["incumbent"], modules["candidate"]
                if scenario == "slowdown":
                    cand = plants[shape].wrap(harness.spec.entry(cand))
                elif scenario == "speedup":
                    inc = plants[shape].wrap(harness.spec.entry(inc))
                pairs.append({"incumbent": inc, "candidate": cand})
                entries.append(_measure(torch, harness, pairs[-1], job,
                                        seed_for(job["seed"], "trial", t, scenario), shape, dtype, plan))
            again = None
            if remeasure_wanted(entries, policy):
                again = [_measure(torch, harness, pairs[i], job, seed_for(job["seed"], "remeasure", t, scenario),
                                  shape, dtype, plan) for i, shape in enumerate(shapes)]
            events.write(event="trial", trial=t, scenario=scenario, timing={"shapes": entries},
                         remeasure={"shapes": again} if again else None)
    check_tamper(torch, tamper_watch, "timing")
    return {"status": "ok", "dtype": dtype, "shapes": [list(s) for s in shapes], "trials_done": job["trials"],
            "proof": backend_proof(modules, job["backend"])}
