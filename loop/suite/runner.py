"""`tileloop suite run`: tune many targets unattended, one after another.

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
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.language import language_of_name
from loop.common.processes import die_with_parent
from loop.measure.launch import kill_group, with_package_path
from loop.records import gitops
from loop.run import state as st
from loop.suite import profiles
from loop.suite.engines import Engine, SuiteCall
from loop.suite.summary import ENTRY_SCHEMA, entry_from_run, record_targets, write_entry
from loop.suite.unattended import rows, verdict
from loop.suite.worktrees import (
    WORKTREES,
    branch_of,
    entry_of_finished,
    existing_run,
    finished,
    forget_run,
    git_output,
    holder_of,
    run_id_of,
    run_trees,
)


def child_env() -> dict:
    """The environment of the child tileloop processes: this tileloop importable, as for workers."""
    return with_package_path(dict(os.environ))


class Children:
    """Run subprocesses (each in its own process group) and kill them all if the suite is killed:
    a `timeout` around the suite must not leave a tuning run behind on a GPU."""

    def __init__(self):
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(*args, start_new_session=True, preexec_fn=die_with_parent, **kwargs)
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


def _run_child(cmd: list[str], run_root: Path, run_id: str, out_dir: Path, per_run_s: float | None, env: dict,
               children: Children, log, target: str, append: bool) -> tuple[int, float | None]:
    """One `tileloop run|resume` child, its stderr in <run_id>.log; (exit code, when it was cut off:
    the epoch seconds of the kill, None if it ended by itself). A child past `per_run_s` is killed and
    its record repaired (`resume --no-continue`)."""
    with open(out_dir / f"{run_id}.log", "a" if append else "w") as err:
        proc = children.popen(cmd, cwd=run_root, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            proc.wait(timeout=per_run_s)
        except subprocess.TimeoutExpired:
            cut_at = time.time()
            kill_group(proc)
            proc.wait()
            log(f"[suite] {target}: cut off after {per_run_s:.0f} s; repairing the record")
            subprocess.run([sys.executable, "-m", "loop", "resume", "--run", run_id, "--no-continue"], cwd=run_root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return proc.returncode, cut_at
        finally:
            children.done(proc)
    return proc.returncode, None


def last_error(log_path: Path, most: int = 300) -> str | None:
    """The last `error:` line a run wrote to its log (its one-line reason for stopping), cut to `most`
    characters; None where there is none."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = next((line for line in reversed(lines) if line.startswith("error:")), None)
    return found[len("error:"):].strip()[:most] if found else None


def budget_args(per_run_s: float | None, extra: list[str]) -> list[str]:
    """`--time-budget` for a run under a `--per-run` limit (unless the suite's run arguments give their
    own): the limit less the run's start (environment probe, check) and the gaps between experiments,
    so that the run starts no experiment it is not expected to finish (`loop.run.unattended.propose`)
    and ends by its own stop rule rather than the limit's kill."""
    if per_run_s is None or "--time-budget" in extra:
        return []
    return ["--time-budget", f"{max(per_run_s - max(30.0, 0.15 * per_run_s), per_run_s / 2):.0f}s"]


def missed_targets(entry: dict) -> list[str]:
    """The verdicts of the entry's final-measurement rows that miss an unattended target (not those
    only without a value to judge)."""
    return [v for r in rows([entry]) if (v := verdict(r)).startswith("not met")]


