"""`tileloop profile`: one shape and dtype of a target under Nsight Compute, and its bottleneck.

The kernel runs in the loop's own worker (`python -m loop.worker`, profile mode: a correctness
check, then the profiled calls) started by ncu (`loop.tools.ncu` builds that command line). The
metrics of the target's kernels give a bottleneck class (`classify`, a pure function):

- `memory-bound`: memory throughput (the busiest of DRAM, L2, L1) is at least BUSY_PCT of peak
  and ahead of compute by BALANCE_GAP points or more;
- `compute-bound`: the same with SM throughput ahead;
- `balanced`: both at least BUSY_PCT and within BALANCE_GAP points;
- `latency-bound`: neither unit reaches BUSY_PCT (ncu's own reading: under 60% of peak on both
  means latency issues), with a cause: `too-few-blocks` (fewer blocks than SMs),
  `low-occupancy` (achieved occupancy under LOW_OCCUPANCY_PCT, with the resource that limits
  blocks per SM) or `stalls` (enough warps, none busy: dependencies);
- `unknown`: ncu gave no value for compute or memory throughput.

Inside a run, a profile of the run's best version is stored as `sandbox/<run>/profile-<n>.json`
(n: the iteration that made that version). `stored_bottleneck(run_dir, source)` reads the class
back for exactly that source, as the `bottleneck` of `playbook.analysis.analyze`, which then
reorders the playbook's kinds (None, no profile: the static order).

Exit codes (docs/json.md): 0 profiled; 1 the kernel failed (compile_error, runtime_error,
timeout, oom, incorrect); 2 bad input (tileloop's user errors); 3 ncu not found or not runnable;
4 ncu may not read the performance counters (ERR_NVGPUCTRPERM); 5 ncu profiled none of the
target's kernels; 6 another ncu error (an unknown metric, output that is no ncu table).
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure, UserError
from loop.common.files import atomic_write_text, scratch
from loop.common.settings import Settings
from loop.measure import probe as probing
from loop.measure.launch import run_worker, worker_command
from loop.records import gitops
from loop.records.results import read_records
from loop.run import state as st
from loop.target.contract import load_kernel, source_hash
from loop.tools import ncu
from playbook import analysis
from playbook.analysis import analyze

PROFILE_SCHEMA = "tileloop.profile/1"
KERNEL_FAILURES = ("compile_error", "runtime_error", "timeout", "oom", "incorrect")
EXIT_CODES = {"ok": 0, **{s: 1 for s in KERNEL_FAILURES}, "ncu_missing": 3, "ncu_permission": 4, "no_kernel": 5,
              "ncu_error": 6}
CLASSES = ("memory-bound", "compute-bound", "latency-bound", "balanced", "unknown")

BUSY_PCT = 60.0  # a unit under 60% of its peak is not what limits the kernel (ncu's SOL guidance)
BALANCE_GAP = 15.0  # both units busy and this close: neither alone limits it
LOW_OCCUPANCY_PCT = 25.0  # fewer than a quarter of the warp slots filled: too little in flight to hide latency
SHORT_KERNEL_NS = 5_000.0  # under 5 us, launch and tail effects are a large share of the time
CLOCK_NOTE = ("ncu locks the clocks to base (--clock-control base) and flushes caches before each replay: "
              "durations here are not comparable with the loop's timings; the percentages are")


# ----------------------------------------------------------------------------- classification


@dataclass(frozen=True)
class Bottleneck:
    kind: str  # one of CLASSES
    cause: str | None  # latency-bound only: too-few-blocks | low-occupancy | stalls
    reasons: tuple[str, ...]  # the numbers that led to the verdict, in words
    evidence: dict[str, float] = field(default_factory=dict)  # the metrics read, by short key

    def to_json(self) -> dict:
        return {"class": self.kind, "cause": self.cause, "reasons": list(self.reasons), "evidence": self.evidence}


def _pct(v: float) -> str:
    return f"{v:.1f}%"


def classify(m: dict[str, float | None]) -> Bottleneck:
    """Bottleneck class of one kernel from its metrics (short keys of `loop.tools.ncu.METRICS`)."""
    evidence = {k: v for k, v in m.items() if v is not None}
    compute, memory = m.get("compute_pct"), m.get("memory_pct")
    if compute is None or memory is None:
        missing = [k for k, v in (("compute_pct", compute), ("memory_pct", memory)) if v is None]
        return Bottleneck("unknown", None, (f"ncu reported no value for {', '.join(missing)}",), evidence)
    dram = m.get("dram_pct")
    mem = f"memory throughput {_pct(memory)} of peak" + (f" (DRAM {_pct(dram)})" if dram is not None else "")
    comp = f"compute (SM) throughput {_pct(compute)}"
    cause = None
    if max(compute, memory) < BUSY_PCT:
        kind = "latency-bound"
        cause, why = _latency_cause(m)
        reasons = [f"neither unit is busy: {comp}, {mem}, both under {BUSY_PCT:.0f}%", why]
    elif compute >= BUSY_PCT and memory >= BUSY_PCT and abs(compute - memory) < BALANCE_GAP:
        kind = "balanced"
        reasons = [f"both units are busy: {comp}, {mem}, within {BALANCE_GAP:.0f} points"]
    elif memory >= compute:
        kind = "memory-bound"
        reasons = [f"{mem} against {comp}"]
    else:
        kind = "compute-bound"
        tensor = m.get("tensor_pipe_pct")
        reasons = [f"{comp} against {mem}" + (f"; tensor pipe {_pct(tensor)} active" if tensor is not None else "")]
    duration = m.get("duration_ns")
    if duration is not None and duration < SHORT_KERNEL_NS:
        reasons.append(f"the kernel runs {duration / 1e3:.2f} us: launch and tail effects are a large share of it")
    return Bottleneck(kind, cause, tuple(reasons), evidence)


def _latency_cause(m: dict[str, float | None]) -> tuple[str, str]:
    grid, sms, occ = m.get("grid_size"), m.get("sm_count"), m.get("achieved_occupancy_pct")
    if grid is not None and sms and grid < sms:
        return "too-few-blocks", f"{grid:.0f} blocks for {sms:.0f} SMs: {sms - grid:.0f} SMs have no work"
    if occ is not None and occ < LOW_OCCUPANCY_PCT:
        text = f"achieved occupancy {_pct(occ)} of the warp slots, under {LOW_OCCUPANCY_PCT:.0f}%"
        theo = m.get("theoretical_occupancy_pct")
        if theo is not None:
            text += f" (theoretical {_pct(theo)})"
        limiter = _occupancy_limiter(m)
        return "low-occupancy", text + (f"; blocks per SM limited by {limiter}" if limiter else "")
    blocks = f"{grid:.0f} blocks" if grid is not None else "the blocks"
    occ_text = f" at {_pct(occ)} occupancy" if occ is not None else ""
    return "stalls", (f"{blocks}{occ_text} fill the GPU, yet neither unit is busy: warps wait on dependencies "
                      "(load latency, barriers, a serial loop)")


def _occupancy_limiter(m: dict[str, float | None]) -> str | None:
    limits = {name: m.get(f"block_limit_{name}") for name in ("registers", "shared_mem", "warps", "blocks")}
    known = {k: v for k, v in limits.items() if v is not None}
    if not known:
        return None
    name = min(known, key=lambda k: known[k])
    text = f"{name.replace('_', ' ')} ({known[name]:.0f} blocks/SM"
    if name == "registers" and m.get("registers_per_thread") is not None:
        text += f" at {m['registers_per_thread']:.0f} registers/thread"
    return text + ")"


# ----------------------------------------------------------------------------- ncu output -> kernels


def summarize(launches: list[ncu.Launch]) -> list[dict]:
    """Per kernel (by name): launch count, the median of each metric over its launches, and its
    bottleneck; the kernel with the largest total duration first."""
    by_name: dict[str, list[ncu.Launch]] = {}
    for launch in launches:
        by_name.setdefault(launch.kernel, []).append(launch)
    out = []
    for name, group in by_name.items():
        metrics: dict[str, float | None] = {}
        for metric, key in ncu.METRICS.items():
            values = [v for v in (g.value(metric) for g in group) if v is not None]
            metrics[key + "_ns" if key == "duration" else key] = statistics.median(values) if values else None
        total = sum(v for v in (g.value("gpu__time_duration.sum") for g in group) if v is not None)
        out.append({"kernel": name, "launches": len(group), "block": group[0].block, "grid": group[0].grid,
                    "device": group[0].device, "cc": group[0].cc, "total_ns": total, "metrics": metrics,
                    "bottleneck": classify(metrics).to_json()})
    out.sort(key=lambda k: -k["total_ns"])
    return out


# ----------------------------------------------------------------------------- the command


def resolve_ncu(path: str | None) -> tuple[str | None, str | None, str]:
    """(executable, version, why not) for --ncu PATH or the ncu on PATH."""
    exe = shutil.which(path) if path else shutil.which("ncu")
    if exe is None:
        where = f"--ncu {path}" if path else "ncu on PATH"
        return None, None, (f"{where} not found (the Nsight Compute CLI; it ships with the CUDA toolkit, "
                            "e.g. /usr/local/cuda/bin/ncu)")
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"{exe} --version failed: {exc}"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, None, f"{exe} --version exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
    return exe, lines[-1].strip(), ""


def _run_context(root: Path, run_id: str | None, target: str, source: str) -> tuple[str | None, int | None, str]:
    """(run, iteration, note): the run whose best version this target is, and that version's iteration."""
    try:
        rid = st.current(root, run_id)
    except UserError:
        if run_id:
            raise
        return None, None, "not inside a tileloop run: profile not stored"
    state = st.load(root, rid)
    if state.target != target:
        return None, None, f"run {rid} tunes {state.target}, not {target}: profile not stored"
    if not state.best_commit or gitops.show_file(root, state.best_commit, state.target) != source:
        return None, None, f"{target} differs from run {rid}'s best version (an edit not yet stepped): profile not stored"
    recs = read_records(st.run_dir(root, rid) / "results.jsonl")
    iteration = next((r.iteration for r in reversed(recs) if r.commit == state.best_commit), state.last_iteration)
    return rid, iteration, f"the best version of run {rid} (iteration {iteration})"


