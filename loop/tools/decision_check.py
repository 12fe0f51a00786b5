"""`tileloop decision-check <target>`: how often the keep/revert decision is right, measured.

Scenarios, each repeated `--trials` times at every chosen shape:

* `aa`: candidate source identical to the incumbent (two copies of the target, loaded as two
  modules, as an iteration loads them). Any keep is a false keep.
* `slowdown`: the candidate is the target's `run()` followed by a *plant*: one extra device op
  (an in-place negation of an fp32 scratch buffer, on the same stream) whose size is calibrated
  by measurement so that it adds about `--plant` of the kernel's time. Detected = verdict
  `regression` (the whole interval of a shape lies below 1 - Policy.regression).
* `speedup`: the incumbent carries the plant, the candidate does not. Detected = `keep` (the
  interval's lower end clears 1: verdict improved, low_gain or marginal).

Every trial is measured by the timing rules of an iteration (`loop.worker.bench.bench_shape`: the same
input sets, ABBA interleaving, CUDA graphs or L2 flush, the check of what the timed run wrote,
fresh seeded inputs per trial), in one worker process: both sources are the user's own copies of
one target, so no judge stands between them (an iteration's judged measurement takes the same
samples one request at a time, each implementation in its own process), and decided exactly as an
iteration decides
(`loop.decide.check`: `loop.decide.comparisons` + `loop.decide.decide`, default Policy), per shape and, with more
than one shape, over all shapes at once (the loop's geometric mean). Only the same-run copy
bandwidth is skipped: it does not enter the decision. All trials run in one worker
(`python -m loop.worker`, job mode `decision-check`: `loop.worker.decision_job`), which appends one JSON line per trial to an events
file; this side follows that file for progress and decides from it afterwards.

The planted effect reported is measured, not asked: after calibration, `VERIFY_ROUNDS` separate
measurements of plain vs planted are pooled into the ratio and its 99% interval. A plant cannot
be cheaper than one extra launch: where that already exceeds `--plant` (very short kernels),
the report says so and the planted ratio is what it is.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from loop import backends as backend_registry
from loop import decide
from loop.common.errors import HarnessFailure, UserError
from loop.common.jobs import MAX_PROBES, VERIFY_ROUNDS
from loop.common.jobs import shape_text as _key
from loop.decide.check import SCENARIOS, metric, summarize, trial_rows
from loop.measure import probe as probing
from loop.measure.evaluate import CPU_TIMING
from loop.measure.launch import run_worker
from loop.records import gitops
from loop.records.perf_table import markdown_table
from loop.run.progress import ProgressView, plain_log
from loop.target.contract import load_kernel

ENV_KEYS = ("gpu", "capability", "driver", "cuda_runtime", "torch_version", "triton_version", "cutile_version")
UNIT_S = {"cuda": 3.0, "cpu": 6.0}  # generous wall time of one measurement (one shape, one pair), for the timeout


def parse_shape(text: str) -> tuple[int, ...]:
    """'4096x4096x4096' or '1048576' -> a shape tuple of positive integers."""
    parts = text.lower().replace("(", "").replace(")", "").replace(",", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape looks like 1048576 or 4096x4096x4096, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"a shape needs positive sizes, got {text!r}")
    return shape


def parse_scenarios(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in names if s not in SCENARIOS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"scenarios are a comma-separated subset of {','.join(SCENARIOS)}, got {text!r}")
    return names


def plant_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--plant is a fraction of the kernel's time in (0, 1], e.g. 0.03; got {text!r}")
    return value


# --------------------------------------------------------------------------- decisions and summary (pure)


def render(result: dict) -> str:
    def num(x, fmt=".4f"):
        return "" if x is None else format(x, fmt)

    lines = [f"# decision-check: {result['target']} ({result['backend']}, {result['device']}, {result['dtype']})", "",
             f"{result['trials_done']} of {result['trials']} trial(s) per scenario; policy: revert a shape slower by more "
             f"than {result['policy']['regression']:.0%} beyond noise, keep when the interval (z = {result['policy']['z']}, "
             f"at least +-{result['policy']['noise_floor']:.1%}) clears 1. Ratio = candidate time / incumbent time.", ""]
    if result["timings"] == "interpreter":
        lines += ["Timings are Triton-interpreter wall-clock on the CPU, not GPU numbers.", ""]
    if not result["complete"]:
        lines += [f"INCOMPLETE: {result['failure']['status']}: {result['failure']['message']}", ""]
    proof = result.get("proof") or {}
    if proof and not proof.get("ok"):
        lines += [f"BACKEND PROOF FAILED (an iteration would revert as guard_failed): {proof.get('detail')}", ""]
    rows = [{"scenario": s["scenario"], "shape": _key(s["shape"]), "trials": s["trials"],
             "decisions": ", ".join(f"{k} {v}" for k, v in s["decisions"].items()),
             "rate": f"{s['metric']} {s['hits']}/{s['trials']} = {s['rate']:.1%}",
             "95% CI": f"{s['rate_ci95'][0]:.1%}-{s['rate_ci95'][1]:.1%}",
             "median measured ratio": num(s["measured_ratio_median"]), "planted true ratio": num(s["true_ratio"])}
            for s in result["summary"]]
    lines += [markdown_table(rows) if rows else "(no trials finished)", ""]
    for scenario in result["scenarios"]:
        name, means, _ = metric(scenario, decide.Policy(**result["policy"]))
        lines.append(f"- {scenario}: {name} = {means}")
    cal = [{"shape": _key(c["shape"]), "method": c["method"], "kernel_ms": num(c["kernel_ms"], ".6f"),
            "plant elems": c["elems"], "asked": f"{c['asked']:.1%}",
            "measured planted ratio": f"{c['ratio']:.4f} ({c['lo']:.4f}-{c['hi']:.4f})",
            "rounds": " ".join(f"{r:.4f}" for r in c["rounds"]), "note": c.get("note") or ""}
           for c in result["calibration"]]
    if cal:
        lines += ["", "## Plant calibration", "",
                  "The plant is one in-place negation of an fp32 scratch buffer after `run()`; its size was chosen by "
                  "measurement, and its effect measured again in separate rounds (99% interval of the pooled paired ratios).",
                  "", markdown_table(cal)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- orchestrator


def read_events(path: Path) -> list[dict]:
    """The worker's events, in order; a torn last line (the worker was killed mid-write) is ignored."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


