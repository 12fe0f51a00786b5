"""`tileloop init` (and the start of `tileloop run`): the target and spec checked, a new branch from
a clean tree, the environment probed, the backends chosen, and the baseline measured. A failure
leaves nothing half-made: the user's branch checked out again, the empty run branch deleted."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict
from pathlib import Path

from loop import backends as backend_registry
from loop import decide
from loop.common.errors import UserError
from loop.common.messages import Inflight
from loop.common.settings import Settings
from loop.measure import external, probe
from loop.records import gitops
from loop.run import state as st
from loop.run.baseline import baseline
from loop.run.core import Log, Run, now, stderr_log
from loop.run.levers import order_text, run_order
from loop.target.check import check, line_of
from loop.target.contract import load_harness_target, load_kernel
from playbook import get as get_recipe
from playbook.hazards import scan

DEFAULT_ARCHS = ("sm_90", "sm_100")  # Hopper and Blackwell: every candidate must compile for both


def default_branch(op: str, now: dt.datetime | None = None) -> str:
    return f"tileloop/{op}-{(now or dt.datetime.now()):%Y%m%d-%H%M}"


def init_run(target: str, *, device: str, branch: str | None, target_backend: str | None, seed: int,
             policy: decide.Policy, settings: Settings, log: Log = stderr_log,
             archs: list[str] | None = None, worker_timeout_s: float | None = None,
             harness: external.Harness | None = None, skip_recipes: list[str] | None = None,
             mode: str = "agent") -> Run:
    """Branch and baseline. With `harness`, the repository's own commands decide (no spec.py, no compile gate).
    `mode` "run" (an unattended run) is recorded before the baseline, so that a run killed right
    after its baseline is continued by `tileloop resume`, not left waiting for an agent's step."""
    root = gitops.find_root(Path.cwd())
    target_rel, spec_rel, language, op, archs = _target(target, root, harness, target_backend, archs)
    if language == "cutile" and device == "cpu" and harness is None:
        raise _no_gpu(language, target_rel, "--device cpu was asked")
    live = in_progress(root, str(target_rel))
    if live is not None and branch is None:
        raise UserError(f"a run of {target_rel} is in progress: {describe(live)}",
                        hint=f"tileloop resume --run {live.run_id} continues it, tileloop run {target_rel} continues it "
                             "unattended; pass --branch NAME to start another run")
    for rid in skip_recipes or []:
        get_recipe(rid)  # an unknown id is refused with the list of valid ones
    gitops.require_clean(root)
    if not gitops.is_tracked(root, str(target_rel)):
        raise UserError(f"target {target_rel} is not committed", hint="git add and commit it first")
    if spec_rel is not None and not gitops.is_tracked(root, str(spec_rel)):
        raise UserError(f"spec {spec_rel} is not committed", hint="git add and commit it first")
    for hazard in scan((root / target_rel).read_text(), language):
        if hazard.severity != "info":
            log(f"Tile IR hazard: {target_rel}:{hazard}")
    branch, run_id = _branch(root, branch, op)
    names = [external.BACKEND] if harness else backend_registry.applicable(language, device, target_backend)
    log(f"probing the environment ({device})")
    env = probe.probe_environment(root, settings)
    if device == "cuda" and not env.get("cuda_available"):
        raise _no_gpu(language, target_rel, env.get("cuda_reason"))
    avail, chosen = _choose_backend(names, env, language, device, target_backend, harness is not None)
    if harness is None:
        _require_checked(target_rel, device, settings, root, log)
    state = st.RunState(run_id=run_id, branch=branch, origin_branch=gitops.current_branch(root), target=str(target_rel),
                        spec="" if spec_rel is None else str(spec_rel), language=language, op=op, device=device,
                        target_backend=chosen, backends=names, availability=avail, base_commit=gitops.head_sha(root),
                        seed=seed, env=env, untracked_at_start=list(gitops.tree_status(root).untracked),
                        policy=asdict(policy), created=now(), archs=list(DEFAULT_ARCHS if archs is None else archs),
                        worker_timeout_s=worker_timeout_s or settings.worker_timeout_s,
                        harness=harness.to_json() if harness else None, skip_recipes=list(skip_recipes or []),
                        mode=mode)
    return _start(root, state, settings, log)


def _no_gpu(language: str, target_rel: Path, reason) -> UserError:
    """A run without a GPU: a Triton target runs under the interpreter; a cuTile target has none, so
    the refusal names what works here instead."""
    if language != "cutile":
        return UserError(f"no GPU available: {reason}", hint="pass --device cpu to run the loop under the Triton interpreter")
    return UserError(f"a cuTile target runs on a GPU only ({reason}): cuTile has no CPU interpreter",
                     hint=f"what works here: tileloop check {target_rel} (the spec and the build), tileloop compile "
                          f"{target_rel} --arch sm_90,sm_100, tileloop playbook plan {target_rel}")


def in_progress(root: Path, target_rel: str) -> st.RunState | None:
    """The run of this target that has not stopped (an agent's, or an unattended one cut short), if any."""
    for rid in st.list_runs(root):
        try:
            state = st.load(root, rid)
        except UserError:
            continue
        if state.target == target_rel and state.stopped is None:
            return state
    return None