def run_one(root: Path, run_root: Path, target: str, out_dir: Path, per_run_s: float | None, extra: list[str],
             env: dict, children: Children, log, resume: bool = False, profile: bool = True) -> dict:
    """`tileloop run` of one target in `run_root` (the repository or a worktree of it), then the
    report, then (with `profile`, on a GPU) an Nsight Compute profile of the best version where it
    misses an unattended target (`loop.suite.profiles`). With `resume`, a run of the target already in `run_root` is continued (`tileloop
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
        cmd = [sys.executable, "-m", "loop", "run", str(path), "--branch", branch_of(target), *extra,
               *budget_args(per_run_s, extra)]
    else:
        done = finished(state)
        kept = entry_of_finished(out_dir / f"{run_id}.json", state) if done else None
        if kept is not None:
            log(f"[suite] {target}: finished before; its entry stands")
            return kept
        for lock in gitops.clear_stale_locks(run_root):  # a run killed mid-commit leaves git's lock behind
            log(f"[suite] {target}: removed the stale {lock} its killed run left")
        git_output(run_root, "checkout", "-q", state["branch"])
        log(f"[suite] {target}: " + ("finished before; reporting it again (its entry has no final measurement)" if done else
                                     f"tileloop resume (branch {state['branch']}, {state.get('last_iteration', -1)} experiments recorded)"))
        cmd = None if done else [sys.executable, "-m", "loop", "resume", "--run", run_id]
    t0, started = time.monotonic(), time.time()
    cut_at, returncode = None, 0
    if cmd is not None:
        returncode, cut_at = _run_child(cmd, run_root, run_id, out_dir, per_run_s, env, children, log, target,
                                         append=state is not None)
    wall = time.monotonic() - t0
    run_dir = run_root / "sandbox" / run_id
    if not (run_dir / "results.jsonl").is_file():  # e.g. a baseline that does not pass: said in the entry, not only the log
        why = last_error(out_dir / f"{run_id}.log")
        log(f"[suite] {target}: no records (exit {returncode}){': ' + why if why else ''}; see {run_id}.log")
        entry = {"schema": ENTRY_SCHEMA, "run": run_id, "target": str(path),
                 "error": f"no records (exit {returncode})" + (f": {why}" if why else "")}
        write_entry(out_dir, entry)
        return entry
    measure = ["--measure"] if "--device" not in extra or extra[extra.index("--device") + 1] == "cuda" else []
    rep_proc = children.popen([sys.executable, "-m", "loop", "report", "--run", run_id, *measure, "--json"], cwd=run_root,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err_text = rep_proc.communicate()
    finally:
        children.done(rep_proc)
    final = json.loads(out).get("final") if rep_proc.returncode == 0 and out.strip() else None
    entry = entry_from_run(run_dir, final, cut_at is not None, wall, cut_at=cut_at)
    entry["op"], entry["target"] = path.parent.name, str(path)
    # where and when it ran (this host's clock), for the summary's rows per node and its plot
    entry["node"], entry["started"], entry["ended"] = socket.gethostname(), round(started, 3), round(time.time(), 3)
    entry["language"] = language_of_name(path.stem) or "triton"  # `<op>_<language>.py`; a bare name is Triton
    if state is not None:
        entry["resumed"] = True  # the run spans suite calls (and maybe machines): its wall time is this call's
    if final is None and measure:  # no final measurement was asked for on the CPU
        entry["final_error"] = ((err_text or out)[-400:] if (err_text or out).strip() else
                                f"report --measure exited {rep_proc.returncode} with no output (killed?)")
    write_entry(out_dir, entry)
    missed = missed_targets(entry) if final is not None else []
    if profile and measure and missed:
        log(f"[suite] {target}: {missed[0]}; profiling its best version under Nsight Compute")
        entry["profile"] = profiles.profile_best(run_root, str(path), entry, env, children.popen, children.done)
        log(f"[suite] {target}: {profiles.note(entry['profile'])}")
        write_entry(out_dir, entry)
    state = st.view(run_root, run_id) or {}
    if state.get("best_commit"):  # the tuned kernel itself, for review and for profiling elsewhere
        best_src = git_output(root, "show", f"{state['best_commit']}:{state['target']}")
        atomic_write_text(out_dir / f"{run_id}-best{path.suffix}", best_src + "\n")
    for f in ("report.md", "latency.png", "perf_results.md", "results.jsonl"):
        if (run_dir / f).is_file():
            shutil.copy2(run_dir / f, out_dir / f"{run_id}-{f}")
    log(f"[suite] {target}: {entry['speedup']:.2f}x (kept paired speedups multiplied; baseline {entry['baseline_ms']:.6f} "
        f"ms, best {entry['best_ms']:.6f} ms, each in its own measurement), {entry['iterations']} experiments, {wall:.0f} s")
    return entry


def run_suite(root: Path, targets: list[str], out_dir: Path, per_run_s: float | None, extra: list[str], log=print,
              gpus: list[str] | None = None, resume: bool = False, restart: list[str] | None = None,
              engine: Engine | None = None, profile: bool = True) -> list[dict]:
    """Each target tuned on its own branch from the current commit, by `engine` (default: this
    host, `LocalEngine(gpus)`). With `gpus` (device ids), one target per GPU at a time, each GPU in
    its own git worktree (sandbox/suite-worktrees/gpu<id>) with CUDA_VISIBLE_DEVICES set; the runs'
    records stay in those worktrees' sandbox/. With `resume`, targets whose runs exist are continued
    where they are (see the module docstring); those in `restart` are forgotten first and start anew."""
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
    engine = engine or LocalEngine(gpus)
    out_dir = out_dir if out_dir.is_absolute() else root / out_dir
    start_branch = git_output(root, "rev-parse", "--abbrev-ref", "HEAD")
    killed_here = None  # with --resume, one target: a killed one-GPU suite leaves the repository on its run's branch
    if resume and gpus is None and start_branch.startswith("tileloop/"):
        killed_here = next((t for t in targets if branch_of(t) == start_branch), None)
        state = existing_run(root, killed_here) if killed_here else None
        if state is None or not state.get("origin_branch"):
            raise UserError(f"the repository is on {start_branch}, which is no run of these targets",
                            hint="check out the branch the suite started from, then suite run --resume")
        start_branch = state["origin_branch"]  # its uncommitted candidate, if any, is the run's to repair
    elif git_output(root, "status", "--porcelain", "--untracked-files=no"):
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
    record_targets(out_dir, targets)  # so that a summary of a suite cut short names the targets without an entry
    call = SuiteCall(root=root, start_branch=start_branch, start_sha=git_output(root, "rev-parse", start_branch),
                     targets=tuple(targets), out_dir=out_dir, per_run_s=per_run_s, extra=tuple(extra), resume=resume,
                     killed_here=killed_here, log=log, profile=profile)
    children = Children()
    previous = signal.signal(signal.SIGTERM, children.kill_all)
    try:
        return engine.run(call, children)
    finally:
        signal.signal(signal.SIGTERM, previous)


class LocalEngine:
    """This host: without `gpus`, one target after another in the repository itself; with `gpus`,
    one target per GPU at a time, each GPU in its own git worktree."""

    name = "local"

    def __init__(self, gpus: list[str] | None = None):
        self.gpus = gpus

    def run(self, call: SuiteCall, children: Children) -> list[dict]:
        root, extra, killed_here = call.root, list(call.extra), call.killed_here
        if self.gpus is not None:
            return _run_parallel(root, call.start_sha, list(call.targets), call.out_dir, call.per_run_s, extra, self.gpus,
                                 children, call.log, call.resume, call.profile)
        done = {}
        for target in ([killed_here] if killed_here else []) + [t for t in call.targets if t != killed_here]:
            if target != killed_here:
                git_output(root, "checkout", "-q", call.start_branch)
            # with --resume, a run an earlier --gpus suite left in a worktree goes on in that worktree
            tree = (holder_of(root, target) if call.resume else None) or root
            done[target] = run_one(root, tree, target, call.out_dir, call.per_run_s, extra, child_env(), children, call.log,
                                   call.resume, call.profile)
            if tree != root:
                git_output(tree, "checkout", "-q", "--detach", call.start_sha)  # leave the run's branch free
        git_output(root, "checkout", "-q", call.start_branch)
        return [done[t] for t in call.targets]


def _run_parallel(root: Path, start_sha: str, targets: list[str], out_dir: Path, per_run_s: float | None,
                  extra: list[str], gpus: list[str], children: Children, log, resume: bool = False,
                  profile: bool = True) -> list[dict]:

    gitops.ensure_excluded(root, "/sandbox/")
    trees = {}
    for gpu in gpus:
        tree = root / "sandbox" / WORKTREES / f"gpu{gpu}"
        if tree.exists():
            if not resume:  # with --resume a tree may hold a killed run's branch and its uncommitted candidate
                git_output(tree, "checkout", "-q", "--detach", start_sha)
        else:
            tree.parent.mkdir(parents=True, exist_ok=True)
            git_output(root, "worktree", "add", "-q", "--detach", str(tree), start_sha)
        trees[gpu] = tree
    queue = list(targets)
    # A run that exists lives in one worktree (its records are there): with --resume it goes on
    # there, on the GPU of that worktree. Worktrees of GPUs this call was not given (an earlier
    # call had more) are served by the given GPUs in turn, so no run is started anew, and none of
    # its branches forgotten, because its GPU is missing now.
    given = set(trees.values())
    orphans = [t for t in run_trees(root)[1:] if t not in given]
    served = {**{tree: gpu for gpu, tree in trees.items()}, **{t: gpus[i % len(gpus)] for i, t in enumerate(orphans)}}
    # (a run in the repository itself, from a suite without --gpus, is left to run_one to refuse)
    holder = {t: tree for t in targets if resume and (tree := holder_of(root, t)) not in (None, root)}
    lock = threading.Lock()
    results: dict[str, dict] = {}

    def worker(gpu: str) -> None:
        env = {**child_env(), "CUDA_VISIBLE_DEVICES": gpu}
        while True:
            with lock:
                mine = [t for t in queue if (served[holder[t]] if t in holder else gpu) == gpu]
                if not mine:
                    return
                # a run whose branch its tree has checked out first: a kill may have left its
                # candidate uncommitted there, which only its own resume repairs
                target = next((t for t in mine if t in holder
                               and git_output(holder[t], "rev-parse", "--abbrev-ref", "HEAD") == branch_of(t)), mine[0])
                queue.remove(target)
            tree = holder.get(target, trees[gpu])
            if target not in holder:
                git_output(tree, "checkout", "-q", "--detach", start_sha)
            try:
                entry = run_one(root, tree, target, out_dir, per_run_s, extra, env, children,
                                 lambda m, g=gpu: log(f"[gpu {g}] {m}"), resume, profile)
            except Exception as exc:  # one target's failure must not stop the other GPUs
                entry = {"schema": ENTRY_SCHEMA, "run": run_id_of(target), "target": target,
                         "error": f"{type(exc).__name__}: {exc}"}
            entry["gpu"] = gpu
            with lock:
                results[target] = entry
            # leave the run branch free: a branch checked out in a worktree cannot be checked out elsewhere
            git_output(tree, "checkout", "-q", "--detach", start_sha)

    threads = [threading.Thread(target=worker, args=(gpu,), daemon=True) for gpu in gpus]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # join in slices, so that SIGTERM reaches the main thread's handler
            t.join(0.5)
    return [results[t] for t in targets if t in results]
