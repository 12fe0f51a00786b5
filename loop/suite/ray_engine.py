"""`suite run --ray [ADDRESS]`: each target's run as one Ray task, on any node of a cluster, with no
shared filesystem assumed.

The driver (this process) sends each task a git bundle of the commit the suite starts from (bytes
through Ray's object store, one copy for every new run); the task makes a clone of its own in a
temporary folder and runs there what the local suite runs (`runner.run_one`: `tileloop run`, or
`tileloop resume` for a run sent back with its records, the cut-off repair, `tileloop report`).
When the run ends (finished, cut off by `--per-run`, failed or killed) the task returns the run's
branch and `refs/tileloop/<run>/...` (their names, their commits and a bundle of the new objects),
its `sandbox/<run>/` records and its entry, report and log (a tar archive). The driver fetches the
objects into the repository, sets the refs (a branch only fast-forward), unpacks the records into
`sandbox/<run>/` (where a suite without `--gpus` keeps them) and the rest into the output folder,
so that `tileloop history`, the records and the suite summary read as for a local run. The entry
names the node (its hostname) that ran it; the records' environment names its GPU.

While the run goes on, the task checkpoints it: each time an iteration is sealed in its records
(the baseline included), the task sends the run's refs, their new objects and its records as they
then stand (read twice, taken only where nothing moved meanwhile) as one item of the task's stream
(a Ray streaming generator: the driver owns the items and reads them in order as they come, with
no actor or store of its own to keep alive). The driver takes each into the repository at once, as
it takes a result. A task lost with its process or its node (`lost_errors`) is sent again
once per suite call, as a resume from the last checkpoint that came back (from the start if none
did): no finished iteration is lost or run twice, and the interrupted one is recorded once, as
`tileloop resume` records it. A second loss leaves the run as it came back, its entry saying so.
Ray's own retry of a task is off: it would start the run anew in a fresh clone. A driver killed
mid-suite leaves the checkpoints that came back in the repository, and `suite run --ray --resume`
sends those runs with them; a run cut off or killed part-way goes on the same way (`tileloop
resume` in a new task, from its last finished iteration).

With no ADDRESS (and no RAY_ADDRESS), tileloop starts a local cluster sized to the targets and
stops it at the end, its logs kept in `<out-dir>/ray-logs/`; with one, it joins that cluster,
whose nodes need this tileloop installed (and the settings, TILELOOP_*, set as they should be:
a task's runs take the environment of the node's Ray worker)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.measure.launch import with_package_path
from loop.records import git_files, gitops
from loop.run import state as st
from loop.run.core import GIT_SNAPSHOT, SEALED
from loop.suite.engines import SuiteCall
from loop.suite.runner import Children, child_env, run_one
from loop.suite.summary import ENTRY_SCHEMA
from loop.suite.worktrees import (
    branch_of,
    entry_of_finished,
    existing_run,
    finished,
    forget_run,
    git_output,
    holder_of,
    run_id_of,
)

INSTALL_HINT = 'pip install -e ".[ray]"'
RUN_FOLDER = "run"  # in a task's archive: the run's sandbox/<run>/
OUT_FOLDER = "out"  # in a task's archive: its entry, report, plot, perf_results.md and log
LOGS = "ray-logs"  # under the output folder: the local cluster's logs
OBJECT_STORE_BYTES = 128 * 2**20  # a local cluster's object store: bundles and archives (more spills to disk)
TASK_OUT = "suite"  # under a task clone's sandbox/: the run's entry and files before they travel
WAIT_S = 1.0  # between looks at the tasks' streams
CHECK_S = 0.5  # between a task's looks at its run's records for a newly sealed iteration
CLONE_PREFIX = "tileloop-task-"  # a task's clone, in its node's temporary folder
PID_FILE = "task.pid"  # in a task's clone: the task's process, so that a later task removes a lost one's clone
INCOMING = ".incoming"  # under sandbox/: a run's records made ready there, then swapped in
ABSENT = "0" * 40  # `git update-ref REF NEW OLD` with this OLD: REF must not exist yet


def import_ray():
    """Ray, imported only when `--ray` is asked for; without it, one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray needs Ray, which is not installed here: {INSTALL_HINT}") from None
    return ray


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
    unpack(archive, RUN_FOLDER, st.run_dir(stage, run_id), replace=False)
    rehome(root, run_id, at=stage)
    dest = st.run_dir(root, run_id)
    if dest.exists():
        dest.rename(stage / "replaced")
    st.run_dir(stage, run_id).rename(dest)
    shutil.rmtree(stage)
    with contextlib.suppress(OSError):  # another run's records may be on their way there
        stage.parent.rmdir()