def run(target: str, *, shape: list[int] | None, dtype: str | None, backend: str | None, launches: int = 3,
        kernels: list[str] | None = None, ncu_path: str | None = None, run_id: str | None = None,
        settings: Settings, device: str = "cuda", log: Callable[[str], None] = lambda m: None) -> tuple[dict, int]:
    """Profile `target`; returns (payload, exit code). `device="cpu"` runs the worker under the
    Triton interpreter: no counters, for testing this plumbing with a stand-in ncu."""
    path = Path(target).resolve()
    root = gitops.root_or_folder(path.parent)
    kernel = load_kernel(path, root)
    source = kernel.target_abs.read_text()
    names = list(kernels or analysis.kernel_names(source, kernel.language))
    if not names:
        raise UserError(f"no @triton.jit or @ct.kernel function found in {kernel.target}", hint="name it with --kernel NAME")
    try:
        regex = ncu.kernel_regex(names)
    except ValueError as exc:
        raise UserError(f"--kernel: {exc}", hint="a kernel is named by its Python function name") from None
    payload: dict = {"target": str(kernel.target), "language": kernel.language, "backend": backend, "gpu": None,
                     "shape": shape, "dtype": dtype, "launches": launches, "kernels_filter": regex, "ncu": None,
                     "ncu_version": None, "ncu_command": None, "ncu_command_line": None, "correctness": None,
                     "run": None, "iteration": None, "stored": None, "source_hash": source_hash(source),
                     "context": None, "workdir": None, "priority": None, "note": CLOCK_NOTE}
    exe, version, why = resolve_ncu(ncu_path)
    if exe is None:
        return _failure(payload, "ncu_missing", why, "install Nsight Compute, or pass --ncu /path/to/ncu; "
                        "tileloop doctor shows what it finds"), EXIT_CODES["ncu_missing"]
    payload.update(ncu=exe, ncu_version=version)
    probe = probing.probe_environment(root, settings)
    if device == "cuda" and not probe.get("cuda_available"):
        raise UserError(f"no GPU available: {probe.get('cuda_reason')}", hint="ncu profiles kernels on a GPU")
    allowed = [b.name for b in backend_registry.for_language(kernel.language, device)]
    if backend is not None and backend not in allowed:
        raise UserError(f"--backend {backend} does not apply to a {kernel.language} target; valid: {', '.join(allowed)}")
    avail = {n: backend_registry.availability(backend_registry.get(n), probe, device) for n in allowed}
    chosen = backend or backend_registry.default_target(kernel.language, device, avail)
    if not avail[chosen].available:
        raise UserError(f"backend {chosen} is unavailable: {avail[chosen].reason}")
    payload.update(backend=chosen, gpu=probe.get("gpu"))

    rid, iteration, where = _run_context(root, run_id, str(kernel.target), source)
    payload.update(run=rid, iteration=iteration, context=where)
    with scratch("profile") as tmp:
        workdir = st.run_dir(root, rid) / "logs" / f"profile-{iteration}" if rid else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        csv_path = workdir / "ncu.csv"
        csv_path.unlink(missing_ok=True)
        launcher = ncu.command(exe, kernels=names, launch_count=launches, log_file=str(csv_path))
        job = {"mode": "profile", "spec": str(kernel.spec_abs), "target_dir": str(kernel.target_abs.parent),
               "target": str(kernel.target_abs), "device": device, "backend": chosen, "seed": 0,
               "shape": shape, "dtype": dtype, "launches": launches}
        payload["ncu_command"] = launcher + worker_command(settings, workdir, "profile", job)
        payload["ncu_command_line"] = shlex.join(payload["ncu_command"])
        log(f"profiling {kernel.target} ({chosen}) under ncu: {payload['ncu_command_line']}")
        raw = run_worker(workdir, job, backend_registry.get(chosen), settings, workdir / "triton-cache",
                         name="profile", launcher=launcher)
        has_result = (workdir / "profile.result.json").exists()
        ncu_text = csv_path.read_text(errors="replace") if csv_path.exists() else ""
        worker_log = (workdir / "profile.log").read_text(errors="replace") if (workdir / "profile.log").exists() else ""
        try:
            payload, code = _interpret(payload, raw, has_result, ncu_text, worker_log)
        except HarnessFailure as exc:  # tileloop's own failure: a traceback, with the command that hit it
            raise HarnessFailure(f"{exc}\nncu command: {payload['ncu_command_line']}") from None
    if code == 0:
        payload["priority"] = _priority(source, payload["bottleneck"]["class"])
    if code == 0 and rid is not None:
        payload["stored"] = str((st.run_dir(root, rid) / f"profile-{iteration}.json").relative_to(root))
        atomic_write_text(root / payload["stored"], json.dumps({"schema": PROFILE_SCHEMA, **payload}, indent=1))
    if rid is not None:
        payload["workdir"] = str(workdir.relative_to(root))
    return payload, code


