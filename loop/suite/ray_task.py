"""A `suite run --ray` task and what travels between it and the driver, with no shared filesystem:
its input (`TaskInput`, and a git bundle of the commit the suite starts from), word that it began
(`Started`, its first item: the driver gives a task that never sends it a deadline), the checkpoints it
sends while its run goes on (`Checkpoint`) and its result when the run ends (`TaskResult`), each a
bundle of the run's new git objects and a tar archive of its records; the helpers that make and
take them in (a ref set only where it did not move meanwhile, records swapped in whole).

The task (`run_task`, on any node) makes a clone of its own in its node's temporary folder and
runs there what the local suite runs (`runner.run_one`: `tileloop run`, or `tileloop resume` for a
run sent with its records, the cut-off repair, `tileloop report`), in a thread, while it looks at
the run's records: each time an iteration is sealed in them (the baseline included), it yields a
checkpoint of the run's branch, `refs/tileloop/<run>/...` and `sandbox/<run>/` as they then stand
(read twice and checked against their seal: taken only where nothing moved meanwhile). When the
run ends (finished, cut off by `--per-run`, failed or killed) it yields the run's result: its refs,
records, entry, report and log. Ray is not imported here: the driver (`ray_engine`) runs this as a
task."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from loop.records import git_files, gitops
from loop.run import state as st
from loop.run.core import GIT_SNAPSHOT, SEALED
from loop.suite.runner import Children, child_env, run_one
from loop.suite.summary import ENTRY_SCHEMA
from loop.suite.worktrees import branch_of, git_output, run_id_of

RUN_FOLDER = "run"  # in a task's archive: the run's sandbox/<run>/
OUT_FOLDER = "out"  # in a task's archive: its entry, report, plot, perf_results.md and log
TASK_OUT = "suite"  # under a task clone's sandbox/: the run's entry and files before they travel
CHECK_S = 0.5  # between a task's looks at its run's records for a newly sealed iteration
CLONE_PREFIX = "tileloop-task-"  # a task's clone, in its node's temporary folder
PID_FILE = "task.pid"  # in a task's clone: the task's process, so that a later task removes a lost one's clone
INCOMING = ".incoming"  # under sandbox/: a run's records made ready there, then swapped in
ABSENT = "0" * 40  # `git update-ref REF NEW OLD` with this OLD: REF must not exist yet


@dataclass(frozen=True)
class TaskInput:
    """What a task needs besides the bundle's bytes: the run, where it starts, how it is run."""

    target: str
    start_branch: str
    start_sha: str
    refs: dict[str, str]  # ref -> commit to create in the clone (the bundle holds their objects)
    per_run_s: float | None
    extra: tuple[str, ...]
    identity: tuple[str, str]  # user.name, user.email: the run's commits carry the user's identity
    profile: bool = True  # the suite's --no-profile, off


@dataclass(frozen=True)
class TaskResult:
    """What a task returns when its run ends: its entry, the node, the run's refs and their new
    objects (None when there are none), the records and files (a tar archive), its log lines."""

    target: str
    node: str
    entry: dict
    refs: dict[str, str]
    bundle: bytes | None
    archive: bytes
    log: list[str]


@dataclass(frozen=True)
class Started:
    """A task's first item, sent as soon as its worker runs it: where it runs (the node and the
    task's process). A task whose worker never starts sends none, and the driver stops waiting."""

    target: str
    node: str
    pid: int


@dataclass(frozen=True)
class Checkpoint:
    """A run as it stood after an iteration was sealed in its records, sent while the task goes on:
    the run's refs and their new objects, its `sandbox/<run>/` (a tar archive), the iteration, and
    where it ran (the node and the task's process)."""

    target: str
    node: str
    pid: int
    iteration: int
    refs: dict[str, str]
    bundle: bytes | None
    archive: bytes


# ------------------------------------------------------------------ git bundles and archives


def make_bundle(repo: Path, refs: list[str], exclude: str | None = None) -> bytes | None:
    """A bundle of `refs` (less what `exclude` reaches), or None when it would hold no object."""
    if not refs:
        return None
    if exclude and git_output(repo, "rev-list", "--count", *refs, f"^{exclude}") == "0":
        return None
    with tempfile.TemporaryDirectory(prefix="tileloop-bundle-") as tmp:
        path = Path(tmp) / "refs.bundle"
        git_output(repo, "bundle", "create", "-q", str(path), *refs, *([f"^{exclude}"] if exclude else []))
        return path.read_bytes()


