"""`tileloop suite`: tune many targets unattended, one after another, and summarise them.

`suite run` runs, for each target, `tileloop run` with the default settings on its own branch
(from the branch the suite started on), then `tileloop report --measure` (the best version
against PyTorch eager and torch.compile), and writes one JSON entry per target into the output
folder together with the run's report, plot and perf_results.md. Each run is a subprocess with
an optional wall-clock limit; a run cut off by it is repaired (`resume --no-continue`), so its
record stays consistent, and its entry says that it was cut off. `suite run --resume` continues a
suite that was stopped (killed, or a machine taken back): each target whose run exists goes on
with `tileloop resume` in the worktree that holds it (also when this call has fewer GPUs, or none
named, than the call that started it: the GPUs given serve the other worktrees in turn, and no
run is started anew or its branch forgotten because its GPU is missing), a finished run keeps the
entry it has (it is
measured again only where that entry has no final measurement, e.g. its report was killed), and
the other targets start as usual. `--restart TARGET` (with `--resume`) forgets a target's run first
(its branch, its records in whichever tree holds them, its entry), so it starts anew: for a target
whose recipes or playbook changed since its run.

`suite summarize` turns entries (from one or several `suite run` calls) into one markdown file:
per op and implementation, baseline and final latency, speedup, fraction of same-run clone
bandwidth (memory-bound ops) or of torch.matmul's rate (matmul), torch eager and torch.compile,
iterations, wall time per iteration and the recipes kept; then Triton/PTX against cuTile per op.
"""

from __future__ import annotations

import json
import math
import os
import signal
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from loop.common.errors import UserError
from loop.records.results import Record, markdown_table
from loop.common.files import atomic_write_text
from loop.measure.launch import kill_group, with_package_path

ENTRY_SCHEMA = "tileloop.suite-entry/1"


def _env() -> dict:
    """The environment of the child tileloop processes: this tileloop importable, as for workers."""
    return with_package_path(dict(os.environ))


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _size(shape) -> int:
    return math.prod(int(x) for x in shape)


def largest(shapes: list[dict]) -> dict | None:
    """The benchmark shape that moves the most bytes (then the most elements); first wins ties."""
    if not shapes:
        return None
    return max(shapes, key=lambda s: (s.get("bytes") or 0, _size(s["shape"])))


def _stats(entry_shape: dict, *labels: str) -> dict:
    for label in labels:
        if isinstance(entry_shape.get(label), dict):
            return entry_shape[label]
    return {}