class _Follow(threading.Thread):
    """Hands each new complete line of the events file to `on_event` while the worker runs."""

    def __init__(self, path: Path, on_event: Callable[[dict], None], interval_s: float = 0.5):
        super().__init__(daemon=True, name="decision-check-progress")
        self.path, self.on_event, self.interval_s = path, on_event, interval_s
        self._halt, self._offset, self._buf = threading.Event(), 0, b""

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self.on_event(json.loads(line))

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.poll()


def run(target: str, *, trials: int, plant: float | None, scenarios: Sequence[str] | None, shapes: list | None,
        device: str, target_backend: str | None, dtype: str | None, seed: int, settings, workdir: Path,
        timeout_s: float | None = None, log: Callable[[str], None] | None = None,
        policy: decide.Policy | None = None) -> dict:
    """Run the check in one worker and return the result (the `--json` payload less schema/command).

    `policy` is the loop's default Policy unless given (tests pass a lower `suspicious`)."""
    log = log or plain_log
    policy = policy or decide.Policy()
    if scenarios is None:
        scenarios = SCENARIOS if plant else ("aa",)
    if plant is None and any(s != "aa" for s in scenarios):
        raise UserError("the slowdown and speedup scenarios need --plant FRACTION (e.g. --plant 0.03)")
    kernel, backend, probe = _kernel_and_backend(target, device, target_backend, settings, log)
    workdir.mkdir(parents=True, exist_ok=True)
    src = kernel.target_abs.read_text()
    impls = []
    for label in ("incumbent", "candidate"):  # two copies, two modules: as an iteration loads them
        copy = workdir / f"{kernel.target_abs.stem}__{label}.py"
        copy.write_text(src)
        impls.append({"label": label, "path": str(copy)})
    events_path = workdir / "decision-check.events.jsonl"
    events_path.unlink(missing_ok=True)
    job = {"mode": "decision-check", "spec": str(kernel.spec_abs), "target_dir": str(kernel.target_abs.parent),
           "device": device, "backend": backend, "impls": impls, "seed": seed, "trials": trials, "scenarios": list(scenarios),
           "plant": plant, "shapes": [list(s) for s in shapes] if shapes else None, "dtype": dtype,
           "timing": CPU_TIMING if device == "cpu" else {}, "verify_rounds": VERIFY_ROUNDS[device],
           "events": str(events_path), "policy": policy.to_json()}
    # a trial is one measurement per shape, two where a speedup over `policy.suspicious` is measured again
    units = trials * (len(scenarios) + ("speedup" in scenarios)) * max(2, len(shapes or ())) + (2 * (MAX_PROBES + VERIFY_ROUNDS[device]) if plant else 0)
    timeout = timeout_s or settings.worker_timeout_s + units * UNIT_S[device]
    view = ProgressView(f"decision-check {kernel.op}", trials, log)
    follow = _Follow(events_path, lambda ev: _report_event(view, ev, trials, policy))
    log(f"decision-check: {trials} trial(s) x {', '.join(scenarios)} on {kernel.target} ({backend}); "
        f"worker timeout {timeout:.0f}s")
    started = time.monotonic()
    follow.start()
    try:
        raw = run_worker(workdir, job, backend_registry.get(backend), settings, workdir / "cache", timeout_s=timeout,
                         name="decision-check")
    finally:
        follow.stop()
        view.close()
    status = raw.get("status")
    if status == "bad_input":
        raise UserError(raw.get("message", "bad input"))
    if status in ("spec_error", "harness_error"):
        raise HarnessFailure(f"decision-check worker: {status}: {raw.get('message')}\n{raw.get('log_tail', '')[-1500:]}")
    events = read_events(events_path)
    rows = [row for ev in events if ev.get("event") == "trial" for row in trial_rows(ev, policy)]
    if status != "ok" and not rows:
        raise UserError(f"the target failed before any trial finished: {status}: {raw.get('message', '')}"[:600],
                        hint=(raw.get("log_tail") or "").strip()[-300:] or None)
    out = _outcome(events, rows, raw, scenarios, policy, dtype)
    return {"target": str(kernel.target), "op": kernel.op, "language": kernel.language, "backend": backend,
            "device": device, "timings": backend_registry.get(backend).timing_label, "dtype": out["dtype"],
            "shapes": out["shapes"], "trials": trials, "trials_done": out["trials_done"], "complete": out["complete"],
            "failure": out["failure"], "plant": plant, "scenarios": list(scenarios), "seed": seed,
            "policy": policy.to_json(), "calibration": out["calibration"], "summary": out["summary"], "per_trial": rows,
            "proof": raw.get("proof"), "env": {k: probe.get(k) for k in ENV_KEYS},
            "wall_s": round(time.monotonic() - started, 1)}