def _interpret(payload: dict, raw: dict, has_result: bool, ncu_text: str, worker_log: str) -> tuple[dict, int]:
    """Worker result + ncu output -> the payload. Order: a permission refusal explains everything;
    then the kernel's own failure; then what ncu says; then its table."""
    issue = ncu.diagnose(ncu_text + "\n" + worker_log)
    tail = "\n".join((ncu_text or worker_log).strip().splitlines()[-25:])
    for key in ("shape", "dtype", "proof"):
        if raw.get(key) is not None:
            payload[key] = raw[key]
    if "correctness" in raw:
        payload["correctness"] = "PASS" if raw["correctness"].get("passed") else "FAIL"
    status = raw.get("status", "runtime_error")
    if issue is not None and issue.status == "ncu_permission":
        return _failure(payload, issue.status, issue.message, issue.hint, tail), EXIT_CODES[issue.status]
    if status == "spec_error":
        raise UserError(f"spec: {raw.get('message')}")
    if status == "harness_error":
        raise HarnessFailure(f"profile worker: {raw.get('message')}\n{raw.get('detail', '')}")
    if status in KERNEL_FAILURES and (has_result or issue is None):
        msg = f"the kernel failed before it could be profiled: {status}: {raw.get('message', '')}"[:1500]
        hint = ("ncu replays each launch many times: raise TILELOOP_WORKER_TIMEOUT or lower --launches"
                if status == "timeout" else "tileloop compile / tileloop step show the failure in detail")
        return _failure(payload, status, msg, hint, raw.get("log_tail") or tail), EXIT_CODES[status]
    if issue is not None:
        msg, hint = issue.message, issue.hint
        if issue.status == "no_kernel":
            seen = f"; ncu saw: {', '.join(issue.available[:8])}" if issue.available else ""
            msg = f"ncu profiled no kernel matching {payload['kernels_filter']}{seen}"
            hint = "name the kernel(s) with --kernel NAME (the symbol ncu shows), or check that run() launches them"
        return _failure(payload, issue.status, msg, hint, tail), EXIT_CODES[issue.status]
    try:
        launches = ncu.parse_raw_csv(ncu_text)
    except ncu.CsvError as exc:
        return _failure(payload, "ncu_error", f"ncu's output is not the expected table: {exc}",
                        "see ncu_output_tail and ncu_command", tail), EXIT_CODES["ncu_error"]
    if not launches:
        return _failure(payload, "no_kernel", f"ncu's table has no launch matching {payload['kernels_filter']}",
                        "name the kernel(s) with --kernel NAME", tail), EXIT_CODES["no_kernel"]
    kernels = summarize(launches)
    payload.update(status="ok", ok=True, error=None, hint=None, kernels=kernels,
                   bottleneck={"kernel": kernels[0]["kernel"], **kernels[0]["bottleneck"]})
    return payload, 0