def take_refs(repo: Path, refs: dict[str, str], bundle: bytes | None, sent: dict[str, str] | None = None) -> list[str]:
    """The objects of `bundle` put into `repo` and `refs` set there. With `sent` (the refs as they
    were when the run was sent), a ref is set only where it is still as it was then (absent, if it
    was not sent): one that moved here meanwhile is left alone. What was left alone, said in words."""
    if bundle is not None:
        with tempfile.TemporaryDirectory(prefix="tileloop-bundle-") as tmp:
            path = Path(tmp) / "refs.bundle"
            path.write_bytes(bundle)
            git_output(repo, "bundle", "unbundle", str(path))  # objects only, no transport; the refs are set below
    refused = []
    for ref, sha in refs.items():
        was = [] if sent is None else [sent.get(ref, ABSENT)]
        try:
            git_output(repo, "update-ref", ref, sha, *was)
        except subprocess.CalledProcessError:
            refused.append(f"{ref} moved here since the run was sent (it is at {gitops.ref_sha(repo, ref) or 'nothing'})")
    return refused


def run_refs(repo: Path, run_id: str, branch: str) -> dict[str, str]:
    """A run's branch and its `refs/tileloop/<run>/...` in `repo`: ref -> commit."""
    text = git_output(repo, "for-each-ref", "--format=%(refname) %(objectname)", f"refs/heads/{branch}",
                      f"refs/tileloop/{run_id}/")
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())


def pack(folders: dict[str, Path]) -> bytes:
    """A gzipped tar of `folders` (name in the archive -> folder here; a missing one is left out)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, folder in folders.items():
            if folder.is_dir():
                tar.add(folder, arcname=name)
    return buf.getvalue()


def unpack(archive: bytes, name: str, dest: Path, replace: bool) -> bool:
    """The archive's folder `name` put at `dest` (with `replace`, instead of what is there; else
    its files over those there); whether the archive held it. Members stay inside `dest`."""
    with tempfile.TemporaryDirectory(prefix="tileloop-unpack-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(tmp, members=[m for m in tar.getmembers() if m.name == name or m.name.startswith(f"{name}/")],
                           filter="data")
        got = Path(tmp) / name
        if not got.is_dir():
            return False
        if replace and dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(got, dest, dirs_exist_ok=True)
    return True


def rehome(root: Path, run_id: str, at: Path | None = None) -> None:
    """A run's records moved into repository `root` (kept under `at`'s sandbox/, else `root`'s):
    its snapshot of the git files (which the run puts back before each step) taken again from
    `root`'s, as a run's start takes it, so that the repository it now lives in keeps its own hooks
    and configuration. Nothing of kernel code ran here."""
    at = at or root
    if not st.state_path(at, run_id).is_file():
        return
    state = st.load(at, run_id)
    snap = st.run_dir(at, run_id) / GIT_SNAPSHOT
    if snap.exists():
        shutil.rmtree(snap)
    git_files.snapshot_git_dir(root, snap)
    state.records_seal = {**state.records_seal, GIT_SNAPSHOT: git_files.git_dir_digest(snap)}
    st.save(at, state)


def take_records(root: Path, run_id: str, archive: bytes) -> None:
    """The run's records in `archive` put in repository `root` whole: unpacked and rehomed beside
    its `sandbox/<run>/` first, then swapped in for it, so that a kill meanwhile leaves the records
    there as they were or as they came, never a mix."""
    stage = root / st.SANDBOX / INCOMING / run_id  # its sandbox/<run>/ is the run's folder to be
    if stage.exists():
        shutil.rmtree(stage)
    if not unpack(archive, RUN_FOLDER, st.run_dir(stage, run_id), replace=False):  # the run left no records
        return
    rehome(root, run_id, at=stage)
    dest = st.run_dir(root, run_id)
    if dest.exists():
        dest.rename(stage / "replaced")
    st.run_dir(stage, run_id).rename(dest)
    shutil.rmtree(stage)
    with contextlib.suppress(OSError):  # another run's records may be on their way there
        stage.parent.rmdir()


def sealed_state(root: Path, run_id: str, refs: dict[str, str], branch: str) -> dict | None:
    """The state of the run in `root` when its records hold together as tileloop sealed them: the
    state as written (its own hash), results.jsonl and perf_results.md exactly as sealed, and with no
    iteration in flight the branch at the sealed tip (`refs` as read); else None."""
    if not st.intact(root, run_id) or not st.state_path(root, run_id).is_file():
        return None
    state = st.view(root, run_id) or {}
    seal = state.get("records_seal") or {}
    for name in SEALED:
        want, path = seal.get(name), st.run_dir(root, run_id) / name
        if want is not None and (not path.is_file() or _digest(path.read_bytes()) != want):
            return None
    if state.get("inflight") is None and seal.get("tip") and refs.get(f"refs/heads/{branch}") != seal["tip"]:
        return None
    return state


def _digest(data: bytes) -> dict:
    """A file's bytes as a run's seal names them."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def last_sealed(root: Path, run_id: str) -> int:
    """The last iteration the run's records hold (-1 before the baseline, or no state)."""
    try:
        return int((st.view(root, run_id) or {}).get("last_iteration", -1))
    except (OSError, ValueError, TypeError, AttributeError):
        return -1