def describe(state: st.RunState) -> str:
    """One line on a run: its id, branch, experiments, and whether one was interrupted."""
    done = max(state.last_iteration, 0)
    interrupted = state.inflight is not None
    return (f"{state.run_id} on branch {state.branch}, {done} experiment(s)"
            + (f", interrupted at iteration {state.inflight.iteration}" if interrupted else ""))


def _target(target: str, root: Path, harness: external.Harness | None, target_backend: str | None,
            archs: list[str] | None) -> tuple[Path, Path | None, str, str, list[str] | None]:
    """(target, spec, language, op, archs) of a run: a target with its spec.py, or, with `harness`,
    any Python file of the repository (no spec, no compile gate)."""
    if harness is None:
        kernel = load_kernel(target, root)
        return kernel.target, kernel.spec, kernel.language, kernel.op, archs
    if target_backend is not None:
        raise UserError("--target-backend does not apply to a run with --test-cmd/--bench-cmd: the bench command decides")
    if archs:
        raise UserError("--archs does not apply to a run with --test-cmd/--bench-cmd: the compile gate needs the "
                        "example inputs of a spec.py", hint="let the test command compile what it needs")
    target_rel, language, op = load_harness_target(target, root)
    return target_rel, None, language, op, []


def _require_checked(target_rel: Path, device: str, settings: Settings, root: Path, log: Log) -> None:
    """The checks of `tileloop check` (without the build: the baseline's compile gate makes it): no run
    starts on a target or spec with a problem, and every problem is named at once."""
    result = check(root / target_rel, device=device, archs=[], settings=settings, root=root, log=log)
    for warning in result["warnings"]:
        log(f"warning: {line_of(warning)}")
    if result["problems"]:
        for p in result["problems"][1:]:
            log(f"problem: {line_of(p)}")
        raise UserError(f"{len(result['problems'])} problem(s) in {target_rel} and its spec: {line_of(result['problems'][0])}",
                        hint=f"tileloop check {target_rel} lists them all", problems=result["problems"])


def _branch(root: Path, branch: str | None, op: str) -> tuple[str, str]:
    """The run's branch and id. A default name never collides: a second run in the same minute gets -2, -3, ..."""
    if branch is None:
        base_name, n = default_branch(op), 1
        branch = base_name
        while gitops.branch_exists(root, branch) or st.state_path(root, branch.removeprefix("tileloop/")).exists():
            n += 1
            branch = f"{base_name}-{n}"
    if gitops.branch_exists(root, branch):
        raise UserError(f"branch {branch!r} already exists", hint="pass --branch NAME, or wait a minute for a new default name")
    gitops.check_branch_name(root, branch)
    run_id = re.sub(r"[^A-Za-z0-9._-]+", "-", branch.removeprefix("tileloop/"))
    if st.state_path(root, run_id).exists():
        raise UserError(f"a run named {run_id!r} already exists in {st.SANDBOX}/", hint="pass --branch NAME")
    return branch, run_id


def _choose_backend(names: list[str], env: dict, language: str, device: str, target_backend: str | None,
                    harness: bool) -> tuple[dict, str]:
    """Each backend's availability on this machine, and the target backend (the one whose latency decides)."""
    if harness:
        return {external.BACKEND: {"available": True, "reason": ""}}, external.BACKEND
    avail, chosen = backend_registry.choose(language, device, env, target_backend)
    return {n: a.to_json() for n, a in avail.items()}, chosen


def _start(root: Path, state: st.RunState, settings: Settings, log: Log) -> Run:
    """Record the run (in flight at iteration 0, so that a kill from here on is resumed by `tileloop
    resume`), make its branch, then measure the baseline. A failure that is not a kill undoes it all."""
    gitops.ensure_excluded(root, f"/{st.SANDBOX}/")
    previous = st.current_or_none(root)
    state.inflight = Inflight(0, "start", "baseline")
    exp = Run(root, state, settings, log)
    exp.save()
    st.set_current(root, state.run_id)
    try:
        gitops.create_branch(root, state.branch)
        exp.snapshot_git_dir()  # .git/hooks, .git/info, .git/config: restored from here at every check
        log(f"run {state.run_id} on branch {state.branch}: target backend {state.target_backend}; measuring the baseline")
        if state.mode == "run":
            exp.start_host()  # ready by the first experiment (`unattended.run_loop` ends it)
        baseline(exp)
        if state.mode == "run" and not state.harness:
            for line in order_text(run_order(exp)):  # the order the first experiments come in, and why
                log(line)
    except BaseException:
        exp.close_host()
        # leave nothing half-made: back to the user's branch, drop the run branch and state, keep the logs
        if gitops.current_branch(root) == state.branch:
            gitops.checkout(root, state.origin_branch or state.base_commit)
        if gitops.branch_exists(root, state.branch):
            gitops.delete_branch(root, state.branch)
        st.state_path(root, state.run_id).unlink(missing_ok=True)
        if previous:
            st.set_current(root, previous)
        else:
            (root / st.SANDBOX / "CURRENT").unlink(missing_ok=True)
        raise
    return exp
