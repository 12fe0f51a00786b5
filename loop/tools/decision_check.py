"""`tileloop decision-check <target>`: how often the loop's keep/revert decision is right, measured.

Scenarios, each repeated `--trials` times:

* `aa`: candidate source identical to the incumbent (two copies of the target). Any keep is a false keep.
* `slowdown`: the candidate is the target with a *plant* (`loop.tools.plant`): its entry function, then
  one extra device op on the same stream (an in-place negation of an fp32 scratch buffer, in
  proportion to the bytes of the call's tensor arguments), the proportion calibrated by measurement
  so that it adds about `--plant` of the kernel's time over the shapes timed. Detected = verdict
  `regression` (the whole interval lies below 1 - Policy.regression).
* `speedup`: the incumbent carries the plant, the candidate does not. Detected = `keep` (the
  interval's lower end clears 1: verdict improved, low_gain or marginal).
* `honest`: the candidates are the playbook's own for the target (`loop.tools.campaign`), one per
  trial in turn, each judged against the target as an iteration judges it. Counted: `uncorroborated`
  refusals (the judge's refusals of a timing, which an honest change must never draw).

`--method graph|eager` forces the timing method of every measurement (the job's `method`; a graph
that cannot be captured is timed eagerly and counted as not forced); `--l2-multiples` times shapes
whose inputs and outputs take those multiples of the device's L2. The counts per scenario and timing
method (`counts`) give the number the campaign is for: honest candidates and A/A pairs refused
`uncorroborated`, over their judged trials.

Every trial, and every measurement of the calibration, is one judged measurement of the target
backend exactly as an iteration makes it: incumbent and candidate written as two implementation
files, the job an iteration writes (`loop.measure.evaluate.measure`; the shapes and dtype added only
when asked), the judge (`python -m loop.judge`, forked from a judge host as in an unattended run),
one kernel process per implementation, the candidate checked at every correctness shape and dtype,
the interleaved rounds, the audits of timed requests, the corroboration on the judge's clock and the
backend proof. Its result is typed as an iteration types it (`outcome`: `to_backend_result`), the change's
measurability and coverage are computed as an iteration computes them, and the decision is the
loop's (`loop.decide.judged_decision`: `decide.comparisons` + `decide.decide`, the loop's
default Policy), a speedup over 3x measured again first. So a false keep counted here is one the
loop would make, and an honest candidate refused (`uncorroborated`) is counted as the loop would
refuse it. Not run: the compile gate and the guard backends (the kernels are the incumbent's).

The planted effect reported is measured, not asked: after calibration, `VERIFY_ROUNDS` separate
judged measurements of plain vs planted are pooled into each shape's ratio and its 99% interval. A
plant cannot be cheaper than one extra launch: where that already exceeds `--plant` (very short
kernels), the report says so and the planted ratio is what it is.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from loop import backends as backend_registry
from loop import decide
from loop.common.errors import UserError
from loop.common.jobs import TIMING_METHODS, seed_for
from loop.common.jobs import shape_text as _key
from loop.decide.check import PLANTED, SCENARIOS, metric, summarize, trial_rows, wants_again
from loop.measure import probe as probing
from loop.measure.evaluate import CPU_TIMING, to_backend_result
from loop.measure.launch import run_worker, start_judge_host
from loop.records import gitops
from loop.records.perf_table import markdown_table
from loop.run.progress import ProgressView, plain_log
from loop.target.change import describe
from loop.target.contract import Kernel, load_kernel, spec_dtypes, spec_entry
from loop.target.coverage import unexercised
from loop.tools.plant import Stopped, calibrate, planted_source
from loop.tools.campaign import first_dtype, honest_candidates, render_counts, size_for_l2, tally

ENV_KEYS = ("gpu", "capability", "driver", "cuda_runtime", "torch_version", "triton_version", "cutile_version")


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


METHODS = ("auto", *TIMING_METHODS)  # --method: auto is the judge's own choice (`loop.judge.bench.choose_method`)
ROUTINE_SCENARIOS = ("aa", "slowdown", "speedup")  # what --plant runs when no --scenarios are named


def parse_multiples(text: str) -> tuple[float, ...]:
    """'0.25,1,4,10' -> positive multiples of the L2 (the bytes of a shape's inputs and outputs)."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(not 0 < v <= 1000 for v in values):
        raise argparse.ArgumentTypeError(f"--l2-multiples is a comma-separated list of positive numbers, e.g. "
                                         f"0.25,1,4,10; got {text!r}")
    return tuple(dict.fromkeys(values))


def plant_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--plant is a fraction of the kernel's time in (0, 1], e.g. 0.03; got {text!r}")
    return value


def render(result: dict) -> str:
    def num(x, fmt=".4f"):
        return "" if x is None else format(x, fmt)

    lines = [f"# decision-check: {result['target']} ({result['backend']}, {result['device']}, {result['dtype']})", "",
             f"{result['trials_done']} of {result['trials']} trial(s) per scenario; policy: revert a shape slower by more "
             f"than {result['policy']['regression']:.0%} beyond noise, keep when the interval (z = {result['policy']['z']}, "
             f"at least +-{result['policy']['noise_floor']:.1%}) clears 1. Ratio = candidate time / incumbent time.", "",
             f"Measured by the {result['measured_by']}: {result['judged_measurements']} judged measurement(s), each as an "
             "iteration's (a kernel process per implementation, correctness checks, audits, corroboration), decided "
             "by the loop's own rules.", ""]
    if result["timings"] == "interpreter":
        lines += ["Timings are Triton-interpreter wall-clock on the CPU, not GPU numbers."
                  + (f" --method {result['method']} has no effect there." if result.get("method", "auto") != "auto" else ""),
                  ""]
    if not result["complete"]:
        lines += [f"INCOMPLETE: {result['failure']['status']}: {result['failure']['message']}", ""]
    proof = result.get("proof") or {}
    if proof and not proof.get("ok"):
        lines += [f"BACKEND PROOF FAILED (an iteration reverts as guard_failed): {proof.get('detail')}", ""]
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
    lines += render_counts(result)
    cal = [{"shape": _key(c["shape"]), "method": c["method"], "kernel_ms": num(c["kernel_ms"], ".6f"),
            "plant size": c["elems"], "asked": f"{c['asked']:.1%}",
            "measured planted ratio": f"{c['ratio']:.4f} ({c['lo']:.4f}-{c['hi']:.4f})",
            "rounds": " ".join(f"{r:.4f}" for r in c["rounds"]), "note": c.get("note") or ""}
           for c in result["calibration"]]
    if cal:
        lines += ["", "## Plant calibration", "",
                  "The plant is one in-place negation of an fp32 scratch buffer after the entry function, of `plant size` "
                  "elements per MiB of the call's tensor arguments; the size was chosen by judged measurements over all "
                  "shapes, and its effect measured again in separate ones (99% interval of the pooled paired ratios).",
                  "", markdown_table(cal)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- judged measurements


class Judged:
    """The judged measurements of one decision-check: each writes its two implementation files and the
    job an iteration writes for its target backend, runs the judge (from the host, where there is
    one) and returns its outcome, typed and described as an iteration types and describes it."""

    def __init__(self, kernel: Kernel, backend: str, device: str, settings, workdir: Path, shapes: list | None,
                 dtype: str | None, host=None, timeout_s: float | None = None, method: str = "auto"):
        self.kernel, self.backend, self.device, self.settings = kernel, backend, device, settings
        self.workdir, self.shapes, self.dtype, self.host, self.timeout_s = workdir, shapes, dtype, host, timeout_s
        self.method = method  # "auto": the judge chooses; "graph" / "eager": the job asks for it
        self.count, self.timed, self.proof = 0, None, None  # timed: (dtype, shapes) the judge timed

    def job(self, impls: dict[str, Path], seed: int) -> dict:
        """`loop.measure.evaluate.measure`'s job for the target backend (a test holds the two together)."""
        job = {"spec": str(self.kernel.spec_abs), "target_dir": str(self.kernel.target_abs.parent),
               "target": str(self.kernel.target_abs), "device": self.device, "backend": self.backend,
               "impls": [{"label": k, "path": str(v)} for k, v in impls.items()], "check": ["candidate"],
               "seed": seed_for(seed, self.backend), "bench": True, "timing": CPU_TIMING if self.device == "cpu" else {}}
        if self.shapes:
            job["bench_shapes"] = [list(s) for s in self.shapes]
        if self.dtype:
            job["bench_dtype"] = self.dtype
        if self.method != "auto":
            job["method"] = self.method
        return job

    def measure(self, inc_src: str, cand_src: str, seed: int) -> dict:
        self.count += 1
        folder = self.workdir / f"m{self.count:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        impls = {}
        for label, src in (("incumbent", inc_src), ("candidate", cand_src)):
            impls[label] = folder / f"{self.kernel.target_abs.stem}__{label}.py"
            impls[label].write_text(src)
        raw = run_worker(folder, self.job(impls, seed), backend_registry.get(self.backend), self.settings,
                         self.workdir / "cache" / self.backend, timeout_s=self.timeout_s, name=f"worker-{self.backend}",
                         host=self.host)
        if raw.get("status") == "spec_error" and self.shapes:
            raise UserError(f"the spec failed at --shapes {' '.join(_key(s) for s in self.shapes)}: {raw.get('message')}"[:600],
                            hint="give shapes of the rank of the spec's BENCHMARK_SHAPES")
        out = outcome(self.backend, raw, folder, inc_src, cand_src)  # spec and harness errors raise here
        if out["timing"] is not None:
            self.timed = self.timed or (out["timing"]["dtype"], [s["shape"] for s in out["timing"]["shapes"]])
        self.proof = raw.get("proof") or self.proof
        return {**out, "shapes": self.timed[1] if self.timed else [list(s) for s in self.shapes or ()]}


def outcome(backend: str, raw: dict, folder: Path, inc_src: str, cand_src: str) -> dict:
    """A judge's result as `loop.decide.check` reads it: typed as an iteration types it
    (`to_backend_result`), with the change's coverage and measurability as an iteration computes them."""
    result = to_backend_result(backend, raw, "candidate", folder, folder)
    seen = raw.get("correctness") or {}
    launched, called = (seen.get("launched") or {}).get("candidate"), (seen.get("called") or {}).get("candidate")
    can = decide.measurability(describe(inc_src, cand_src), backend_registry.get(backend).timing_label)
    timed = (raw.get("timing") or {}).get("shapes") or []
    return {"status": result.status, "message": result.reason, "failed_impl": raw.get("failed_impl"),
            "timing": raw.get("timing") if result.status == "ok" else None,
            "methods": [s.get("method") for s in timed], "method_notes": [(s.get("notes") or [""])[0] for s in timed],
            "unexercised": unexercised(inc_src, cand_src, launched, called) if launched is not None else [],
            "unmeasurable": "" if can.measurable else can.reason, "log_tail": raw.get("log_tail", "")}


# --------------------------------------------------------------------------- the check


def run(target: str, *, trials: int, plant: float | None, scenarios: Sequence[str] | None, shapes: list | None,
        device: str, target_backend: str | None, dtype: str | None, seed: int, settings, workdir: Path,
        timeout_s: float | None = None, log: Callable[[str], None] | None = None,
        policy: decide.Policy | None = None, method: str = "auto", l2_multiples: Sequence[float] | None = None,
        budget_s: float | None = None) -> dict:
    """Run the check, one judged measurement per trial and scenario, and return the result (the `--json`
    payload less schema/command). `timeout_s` limits each judged measurement (default: an iteration's).
    `method` forces the timing method of every measurement (auto: the judge's choice); `l2_multiples`
    times shapes whose inputs and outputs are those multiples of the L2 (`l2_shapes`) instead of `shapes`.

    `budget_s`: no round of trials (one per scenario) starts that the longest round so far would end
    past this many seconds; the result is then incomplete (failure status `budget`) with every trial
    finished so far. A SIGTERM ends the check the same way (failure status `terminated`): the trials
    finished are kept and returned, never lost with the process.

    `policy` is the loop's default Policy unless given (tests pass a lower `suspicious`)."""
    log = log or plain_log
    policy = policy or decide.Policy()
    scenarios = _scenarios(scenarios, plant, method, l2_multiples, shapes)
    kernel, backend, probe = _kernel_and_backend(target, device, target_backend, settings, log)
    entry, bench_dtype = _plant_entry(kernel) if plant else None, _bench_dtype(kernel, device, dtype)
    sizing = None
    if l2_multiples:
        bench_dtype = bench_dtype or first_dtype(kernel, device)
        sizing = size_for_l2(kernel, l2_multiples, bench_dtype, device, probe)
        shapes = [tuple(x) for x in sizing["shapes"]]
        log(f"decision-check: shapes at {', '.join(f'{m:g}' for m in l2_multiples)}x L2: "
            f"{', '.join(_key(x) for x in shapes)} ({sizing['note']})")
    workdir.mkdir(parents=True, exist_ok=True)
    plain = kernel.target_abs.read_text()
    honest = honest_candidates(kernel, plain, backend, probe) if "honest" in scenarios else []
    if "honest" in scenarios and not honest:
        raise UserError("the honest scenario needs the playbook's candidates, and no recipe proposes one for this target",
                        hint=f"tileloop playbook plan {kernel.target}")
    host = start_judge_host(settings, workdir / "judges") if settings.judge_host else None  # as an unattended run's
    judged = Judged(kernel, backend, device, settings, workdir, shapes, bench_dtype, host, timeout_s, method)
    view = ProgressView(f"decision-check {kernel.op}", trials, log)
    log(f"decision-check: {trials} trial(s) x {', '.join(scenarios)} on {kernel.target} ({backend}), "
        f"each a judged measurement" + (f"; {len(honest)} honest candidate(s) in turn" if honest else ""))
    started = time.monotonic()
    rows, calibration, failure, done, events = [], [], None, Counter(), []
    longest = 0.0  # the longest round of trials so far (seconds): the next one may take as long
    previous = _raise_on_sigterm()
    try:
        sources = {"aa": (plain, plain)}
        if plant:
            calibration, size = calibrate(judged, plain, entry, plant, policy, seed, view)
            _log_calibration(view, calibration)
            planted = planted_source(plain, entry, size, device)
            sources.update(slowdown=(plain, planted), speedup=(planted, plain))
        for t in range(trials):
            if failure := _past_budget(budget_s, started, t, trials, longest):
                break
            round_started = time.monotonic()
            k = t % len(scenarios)  # rotate the order, so no scenario always runs first after a pause
            for scenario in list(scenarios[k:]) + list(scenarios[:k]):
                cand_key = None
                if scenario == "honest":  # the playbook's candidates in turn, each against the target
                    cand_key, cand_src = honest[t % len(honest)]
                    sources["honest"] = (plain, cand_src)
                _trial(judged, sources[scenario], (t, trials, scenario, cand_key), policy, seed, view, rows, events)
                done[t] += 1
            longest = max(longest, time.monotonic() - round_started)
    except Terminated:
        failure = {"status": "terminated", "message": f"SIGTERM: {sum(1 for n in done.values() if n == len(scenarios))} "
                   f"of {trials} trial(s) of every scenario done; the one under way is left out"}
    except Stopped as stop:
        failure = {"status": stop.outcome["status"], "message": f"{stop.what}: {stop.outcome['message']}"}
        if not rows:
            raise UserError(f"the target failed before any trial finished: {failure['status']}: {failure['message']}"[:600],
                            hint=(stop.outcome.get("log_tail") or "").strip()[-300:] or None) from None
    finally:
        with contextlib.suppress(ValueError, TypeError):  # not the main thread: nothing was taken
            signal.signal(signal.SIGTERM, previous)
        view.close()
        if host is not None:
            host.close()
    planted_ratios = {_key(c["shape"]): c["ratio"] for c in calibration}
    timed_dtype, timed_shapes = judged.timed or (dtype, [list(s) for s in shapes or ()])
    return {"target": str(kernel.target), "op": kernel.op, "language": kernel.language, "backend": backend,
            "device": device, "timings": backend_registry.get(backend).timing_label, "dtype": timed_dtype,
            "shapes": timed_shapes, "trials": trials, "trials_done": sum(1 for n in done.values() if n == len(scenarios)),
            "complete": failure is None, "failure": failure, "plant": plant, "scenarios": list(scenarios), "seed": seed,
            "method": method, "l2_sizing": sizing, "honest_candidates": [key for key, _ in honest],
            "policy": policy.to_json(), "calibration": calibration,
            "summary": summarize(rows, scenarios, planted_ratios, policy), "counts": tally(events, method, policy),
            "per_trial": rows, "proof": judged.proof,
            "measured_by": "judge", "judged_measurements": judged.count,
            "env": {k: probe.get(k) for k in ENV_KEYS}, "wall_s": round(time.monotonic() - started, 1)}


def _scenarios(scenarios: Sequence[str] | None, plant: float | None, method: str, l2_multiples, shapes) -> Sequence[str]:
    """The scenarios to run (the default where none are named), or a UserError for arguments that disagree."""
    if scenarios is None:
        scenarios = ROUTINE_SCENARIOS if plant else ("aa",)
    if plant is None and any(s in PLANTED for s in scenarios):
        raise UserError("the slowdown and speedup scenarios need --plant FRACTION (e.g. --plant 0.03)")
    if method not in METHODS:
        raise UserError(f"--method is one of {', '.join(METHODS)}, got {method!r}")
    if l2_multiples and shapes:
        raise UserError("--shapes and --l2-multiples both name the shapes: pass one of them")
    return scenarios


class Terminated(Exception):
    """A SIGTERM reached the check: it stops, keeping every trial finished."""


def _raise_on_sigterm():
    """SIGTERM raises `Terminated` in the main thread from now on (a `timeout` around the check ends it
    with its result written); returns the handler it replaced. Elsewhere than the main thread, nothing."""
    def terminated(signum, frame):
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: signals are not ours to take
        return signal.getsignal(signal.SIGTERM)


def _past_budget(budget_s: float | None, started: float, t: int, trials: int, longest: float = 0.0) -> dict | None:
    """The check's failure when round `t` would end past `budget_s`: the budget has passed, or what is
    left of it is shorter than the longest round so far (`longest` seconds); else None."""
    elapsed = time.monotonic() - started
    if budget_s is None or elapsed + longest <= budget_s:
        return None
    why = "passed" if elapsed > budget_s else f"{budget_s - elapsed:.0f} s left, the longest round so far took {longest:.0f} s"
    return {"status": "budget", "message": f"no trial started that could end past {budget_s:g} s (--budget; {why}): "
            f"{t} of {trials} trial(s) of every scenario done"}


def _trial(judged: Judged, pair: tuple[str, str], which: tuple, policy: decide.Policy, seed: int, view: ProgressView,
           rows: list[dict], events: list[dict]) -> None:
    """One trial (`which`: trial, trials, scenario, honest candidate's key or None): judged, measured again
    where the loop would, its rows and event added; Stopped where a crash ends the check."""
    t, trials, scenario, cand_key = which
    view.update(iteration=t + 1, change=scenario if cand_key is None else cand_key, stage="measuring")
    event = {"trial": t, "scenario": scenario, "first": judged.measure(*pair, seed_for(seed, "trial", t, scenario))}
    mine = trial_rows(event, policy)
    if wants_again(mine):  # as an iteration measures a speedup over `suspicious` again
        event["again"] = judged.measure(*pair, seed_for(seed, "trial", t, scenario))
        mine = trial_rows(event, policy)
    if cand_key is not None:
        mine = [{**r, "candidate": cand_key} for r in mine]
    rows += mine
    events.append({**event, "candidate": cand_key})
    _log_trial(view, t, trials, scenario, mine)
    crashed = next((o for o in (event.get("again"), event["first"]) if o and o["status"] in decide.CRASH_STATUSES), None)
    # an honest candidate that does not build or run is the candidate's failure, counted; the target's own
    # crash (or any crash of the other scenarios, whose sources are the target's) ends the check
    if crashed and not (scenario == "honest" and crashed.get("failed_impl") == "candidate"):
        raise Stopped(crashed, f"trial {t + 1} {scenario}")


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


def _plant_entry(kernel: Kernel) -> str:
    """The target function the plant follows: the spec's ENTRY (default `run`)."""
    entry = spec_entry(ast.parse(kernel.spec_abs.read_text()))
    if entry is None:
        raise UserError("the slowdown and speedup scenarios plant work after the target's entry function, and this spec "
                        "calls the target through its own entry(target, **inputs) adapter", hint="run --scenarios aa")
    return entry


def _bench_dtype(kernel: Kernel, device: str, dtype: str | None) -> str | None:
    """--dtype, checked against the spec's DTYPES where they are literal; None: the one an iteration times."""
    if dtype is None:
        return None
    known = spec_dtypes(kernel.spec_abs)
    if known is not None and dtype not in known:
        raise UserError(f"--dtype {dtype} is not one of the spec's DTYPES: {', '.join(known)}")
    if device == "cpu" and dtype == "bfloat16":
        raise UserError("--dtype bfloat16 cannot run under the Triton interpreter (--device cpu)")
    return dtype


def _log_calibration(view: ProgressView, calibration: list[dict]) -> None:
    for c in calibration:
        view.log(f"plant at {_key(c['shape'])}: size {c['elems']} -> measured ratio {c['ratio']:.4f} "
                 f"({c['lo']:.4f}-{c['hi']:.4f}; asked {1 + c['asked']:.4f})" + (f"; {c['note']}" if c.get("note") else ""))


def _log_trial(view: ProgressView, t: int, trials: int, scenario: str, rows: list[dict]) -> None:
    text = ", ".join(f"{_key(r['shape'])} {r['action']}/{r['verdict']}" + (f" {r['ratio']:.4f}" if r["ratio"] else "")
                     for r in rows)
    view.update(iteration=t + 1, change=scenario, stage="decided")
    view.log(f"trial {t + 1}/{trials} {scenario}: {text}")