def _kernel_and_backend(target: str, device: str, target_backend: str | None, settings, log):
    """The target's kernel, the backend to time (as `tileloop init` chooses it) and the environment probe."""
    root = gitops.root_or_folder(Path(target).resolve().parent)
    kernel = load_kernel(target, root)
    backend_registry.applicable(kernel.language, device, target_backend)
    log(f"decision-check: probing the environment ({device})")
    probe = probing.probe_environment(root, settings)
    if device == "cuda" and not probe.get("cuda_available"):
        raise UserError(f"no GPU available: {probe.get('cuda_reason')}", hint="pass --device cpu (interpreter timings)")
    _, backend = backend_registry.choose(kernel.language, device, probe, target_backend)
    return kernel, backend, probe


def _outcome(events: list[dict], rows: list[dict], raw: dict, scenarios: Sequence[str], policy: decide.Policy,
             dtype: str | None) -> dict:
    """What the worker's events and result say: dtype and shapes, trials done, calibration, the summary."""
    status = raw.get("status")
    calibration = [ev["calibration"] for ev in events if ev.get("event") == "calibration"]
    measured = Counter(ev["trial"] for ev in events if ev.get("event") == "trial")
    start = next((ev for ev in events if ev.get("event") == "start"), {})
    planted = {_key(c["shape"]): c["ratio"] for c in calibration}
    return {"dtype": start.get("dtype", dtype), "shapes": start.get("shapes", []),
            "trials_done": sum(1 for n in measured.values() if n == len(scenarios)),  # trials with every scenario measured
            "complete": status == "ok",
            "failure": None if status == "ok" else {"status": status, "message": raw.get("message", "")},
            "calibration": calibration, "summary": summarize(rows, scenarios, planted, policy)}


def _report_event(view, event: dict, trials: int, policy: decide.Policy) -> None:
    kind = event.get("event")
    if kind == "start":
        view.log(f"decision-check: shapes {', '.join(_key(s) for s in event['shapes'])}, dtype {event['dtype']}")
    elif kind == "calibration":
        c = event["calibration"]
        view.log(f"plant at {_key(c['shape'])}: {c['elems']} elements -> measured ratio {c['ratio']:.4f} "
                 f"({c['lo']:.4f}-{c['hi']:.4f}; asked {1 + c['asked']:.4f})" + (f"; {c['note']}" if c.get("note") else ""))
    elif kind == "calibrating":
        view.update(change="calibrating the plant", stage=_key(event["shape"]))
    elif kind == "trial":
        rows = trial_rows(event, policy)
        text = ", ".join(f"{_key(r['shape'])} {r['action']}/{r['verdict']}"
                         + (f" {r['ratio']:.4f}" if r["ratio"] else "") for r in rows)
        view.update(iteration=event["trial"] + 1, change=event["scenario"], stage="measured")
        view.log(f"trial {event['trial'] + 1}/{trials} {event['scenario']}: {text}")