@contextlib.contextmanager
def sigterm_held():
    """A SIGTERM that comes while the driver takes something in held until it is whole, then
    handled as it would have been (the suite's handler ends the suite)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if got:
            signal.raise_signal(signal.SIGTERM)


def sealed_state(root: Path, run_id: str, refs: dict[str, str], branch: str) -> dict | None:
    """The state of the run in `root` when its records hold together as tileloop sealed them: the
    state as written (its own hash), results.jsonl and perf_results.md exactly as sealed, and with no
    iteration in flight the branch at the sealed tip (`refs` as read); else None."""
    if not st.intact(root, run_id) or not st.state_path(root, run_id).is_file():
        return None
    state = json.loads(st.state_path(root, run_id).read_text())
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
    """The last iteration the run's state names as recorded (-1 before the baseline, or no state)."""
    try:
        return int(json.loads(st.state_path(root, run_id).read_text()).get("last_iteration", -1))
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
    `sandbox/<run>/` to resume): a stream of a `Checkpoint` per iteration sealed while it runs, then
    the `TaskResult` of the run when it ends, whichever way it ends."""
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
                                         children, lines.append, resume=records is not None)
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
        yield TaskResult(target=spec.target, node=socket.gethostname(), entry=ended["entry"], refs=refs,
                         bundle=make_bundle(repo, list(refs), exclude=spec.start_sha),
                         archive=pack({RUN_FOLDER: repo / st.SANDBOX / run_id, OUT_FOLDER: out}), log=lines)
    finally:
        children.kill_all()
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ the driver


@dataclass(frozen=True)
class Job:
    """A target to send: new (no records) or to resume (its refs and records go with it)."""

    target: str
    refs: dict[str, str]
    bundle: object  # an object reference to the bundle's bytes
    records: bytes | None


@dataclass
class Task:
    """A target's task in flight, as the driver follows it: its stream, the run's refs here as the
    task last left them (as sent, then as each checkpoint set them), the last iteration checkpointed
    here (-1: none), the node it ran on, and why an earlier task of the target was lost (if one was)."""

    target: str
    stream: object  # Ray's generator of object references: checkpoints, then the result
    refs: dict[str, str]
    checkpoint: int
    node: str = "its node"
    lost: str | None = None


class LostTask(Exception):
    """A task lost with its process or its node (its Ray error's name); the run may be sent again."""


def lost_errors(ray) -> tuple[type, ...]:
    """Ray's errors for a task whose process or node died, or whose checkpoint went with them."""
    names = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "OutOfMemoryError", "ObjectLostError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


class Sender:
    """Sends a target's run as a task: a new run with the one bundle of the start (put in the object
    store once), or the run as it is here (the last checkpoint or result that came back) to resume."""

    def __init__(self, ray, call: SuiteCall, remote, identity: tuple[str, str]):
        self.ray, self.call, self.remote, self.identity = ray, call, remote, identity
        self.start_ref = f"refs/heads/{call.start_branch}"
        self.shared = None

    def send(self, target: str, lost: str | None = None) -> Task:
        """The target's task started; `lost` says why an earlier one was lost (then it resumes)."""
        call, job = self.call, self.job(target)
        if job.bundle is None:  # every new run starts from the same bundle: one copy in the object store
            if self.shared is None:
                start_bundle = make_bundle(call.root, [self.start_ref])
                call.log(f"[ray] the bundle of {call.start_branch} ({call.start_sha[:12]}): {len(start_bundle) / 1024:.0f} KiB")
                self.shared = self.ray.put(start_bundle)
            job = Job(target, job.refs, self.shared, None)
        spec = TaskInput(target=target, start_branch=call.start_branch, start_sha=call.start_sha, refs=job.refs,
                         per_run_s=call.per_run_s, extra=call.extra, identity=self.identity)
        stream = self.remote.remote(spec, job.bundle, job.records)
        call.log(f"[ray] {target}: " + (f"sent with its records (tileloop resume; {len(job.records) / 1024:.0f} KiB)"
                                        if job.records else "sent"))
        here = last_sealed(call.root, run_id_of(target)) if job.records else -1
        return Task(target=target, stream=stream, refs=job.refs, checkpoint=here, lost=lost)

    def job(self, target: str) -> Job:
        """A new run (no bundle yet: the shared one goes with it) or a run to resume: its refs, a
        bundle of them and of the start, and its records."""
        root, run_id = self.call.root, run_id_of(target)
        refs = {self.start_ref: self.call.start_sha}
        if existing_run(root, target) is None:
            return Job(target, refs, None, None)
        refs.update(run_refs(root, run_id, branch_of(target)))
        bundle = self.ray.put(make_bundle(root, list(refs)))
        return Job(target, refs, bundle, pack({RUN_FOLDER: st.run_dir(root, run_id)}))


class RayEngine:
    """Each target's run a Ray task: on a local cluster started for the suite, or on the cluster
    at `address` (also RAY_ADDRESS)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.ray = import_ray()
        self.address = address or None

    def run(self, call: SuiteCall, children: Children) -> list[dict]:
        root = call.root
        if git_output(root, "rev-parse", "--symbolic-full-name", call.start_branch) != f"refs/heads/{call.start_branch}":
            raise UserError("suite run --ray starts every run from a branch, and the repository is on none",
                            hint="check out the branch to start from")
        if call.killed_here:
            raise UserError(f"the repository is on the branch of {call.killed_here}'s run, which a suite without --ray left",
                            hint="suite run --resume without --ray repairs it there first")
        done, todo = self._plan(call)
        gitops.ensure_excluded(root, "/sandbox/")
        call.out_dir.mkdir(parents=True, exist_ok=True)
        if not todo:
            return [done[t] for t in call.targets if t in done]
        identity = _identity(root)
        with contextlib.redirect_stdout(sys.stderr):  # Ray's driver prints its cluster's errors (a worker died) there
            return self._run(call, done, todo, identity)

    def _run(self, call: SuiteCall, done: dict[str, dict], todo: list[str], identity: tuple[str, str]) -> list[dict]:
        """The targets to send run on the cluster, each followed to its end; every entry in order."""
        ray = self.ray
        logs = self._start(call, len(todo))
        try:
            if call.device == "cuda" and not ray.cluster_resources().get("GPU"):  # its tasks would wait forever
                raise UserError("the Ray cluster has no GPU for the runs (--device cuda)",
                                hint="join a cluster with GPUs (--ray=ADDRESS), or run on the CPU with --device cpu")
            resources = {"num_gpus": 1, "num_cpus": 0} if call.device == "cuda" else {"num_cpus": 1}
            # a stream of checkpoints then the result; no retry by Ray (it would start the run anew)
            remote = ray.remote(run_task).options(num_returns="streaming", max_retries=0, **resources)
            sender = Sender(ray, call, remote, identity)
            tasks = [sender.send(target) for target in todo]
            resent: list[str] = []  # targets sent again after a lost task, once each
            while tasks:
                ready, _ = ray.wait([t.stream for t in tasks], num_returns=len(tasks), timeout=0)
                if not ready:  # wait here, not inside Ray: a SIGTERM's exit raised in Ray's wait comes out as exit 1
                    time.sleep(WAIT_S)
                for task in [t for t in tasks if any(t.stream is r for r in ready)]:
                    try:
                        entry = self._follow(call, task)
                    except LostTask as lost:
                        tasks.remove(task)
                        if task.target in resent:
                            done[task.target] = self._failed(call, task, f"{lost}, a second time")
                        else:
                            resent.append(task.target)
                            tasks.append(self._resend(call, sender, task, str(lost)))
                        continue
                    if entry is not None:
                        tasks.remove(task)
                        done[task.target] = entry
        finally:
            self._stop(logs, call.out_dir)
        return [done[t] for t in call.targets if t in done]

    def _plan(self, call: SuiteCall) -> tuple[dict[str, dict], list[str]]:
        """Entries that stand (finished runs, runs living elsewhere) and the targets to send."""
        root, done, todo, clash = call.root, {}, [], []
        for target in call.targets:
            run_id, branch = run_id_of(target), branch_of(target)
            holder = holder_of(root, target)
            if holder not in (None, root):
                where = holder.relative_to(root)
                call.log(f"[ray] {target}: its run lives in {where}, not here; left alone")
                done[target] = {"schema": ENTRY_SCHEMA, "run": run_id, "target": target,
                                "error": f"its run lives in {where}: suite run --gpus ... --resume goes on there"}
                continue
            state = existing_run(root, target)
            if not call.resume:
                if state is not None or gitops.ref_sha(root, f"refs/heads/{branch}"):
                    clash.append(target)
                todo.append(target)
                continue
            if state is not None and state.get("last_iteration", -1) >= 0 and finished(state):
                kept = entry_of_finished(call.out_dir / f"{run_id}.json", state)
                if kept is not None:
                    call.log(f"[ray] {target}: finished before; its entry stands")
                    done[target] = kept
                    continue
            if state is not None and state.get("last_iteration", -1) < 0:
                forget_run([root], target)  # killed before its baseline was recorded: nothing to continue
            todo.append(target)
        if clash:
            raise UserError(f"a run of {', '.join(clash)} exists here already (its branch or records)",
                            hint="suite run --ray --resume continues it; --resume --restart TARGET starts it anew")
        return done, todo

    def _follow(self, call: SuiteCall, task: Task) -> dict | None:
        """The next item of a task's stream taken in: a checkpoint (None: the run goes on) or the
        result (the run's entry). A task lost with its process or node raises `LostTask`."""
        try:
            item = self.ray.get(next(task.stream))
        except StopIteration:
            return self._failed(call, task, "its stream ended with no result")
        except lost_errors(self.ray) as exc:
            raise LostTask(type(exc).__name__) from exc
        except self.ray.exceptions.RayError as exc:
            return self._failed(call, task, type(exc).__name__)
        with sigterm_held():  # a SIGTERM now ends the suite once what came back is in whole
            if isinstance(item, Checkpoint):
                self._checkpoint(call, task, item)
                return None
            entry = self._take(call, task.target, item, task.refs)
        return {**entry, "lost_task": task.lost} if task.lost and "error" not in entry else entry

    def _resend(self, call: SuiteCall, sender: Sender, task: Task, lost: str) -> Task:
        """A lost task's run sent again: resumed from its last checkpoint here, or from the start."""
        call.log(f"[ray] {task.target}: the task on {task.node} was lost ({lost}); sending it again "
                 + (f"to resume from iteration {task.checkpoint}, the last checkpoint that came back"
                    if task.checkpoint >= 0 else "from the start: no checkpoint had come back"))
        reason = (f"the Ray task on {task.node} was lost ({lost}) "
                  + (f"after iteration {task.checkpoint} had come back; resumed from it" if task.checkpoint >= 0
                     else "before a checkpoint had come back; started again") + " in a new task")
        return sender.send(task.target, lost=reason)

    def _failed(self, call: SuiteCall, task: Task, why: str) -> dict:
        """The entry of a task that failed: what of its run is here (the last checkpoint) and what
        the next `--resume` does with it."""
        run_id = run_id_of(task.target)
        kept = (f"its checkpoint of iteration {task.checkpoint} is here, and suite run --ray --resume goes on from it"
                if task.checkpoint >= 0 else "nothing of its run came back: suite run --ray --resume starts it anew")
        call.log(f"[ray] {task.target}: the task failed ({why}); {kept}")
        entry = {"schema": ENTRY_SCHEMA, "run": run_id, "target": task.target, "error": f"the Ray task failed ({why}): {kept}"}
        atomic_write_text(call.out_dir / f"{run_id}.json", json.dumps(entry, indent=1, default=str) + "\n")
        return entry

    def _checkpoint(self, call: SuiteCall, task: Task, checkpoint: Checkpoint) -> None:
        """A checkpoint taken into the repository as a result is (its refs only where they did not
        move here since the task last left them), so that a driver killed next leaves it here."""
        root, run_id, t0 = call.root, run_id_of(task.target), time.monotonic()
        task.node = checkpoint.node
        refused = take_refs(root, checkpoint.refs, checkpoint.bundle, task.refs)
        if refused:
            call.log(f"[ray] {task.target}: the checkpoint of iteration {checkpoint.iteration} was not taken "
                     f"({'; '.join(refused)})")
            return
        take_records(root, run_id, checkpoint.archive)
        task.refs, task.checkpoint = checkpoint.refs, checkpoint.iteration
        call.log(f"[ray] {task.target}: iteration {checkpoint.iteration} checkpointed from {checkpoint.node} "
                 f"(task pid {checkpoint.pid}): bundle {len(checkpoint.bundle or b'') / 1024:.0f} KiB, "
                 f"records {len(checkpoint.archive) / 1024:.0f} KiB, taken in {time.monotonic() - t0:.2f} s")

    def _take(self, call: SuiteCall, target: str, result: TaskResult, sent: dict[str, str]) -> dict:
        """A task's result brought into the repository and the output folder; its entry."""
        root, run_id = call.root, run_id_of(target)
        for line in result.log:
            call.log(f"[{result.node}] {line}")
        t0 = time.monotonic()
        refused = take_refs(root, result.refs, result.bundle, sent)
        entry = {**result.entry, "node": result.node}
        if refused:  # records that name commits the branch here does not hold: kept aside, not unpacked
            kept = call.out_dir / f"{run_id}-returned.tar.gz"
            kept.write_bytes(result.archive)
            entry["error"] = f"its refs were not taken ({'; '.join(refused)}); what it returned is in {kept.name}"
            call.log(f"[ray] {target}: {entry['error']}")
        else:
            take_records(root, run_id, result.archive)
            unpack(result.archive, OUT_FOLDER, call.out_dir, replace=False)
            call.log(f"[ray] {target}: came back from {result.node}: bundle {len(result.bundle or b'') / 1024:.0f} KiB, "
                     f"records {len(result.archive) / 1024:.0f} KiB, taken in {time.monotonic() - t0:.2f} s")
        atomic_write_text(call.out_dir / f"{run_id}.json", json.dumps(entry, indent=1, default=str) + "\n")
        return entry

    def _start(self, call: SuiteCall, tasks: int) -> Path | None:
        """Join the cluster at the address (or RAY_ADDRESS), else start a local one sized to the
        tasks (no dashboard, a small object store); the local one's session folder, else None."""
        address = self.address or os.environ.get("RAY_ADDRESS")
        on_sigterm = signal.getsignal(signal.SIGTERM)  # the suite's: Ray's driver puts its own in place
        try:
            if address:
                self.ray.init(address=address, log_to_driver=False)
                call.log(f"[ray] joined the cluster at {address}: {self.ray.cluster_resources()}")
                return None
            cpus = max(1, min(tasks, os.cpu_count() or 1))
            context = self.ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                                    object_store_memory=OBJECT_STORE_BYTES, runtime_env={"env_vars": with_package_path({})})
            call.log(f"[ray] started a local cluster: {self.ray.cluster_resources()}")
            return Path(context.address_info["session_dir"])
        finally:
            if on_sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, on_sigterm)  # a SIGTERM ends the suite as without --ray (then the cluster)

    def _stop(self, session: Path | None, out_dir: Path) -> None:
        """Leave the cluster (a local one stops); a local one's logs kept under the output folder."""
        self.ray.shutdown()
        if session is None:
            return
        if (session / "logs").is_dir():
            if (out_dir / LOGS).exists():
                shutil.rmtree(out_dir / LOGS)
            shutil.copytree(session / "logs", out_dir / LOGS, symlinks=True)
        shutil.rmtree(session, ignore_errors=True)


def _identity(root: Path) -> tuple[str, str]:
    """The author git would use in `root` (its configuration or GIT_AUTHOR_*): name, email."""
    found = re.match(r"(.*) <(.*)> \d+ [-+]\d{4}$", git_output(root, "var", "GIT_AUTHOR_IDENT"))
    if not found:
        raise UserError("git has no author identity here: the runs' commits need one",
                        hint="git config user.name NAME; git config user.email EMAIL")
    return found.group(1), found.group(2)