def entry_from_run(run_dir: Path, final: dict | None, cut_off: bool, wall_s: float) -> dict:
    """One suite entry from a run's records (results.jsonl) and its final measurement."""
    recs = [Record.from_json(json.loads(line)) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    if not recs:
        raise UserError(f"{run_dir} has no records")
    state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").is_file() else {}
    base = recs[0]
    backend = base.target_backend
    best = next(r for r in reversed(recs) if r.status == "keep")
    b0, b1 = base.backends[backend], best.backends[backend]
    s0 = largest(b0.shapes)
    s1 = next((s for s in b1.shapes if s0 and s["shape"] == s0["shape"] and s["dtype"] == s0["dtype"]), None)
    base_l = _stats(s0 or {}, "baseline", "candidate")
    best_l = _stats(s1 or {}, "candidate", "baseline") if best.iteration else base_l
    final_rows = (final or {}).get("rows", [])
    key = "x".join(map(str, s0["shape"])) if s0 else None
    final_large = next((r for r in final_rows if s0 and r["shape"] == key and r["dtype"] == s0["dtype"]), None)
    experiments = recs[1:]
    return {
        "schema": ENTRY_SCHEMA, "run": base.run, "op": run_dir.name, "target": None, "target_backend": backend,
        "device": base.env.get("gpu") or "CPU (Triton interpreter)", "timing": b0.timing_label,
        "baseline_ms": base.latency_ms, "best_ms": best.latency_ms,
        "speedup": base.latency_ms / best.latency_ms if base.latency_ms and best.latency_ms else None,
        "largest_shape": {"shape": s0["shape"], "dtype": s0["dtype"], "flops": s0.get("flops"), "bytes": s0.get("bytes")} if s0 else None,
        "largest_baseline": base_l, "largest_best": best_l,
        "final": final_rows, "final_largest": final_large,
        "iterations": len(experiments),
        "outcomes": {k: sum(r.status == k for r in experiments) for k in ("keep", "revert", "crash")},
        "median_iteration_wall_s": statistics.median(r.wall_s for r in experiments) if experiments else None,
        "kept": [f"#{r.iteration} {r.optimization} ({r.speedup:.2f}x)" for r in experiments if r.status == "keep" and r.speedup],
        "stop": state.get("stopped") or recs[-1].stop, "availability": state.get("availability", {}),
        "cut_off": cut_off, "suite_wall_s": wall_s,
    }


class _Children:
    """Run subprocesses (each in its own process group) and kill them all if the suite is killed:
    a `timeout` around the suite must not leave a tuning run behind on a GPU."""

    def __init__(self):
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(*args, start_new_session=True, **kwargs)
        with self.lock:
            self.live.add(proc)
        return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.live.discard(proc)

    def kill_all(self, signum=None, frame=None):
        with self.lock:
            procs = list(self.live)
        for proc in procs:
            kill_group(proc)
        if signum is not None:
            raise SystemExit(128 + signum)


def run_id_of(target: str) -> str:
    return f"suite-{Path(target).stem.replace('_', '-')}"


def branch_of(target: str) -> str:
    return f"tileloop/{run_id_of(target)}"


def existing_run(run_root: Path, target: str) -> dict | None:
    """The state of the target's suite run in `run_root`, if one was started there."""
    path = run_root / "sandbox" / run_id_of(target) / "state.json"
    return json.loads(path.read_text()) if path.is_file() else None


def run_trees(root: Path) -> list[Path]:
    """Where a suite's runs can live: the repository and every worktree a suite made under
    sandbox/suite-worktrees/, whichever GPUs the current call was given."""
    return [root] + sorted(p for p in (root / "sandbox" / WORKTREES).glob("gpu*") if p.is_dir())


def holder_of(root: Path, target: str) -> Path | None:
    """The tree (of `run_trees`) that holds the target's suite run, if one was started anywhere."""
    return next((tree for tree in run_trees(root) if existing_run(tree, target) is not None), None)


def forget_run(trees: list[Path], target: str, out_dir: Path | None = None) -> list[str]:
    """Forget the target's suite run: its branch, its records in each of `trees` (the repository
    and its worktrees), and with `out_dir` its entry, report and log there. What was removed."""
    branch, run_id, gone = branch_of(target), run_id_of(target), []

    def shown(path: Path) -> str:
        return str(path.relative_to(trees[0])) if trees and path.is_relative_to(trees[0]) else str(path)

    for tree in trees:
        if _git(tree, "rev-parse", "--abbrev-ref", "HEAD") == branch:
            _git(tree, "checkout", "-q", "--detach")  # a branch checked out anywhere cannot be deleted
        if (tree / "sandbox" / run_id).exists():
            shutil.rmtree(tree / "sandbox" / run_id)
            gone.append(shown(tree / "sandbox" / run_id))
    if trees and _git(trees[0], "branch", "--list", branch):
        _git(trees[0], "branch", "-D", branch)
        gone.append(f"branch {branch}")
    if out_dir is not None and out_dir.is_dir():
        for f in sorted([*out_dir.glob(f"{run_id}-*"), *out_dir.glob(f"{run_id}.json"), *out_dir.glob(f"{run_id}.log")]):
            f.unlink()
            gone.append(shown(f))
    return gone


def finished(state: dict) -> bool:
    """A run whose stop rule fired (stop or escalate) and that has no experiment in flight."""
    return (state.get("stopped") or {}).get("state") in ("stop", "escalate") and not state.get("inflight")


def _entry_of_finished(path: Path, state: dict) -> dict | None:
    """The suite entry a finished run already has, if it is whole: written after the run stopped
    (as many experiments as the run recorded) and holding a final measurement."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if entry.get("error") or not entry.get("final") or entry.get("final_error"):
        return None
    if entry.get("iterations") != state.get("last_iteration"):
        return None
    return entry


def _run_child(cmd: list[str], run_root: Path, run_id: str, out_dir: Path, per_run_s: float | None, env: dict,
               children: _Children, log, target: str, append: bool) -> tuple[int, bool]:
    """One `tileloop run|resume` child, its stderr in <run_id>.log; (exit code, cut off). A child
    past `per_run_s` is killed and its record repaired (`resume --no-continue`)."""
    with open(out_dir / f"{run_id}.log", "a" if append else "w") as err:
        proc = children.popen(cmd, cwd=run_root, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            proc.wait(timeout=per_run_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()
            log(f"[suite] {target}: cut off after {per_run_s:.0f} s; repairing the record")
            subprocess.run([sys.executable, "-m", "loop", "resume", "--run", run_id, "--no-continue"], cwd=run_root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return proc.returncode, True
        finally:
            children.done(proc)
    return proc.returncode, False


def _run_one(root: Path, run_root: Path, target: str, out_dir: Path, per_run_s: float | None, extra: list[str],
             env: dict, children: _Children, log, resume: bool = False) -> dict:
    """`tileloop run` of one target in `run_root` (the repository or a worktree of it), then the
    report. With `resume`, a run of the target already in `run_root` is continued (`tileloop
    resume`, on its branch) or, if it had finished, only reported: its entry in `out_dir` stands
    when it holds a final measurement, so a resumed suite spends no GPU time on finished runs."""
    path = Path(target)
    run_id = run_id_of(target)
    state = existing_run(run_root, target) if resume else None
    if resume and (state is None or state.get("last_iteration", -1) < 0):
        elsewhere = [tree for tree in run_trees(root) if tree != run_root and existing_run(tree, target) is not None]
        if elsewhere:  # never forget (branch included) a run that lives in another tree
            where = ", ".join(str(t.relative_to(root)) if t != root else "the repository" for t in elsewhere)
            log(f"[suite] {target}: its run lives in {where}, not here; left alone")
            return {"schema": ENTRY_SCHEMA, "run": run_id, "target": str(path),
                    "error": f"its run lives in {where}: suite run --resume goes on there"}
        # killed before its baseline was recorded: nothing to continue; clear what it left and start over
        forget_run([run_root], target)
        state = None
    if state is None:
        log(f"[suite] {target}: tileloop run (branch {branch_of(target)})")
        cmd = [sys.executable, "-m", "loop", "run", str(path), "--branch", branch_of(target), *extra]
    else:
        done = finished(state)
        kept = _entry_of_finished(out_dir / f"{run_id}.json", state) if done else None
        if kept is not None:
            log(f"[suite] {target}: finished before; its entry stands")
            return kept
        _git(run_root, "checkout", "-q", state["branch"])
        log(f"[suite] {target}: " + ("finished before; reporting it again (its entry has no final measurement)" if done else
                                     f"tileloop resume (branch {state['branch']}, {state.get('last_iteration', -1)} experiments recorded)"))
        cmd = None if done else [sys.executable, "-m", "loop", "resume", "--run", run_id]
    t0 = time.monotonic()
    cut_off, returncode = False, 0
    if cmd is not None:
        returncode, cut_off = _run_child(cmd, run_root, run_id, out_dir, per_run_s, env, children, log, target,
                                         append=state is not None)
    wall = time.monotonic() - t0
    run_dir = run_root / "sandbox" / run_id
    if not (run_dir / "results.jsonl").is_file():
        log(f"[suite] {target}: no records (exit {returncode}); see {run_id}.log")
        return {"schema": ENTRY_SCHEMA, "run": run_id, "target": str(path), "error": f"no records (exit {returncode})"}
    measure = ["--measure"] if "--device" not in extra or extra[extra.index("--device") + 1] == "cuda" else []
    rep_proc = children.popen([sys.executable, "-m", "loop", "report", "--run", run_id, *measure, "--json"], cwd=run_root,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err_text = rep_proc.communicate()
    finally:
        children.done(rep_proc)
    final = json.loads(out).get("final") if rep_proc.returncode == 0 and out.strip() else None
    entry = entry_from_run(run_dir, final, cut_off, wall)
    entry["op"], entry["target"] = path.parent.name, str(path)
    entry["language"] = "cutile" if path.stem.endswith("_cutile") else "triton"
    if state is not None:
        entry["resumed"] = True  # the run spans suite calls (and maybe machines): its wall time is this call's
    if final is None and measure:  # no final measurement was asked for on the CPU
        entry["final_error"] = (err_text or out)[-400:]
    atomic_write_text(out_dir / f"{run_id}.json", json.dumps(entry, indent=1, default=str) + "\n")
    state = json.loads((run_dir / "state.json").read_text())
    if state.get("best_commit"):  # the tuned kernel itself, for review and for profiling elsewhere
        best_src = _git(root, "show", f"{state['best_commit']}:{state['target']}")
        atomic_write_text(out_dir / f"{run_id}-best{path.suffix}", best_src + "\n")
    for f in ("report.md", "latency.png", "perf_results.md", "results.jsonl"):
        if (run_dir / f).is_file():
            shutil.copy2(run_dir / f, out_dir / f"{run_id}-{f}")
    log(f"[suite] {target}: {entry['baseline_ms']:.6f} -> {entry['best_ms']:.6f} ms ({entry['speedup']:.2f}x), "
        f"{entry['iterations']} experiments, {wall:.0f} s")
    return entry


WORKTREES = "suite-worktrees"  # under sandbox/: one git worktree per GPU when the suite runs on several


def run_suite(root: Path, targets: list[str], out_dir: Path, per_run_s: float | None, extra: list[str], log=print,
              gpus: list[str] | None = None, resume: bool = False, restart: list[str] | None = None) -> list[dict]:
    """Each target tuned on its own branch from the current commit. With `gpus` (device ids), one
    target per GPU at a time, each GPU in its own git worktree (sandbox/suite-worktrees/gpu<id>) with
    CUDA_VISIBLE_DEVICES set; the runs' records stay in those worktrees' sandbox/. With `resume`,
    targets whose runs exist are continued where they are (see the module docstring); those in
    `restart` are forgotten first and start anew."""
    root = root.resolve()
    if per_run_s is not None and per_run_s <= 0:
        raise UserError(f"--per-run must be positive, got {per_run_s:g} s")
    for target in targets:
        if not (root / target).is_file():
            raise UserError(f"target {target} does not exist")
    if len({Path(t).stem for t in targets}) != len(targets):
        raise UserError("a target is named twice (runs are named after the target file)")
    if gpus is not None and (not gpus or len(set(gpus)) != len(gpus)):
        raise UserError(f"--gpus needs distinct device ids, got {','.join(gpus)}")
    out_dir = out_dir if out_dir.is_absolute() else root / out_dir
    start_branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    killed_here = None  # with --resume, one target: a killed one-GPU suite leaves the repository on its run's branch
    if resume and gpus is None and start_branch.startswith("tileloop/"):
        killed_here = next((t for t in targets if branch_of(t) == start_branch), None)
        state = existing_run(root, killed_here) if killed_here else None
        if state is None or not state.get("origin_branch"):
            raise UserError(f"the repository is on {start_branch}, which is no run of these targets",
                            hint="check out the branch the suite started from, then suite run --resume")
        start_branch = state["origin_branch"]  # its uncommitted candidate, if any, is the run's to repair
    elif _git(root, "status", "--porcelain", "--untracked-files=no"):
        raise UserError("the working tree has uncommitted changes to tracked files: commit or stash them first")
    if restart and not resume:
        raise UserError("--restart goes with --resume (without --resume every target starts anew)")
    for target in restart or []:
        if target not in targets:
            raise UserError(f"--restart {target} is not one of the suite's targets", hint="valid: " + ", ".join(targets))
        if target == killed_here:
            raise UserError(f"the repository is on the branch of {target}'s run, which was killed mid-experiment",
                            hint="suite run --resume first (it repairs that run), then --restart it")
    if restart:
        trees = run_trees(root)
        for target in restart:
            gone = forget_run(trees, target, out_dir)
            log(f"[suite] {target}: restart: " + ("forgot " + ", ".join(gone) if gone else "no earlier run"))
    out_dir.mkdir(parents=True, exist_ok=True)
    start_sha = _git(root, "rev-parse", start_branch)
    children = _Children()
    previous = signal.signal(signal.SIGTERM, children.kill_all)
    try:
        if gpus is None:
            done = {}
            for target in ([killed_here] if killed_here else []) + [t for t in targets if t != killed_here]:
                if target != killed_here:
                    _git(root, "checkout", "-q", start_branch)
                # with --resume, a run an earlier --gpus suite left in a worktree goes on in that worktree
                tree = (holder_of(root, target) if resume else None) or root
                done[target] = _run_one(root, tree, target, out_dir, per_run_s, extra, _env(), children, log, resume)
                if tree != root:
                    _git(tree, "checkout", "-q", "--detach", start_sha)  # leave the run's branch free
            _git(root, "checkout", "-q", start_branch)
            return [done[t] for t in targets]
        return _run_parallel(root, start_sha, targets, out_dir, per_run_s, extra, gpus, children, log, resume)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_parallel(root: Path, start_sha: str, targets: list[str], out_dir: Path, per_run_s: float | None,
                  extra: list[str], gpus: list[str], children: _Children, log, resume: bool = False) -> list[dict]:
    from loop.records import gitops

    gitops.ensure_excluded(root, "/sandbox/")
    trees = {}
    for gpu in gpus:
        tree = root / "sandbox" / WORKTREES / f"gpu{gpu}"
        if tree.exists():
            if not resume:  # with --resume a tree may hold a killed run's branch and its uncommitted candidate
                _git(tree, "checkout", "-q", "--detach", start_sha)
        else:
            tree.parent.mkdir(parents=True, exist_ok=True)
            _git(root, "worktree", "add", "-q", "--detach", str(tree), start_sha)
        trees[gpu] = tree
    queue = list(targets)
    # A run that exists lives in one worktree (its records are there): with --resume it goes on
    # there, on the GPU of that worktree. Worktrees of GPUs this call was not given (an earlier
    # call had more) are served by the given GPUs in turn, so no run is started anew, and none of
    # its branches forgotten, because its GPU is missing now.
    given = set(trees.values())
    orphans = [t for t in run_trees(root)[1:] if t not in given]
    served = {**{tree: gpu for gpu, tree in trees.items()}, **{t: gpus[i % len(gpus)] for i, t in enumerate(orphans)}}
    # (a run in the repository itself, from a suite without --gpus, is left to _run_one to refuse)
    holder = {t: tree for t in targets if resume and (tree := holder_of(root, t)) not in (None, root)}
    lock = threading.Lock()
    results: dict[str, dict] = {}

    def worker(gpu: str) -> None:
        env = {**_env(), "CUDA_VISIBLE_DEVICES": gpu}
        while True:
            with lock:
                mine = [t for t in queue if (served[holder[t]] if t in holder else gpu) == gpu]
                if not mine:
                    return
                # a run whose branch its tree has checked out first: a kill may have left its
                # candidate uncommitted there, which only its own resume repairs
                target = next((t for t in mine if t in holder
                               and _git(holder[t], "rev-parse", "--abbrev-ref", "HEAD") == branch_of(t)), mine[0])
                queue.remove(target)
            tree = holder.get(target, trees[gpu])
            if target not in holder:
                _git(tree, "checkout", "-q", "--detach", start_sha)
            try:
                entry = _run_one(root, tree, target, out_dir, per_run_s, extra, env, children,
                                 lambda m, g=gpu: log(f"[gpu {g}] {m}"), resume)
            except Exception as exc:  # one target's failure must not stop the other GPUs
                entry = {"schema": ENTRY_SCHEMA, "run": run_id_of(target), "target": target,
                         "error": f"{type(exc).__name__}: {exc}"}
            entry["gpu"] = gpu
            with lock:
                results[target] = entry
            # leave the run branch free: a branch checked out in a worktree cannot be checked out elsewhere
            _git(tree, "checkout", "-q", "--detach", start_sha)

    threads = [threading.Thread(target=worker, args=(gpu,), daemon=True) for gpu in gpus]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # join in slices, so that SIGTERM reaches the main thread's handler
            t.join(0.5)
    return [results[t] for t in targets if t in results]


def _f(x, fmt="{:.6f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else ""


# The reference suite's targets: memory-bound ops at >= 0.90 of same-run clone bandwidth at the
# largest benchmark shape; bf16 matmul at 4096^3 against torch.matmul (Triton 0.90, cuTile 0.80);
# every op at least torch.compile's speed at each benchmark shape.
CLONE_TARGET = 0.90
MATMUL_TARGET = {"triton": 0.90, "cutile": 0.80}
MATMUL_TARGET_SHAPE = "4096x4096x4096"
COMPUTE_BOUND_FLOP_PER_BYTE = 50.0  # above this, a fraction of copy bandwidth says nothing about the kernel


def _compute_bound(e: dict) -> bool:
    shape = e.get("largest_shape") or {}
    return bool(shape.get("bytes")) and shape.get("flops", 0) / shape["bytes"] >= COMPUTE_BOUND_FLOP_PER_BYTE


def _ratio(row: dict, ref: str) -> float:
    return float(row[ref]) / float(row["best (ms)"])


def target_rows(entries: list[dict]) -> list[dict]:
    """Each entry against the suite's targets: measured value, target, met or not. The value is the
    entry's final measurement (`tileloop report --measure`); for the clone-bandwidth target the
    loop's own measurement of the same version is shown too, and both must clear it."""
    rows = []
    for e in sorted(entries, key=lambda e: (e["op"], e["language"])):
        final, fl, impl = e.get("final") or [], e.get("final_largest") or {}, f"{e['op']} {e['language']}"

        def row(what, value, target, loop_value=None):
            # met only when every measurement of the version clears the target (the final one and,
            # where there is one, the loop's own: a kernel tuned at run time may pick differently)
            values = [v for v in (value, loop_value) if v is not None]
            met = "not measured" if value is None else ("met" if min(values) >= target else "not met")
            rows.append({"op / impl": impl, "target": what, "measured": "" if value is None else f"{value:.2f}",
                         "loop's measurement": "" if loop_value is None else f"{loop_value:.2f}",
                         "needed": f">= {target:.2f}", "result": met})

        if e["op"] == "matmul":
            at = next((r for r in final if r.get("shape") == MATMUL_TARGET_SHAPE and r.get("dtype") == "bfloat16"), None)
            row(f"bf16 {MATMUL_TARGET_SHAPE}: torch.matmul time / ours",
                _ratio(at, "torch eager (ms)") if at else None, MATMUL_TARGET.get(e["language"], 0.8))
        elif not _compute_bound(e):
            frac = fl.get("best, fraction of clone bandwidth")
            row(f"largest shape ({fl.get('shape', '?')} {fl.get('dtype', '')}): fraction of clone bandwidth",
                float(frac) if frac not in (None, "", "n/a") else None, CLONE_TARGET,
                (e.get("largest_best") or {}).get("frac_clone_bw"))
        worst = min(final, key=lambda r: _ratio(r, "torch.compile (ms)"), default=None)
        row("torch.compile time / ours, worst shape" + (f" ({worst['shape']} {worst['dtype']})" if worst else ""),
            _ratio(worst, "torch.compile (ms)") if worst else None, 1.0)
    return rows


def summarize(entries: list[dict], title: str) -> str:
    failed = [e for e in entries if "error" in e]
    entries = sorted((e for e in entries if "error" not in e), key=lambda e: (e["op"], e["language"]))
    devices = sorted({str(e.get("device")) for e in entries})
    lines = [f"# {title}", "",
             f"- device: {', '.join(devices)} (every number below is from runs on it)",
             "- each row: `tileloop run <target>` with default settings, then `tileloop report --measure` (best version against "
             "PyTorch eager and torch.compile, in one worker, same inputs)",
             "- latency: geometric mean over the spec's benchmark shapes of the target backend's median; 'largest' columns: "
             "the benchmark shape that moves the most bytes",
             "- fraction: of the same-run `clone` bandwidth (memory-bound ops), or of torch.matmul's FLOP rate (matmul, "
             "where torch eager is torch.matmul)", ""]
    rows = []
    for e in entries:
        fl = e.get("final_largest") or {}
        shape = e.get("largest_shape") or {}
        if e["op"] == "matmul" and fl:
            frac = f"{_ratio(fl, 'torch eager (ms)'):.2f} of torch.matmul"
        elif _compute_bound(e):
            frac = "n/a (compute-bound)"
        else:
            frac = fl.get("best, fraction of clone bandwidth") or _f((e.get("largest_best") or {}).get("frac_clone_bw"), "{:.2f}")
        vs_compile = [_ratio(r, "torch.compile (ms)") for r in e.get("final") or []]
        rows.append({
            "op": e["op"], "impl": f"{e['language']}/{e['target_backend']}",
            "baseline ms": _f(e["baseline_ms"]), "final ms": _f(e["best_ms"]), "speedup": _f(e["speedup"], "{:.2f}x"),
            "largest shape": f"{'x'.join(map(str, shape.get('shape', [])))} {shape.get('dtype', '')}",
            "final ms (largest)": fl.get("best (ms)", _f((e.get("largest_best") or {}).get("median_ms"))),
            "fraction (largest)": frac,
            "torch eager ms": fl.get("torch eager (ms)", ""), "torch.compile ms": fl.get("torch.compile (ms)", ""),
            "vs torch.compile (worst shape)": f"{min(vs_compile):.2f}x" if vs_compile else "not measured",
            "experiments": f"{e['iterations']} ({e['outcomes']['keep']}k/{e['outcomes']['revert']}r/{e['outcomes']['crash']}c)"
                           + (" cut off" if e.get("cut_off") else "") + (" resumed" if e.get("resumed") else ""),
            "median s/iter": _f(e.get("median_iteration_wall_s"), "{:.1f}"),
            "stop": (e.get("stop") or {}).get("reason", "")[:70],
        })
    lines += [markdown_table(rows), ""]
    lines += [f"- not measured: {e.get('target') or e['run']}: {e['error']}" for e in failed]
    lines += ["", "## Targets", "",
              f"Memory-bound ops: >= {CLONE_TARGET:.2f} of the same-run clone bandwidth at the largest benchmark shape. "
              f"bf16 matmul {MATMUL_TARGET_SHAPE}: >= {MATMUL_TARGET['triton']:.2f} (Triton) / "
              f"{MATMUL_TARGET['cutile']:.2f} (cuTile) of torch.matmul's speed. Every op: at least torch.compile's "
              "speed at every benchmark shape. 'measured': the final measurement (`tileloop report --measure`); "
              "'loop's measurement': the run's own timing of the same version (a target counts as met only when both "
              "clear it).", "", markdown_table(target_rows(entries)) if entries else "", ""]
    lines += ["## Recipes kept", ""]
    for e in entries:
        lines.append(f"- {e['op']} {e['language']}: " + ("; ".join(e["kept"]) if e["kept"] else "none"))
    tileir = next((e["availability"]["tileir"] for e in entries if "tileir" in e.get("availability", {})), None)
    tileir_cell = ("measured in the runs: see their perf_results" if tileir and tileir.get("available")
                   else f"unavailable: {(tileir or {}).get('reason') or 'not probed'}")
    lines += ["", "## Triton (PTX backend) against cuTile (Tile IR), final versions, largest shape", "",
              f"Triton through the Tile IR backend of nvtriton (`ENABLE_TILE=1`): {tileir_cell}. No number below is a "
              "Triton-on-Tile-IR number.", ""]
    by_op: dict[str, dict] = {}
    for e in entries:
        by_op.setdefault(e["op"], {})[e["language"]] = e
    cmp_rows = []
    for op, d in sorted(by_op.items()):
        t, c = d.get("triton"), d.get("cutile")
        tl = (t or {}).get("final_largest") or {}
        cl = (c or {}).get("final_largest") or {}
        tm = tl.get("best (ms)") or _f(((t or {}).get("largest_best") or {}).get("median_ms"))
        cm = cl.get("best (ms)") or _f(((c or {}).get("largest_best") or {}).get("median_ms"))
        shape = ((t or c or {}).get("largest_shape") or {})
        cmp_rows.append({"op": op, "shape": f"{'x'.join(map(str, shape.get('shape', [])))} {shape.get('dtype', '')}",
                         "Triton ms (backend)": f"{tm} ({t['target_backend']})" if tm else "not run",
                         "cuTile ms (backend)": f"{cm} ({c['target_backend']})" if cm else "not run",
                         "Triton/TileIR (nvtriton)": tileir_cell,
                         "cuTile / Triton time": f"{float(cm) / float(tm):.2f}" if tm and cm else ""})
    lines += [markdown_table(cmp_rows), ""]
    return "\n".join(lines)


def load_entries(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            d = json.loads(f.read_text())
            if d.get("schema") == ENTRY_SCHEMA:
                out.append(d)
    if not out:
        raise UserError(f"no suite entries ({ENTRY_SCHEMA}) in {', '.join(map(str, paths))}")
    return out