def take_checkpoint(repo: Path, spec: TaskInput, after: int) -> Checkpoint | None:
    """The run in the task's clone `repo` as a checkpoint, when an iteration past `after` is sealed
    and nothing moved while it was read (its refs read before and after, its records checked against
    their seal); else None, and the task looks again later. The run goes on meanwhile."""
    run_id, branch = run_id_of(spec.target), branch_of(spec.target)
    if last_sealed(repo, run_id) <= after:
        return None
    refs = run_refs(repo, run_id, branch)
    with tempfile.TemporaryDirectory(prefix="tileloop-checkpoint-") as tmp:
        copy = Path(tmp)
        try:
            shutil.copytree(st.run_dir(repo, run_id), st.run_dir(copy, run_id))
        except (OSError, shutil.Error):  # a file replaced while it was read
            return None
        state = sealed_state(copy, run_id, refs, branch)
        if state is None or state["last_iteration"] <= after:
            return None
        bundle = make_bundle(repo, list(refs), exclude=spec.start_sha)
        if run_refs(repo, run_id, branch) != refs:
            return None
        archive = pack({RUN_FOLDER: st.run_dir(copy, run_id)})
    return Checkpoint(target=spec.target, node=socket.gethostname(), pid=os.getpid(), iteration=state["last_iteration"],
                      refs=refs, bundle=bundle, archive=archive)


def sweep_clones() -> list[Path]:
    """The clones this node's lost tasks left in its temporary folder (their process died before
    they could remove them), removed; a clone whose task is alive, or says no process, stays."""
    swept = []
    for clone in Path(tempfile.gettempdir()).glob(f"{CLONE_PREFIX}*"):
        try:
            pid = int((clone / PID_FILE).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(clone, ignore_errors=True)
            swept.append(clone)
        except (OSError, ValueError):  # no pid yet, not ours, or alive under another user
            continue
    return swept


def run_task(spec: TaskInput, bundle: bytes, records: bytes | None):
    """One target's run in a clone of its own made from `bundle` (with `records`, the run's
    `sandbox/<run>/` to resume): a stream of `Started` at once, a `Checkpoint` per iteration sealed
    while it runs, then the `TaskResult` of the run when it ends, whichever way it ends."""
    yield Started(target=spec.target, node=socket.gethostname(), pid=os.getpid())
    run_id, branch = run_id_of(spec.target), branch_of(spec.target)
    lines: list[str] = []
    swept = sweep_clones()
    work = Path(tempfile.mkdtemp(prefix=CLONE_PREFIX))
    (work / PID_FILE).write_text(f"{os.getpid()}\n")
    children = Children()
    if swept:
        lines.append(f"removed the clones of {len(swept)} task(s) whose process died: " + ", ".join(p.name for p in swept))
    try:
        repo = work / "repo"
        repo.mkdir()
        git_output(repo, "init", "-q")
        take_refs(repo, spec.refs, bundle)
        git_output(repo, "checkout", "-q", "-f", spec.start_branch)
        git_output(repo, "config", "user.name", spec.identity[0])
        git_output(repo, "config", "user.email", spec.identity[1])
        gitops.ensure_excluded(repo, "/sandbox/")
        if records is not None:
            unpack(records, RUN_FOLDER, repo / st.SANDBOX / run_id, replace=True)
            rehome(repo, run_id)
        out = repo / st.SANDBOX / TASK_OUT
        out.mkdir(parents=True)
        ended: dict[str, dict] = {}

        def run() -> None:
            try:
                ended["entry"] = run_one(repo, repo, spec.target, out, spec.per_run_s, list(spec.extra), child_env(),
                                         children, lines.append, resume=records is not None, profile=spec.profile)
            except Exception as exc:  # the run's failure is the entry's; what it left still travels back
                ended["entry"] = {"schema": ENTRY_SCHEMA, "run": run_id, "target": spec.target,
                                  "error": f"{type(exc).__name__}: {exc}"}

        runner = threading.Thread(target=run, name=f"tileloop-run-{run_id}", daemon=True)
        runner.start()
        sent = last_sealed(repo, run_id)  # what came with the task is the driver's already
        while runner.is_alive():
            runner.join(CHECK_S)
            try:
                checkpoint = take_checkpoint(repo, spec, sent) if runner.is_alive() else None
            except (OSError, subprocess.CalledProcessError):  # git or a file busy meanwhile: looked at again later
                checkpoint = None
            if checkpoint is not None:
                sent = checkpoint.iteration
                yield checkpoint
        refs = run_refs(repo, run_id, branch)
        result = TaskResult(target=spec.target, node=socket.gethostname(), entry=ended["entry"], refs=refs,
                            bundle=make_bundle(repo, list(refs), exclude=spec.start_sha),
                            archive=pack({RUN_FOLDER: repo / st.SANDBOX / run_id, OUT_FOLDER: out}), log=lines)
    finally:
        children.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    # the clone is gone before the result goes: a driver that has it may stop a local cluster at once,
    # its workers with it, and a clone removed part-way then (its pid file first) stays for good
    yield result