def _failure(payload: dict, status: str, message: str, hint: str, tail: str = "") -> dict:
    payload.update(status=status, ok=False, error=message, hint=hint or None, kernels=[], bottleneck=None)
    if tail:
        payload["ncu_output_tail"] = tail
    return payload


def _priority(source: str, kind: str) -> list[str]:
    """The playbook's order of change kinds for this kernel, adjusted by its bottleneck."""
    return analyze(source, bottleneck=None if kind == "unknown" else kind).priority()


def stored_bottleneck(run_dir: Path, source: str) -> str | None:
    """The bottleneck class of the newest stored profile of exactly this source, or None (no
    profile: the playbook keeps its static order)."""
    want = source_hash(source)
    best: tuple[int, str] | None = None
    for path in run_dir.glob("profile-*.json"):
        try:
            data = json.loads(path.read_text())
            n = int(path.stem.removeprefix("profile-"))
        except (OSError, ValueError):
            continue
        if data.get("schema") == PROFILE_SCHEMA and data.get("ok") and data.get("source_hash") == want:
            kind = (data.get("bottleneck") or {}).get("class")
            if kind in CLASSES and kind != "unknown" and (best is None or n > best[0]):
                best = (n, kind)
    return best[1] if best else None


def render(payload: dict) -> str:
    """The text form of a profile: the command, the verdict and its numbers."""
    lines = [f"ncu command: {payload.get('ncu_command_line', '(not run)')}"]
    if not payload.get("ok"):
        lines.append(f"{payload['status']}: {payload['error']}")
        if payload.get("hint"):
            lines.append(f"hint: {payload['hint']}")
        if payload.get("ncu_output_tail"):
            lines += ["", payload["ncu_output_tail"]]
        return "\n".join(lines)
    lines.append(f"{payload['target']} ({payload['backend']}) at {payload['shape']} {payload['dtype']} on {payload.get('gpu')}")
    for k in payload["kernels"]:
        m = k["metrics"]
        shown = ", ".join(f"{key} {m[key]:.4g}" for key in ("duration_ns", "compute_pct", "memory_pct", "dram_pct",
                                                             "achieved_occupancy_pct", "registers_per_thread",
                                                             "grid_size", "block_size") if m.get(key) is not None)
        lines.append(f"- {k['kernel']} x{k['launches']}: {k['bottleneck']['class']}: {shown}")
    b = payload["bottleneck"]
    lines.append(f"bottleneck: {b['class']}" + (f" ({b['cause']})" if b.get("cause") else "") + f" [{b['kernel']}]")
    lines += [f"  {r}" for r in b["reasons"]]
    if payload.get("priority"):
        lines.append(f"playbook order: {', '.join(payload['priority'])}")
    lines.append(f"stored: {payload['stored']}" if payload.get("stored") else payload.get("context", ""))
    lines.append(payload["note"])
    return "\n".join(lines)
