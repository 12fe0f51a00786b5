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

Nothing comes back before a task ends: a driver killed mid-suite loses the runs still in flight
(the next `--resume` starts them anew), and so does a node that dies; a run that came back cut
off or killed part-way goes on with `suite run --ray --resume`, which sends its branch, its refs
and its records to a new task (`tileloop resume` there, from its last finished iteration).

With no ADDRESS (and no RAY_ADDRESS), tileloop starts a local cluster sized to the targets and
stops it at the end, its logs kept in `<out-dir>/ray-logs/`; with one, it joins that cluster,
whose nodes need this tileloop installed (and the settings, TILELOOP_*, set as they should be:
a task's runs take the environment of the node's Ray worker)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
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
from loop.run.core import GIT_SNAPSHOT
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
WAIT_S = 1.0  # between looks at the tasks that ended
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


def rehome(root: Path, run_id: str) -> None:
    """A run's records moved into repository `root`: its snapshot of the git files (which the run
    puts back before each step) taken again from `root`'s, as a run's start takes it, so that the
    repository it now lives in keeps its own hooks and configuration. Nothing of kernel code ran here."""
    if not st.state_path(root, run_id).is_file():
        return
    state = st.load(root, run_id)
    snap = st.run_dir(root, run_id) / GIT_SNAPSHOT
    if snap.exists():
        shutil.rmtree(snap)
    git_files.snapshot_git_dir(root, snap)
    state.records_seal = {**state.records_seal, GIT_SNAPSHOT: git_files.git_dir_digest(snap)}
    st.save(root, state)


# ------------------------------------------------------------------ the task (on a node)


def run_task(spec: TaskInput, bundle: bytes, records: bytes | None) -> TaskResult:
    """One target's run in a clone of its own made from `bundle` (with `records`, the run's
    `sandbox/<run>/` to resume); what it has when the run ends, whichever way it ends."""
    run_id, branch = run_id_of(spec.target), branch_of(spec.target)
    lines: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="tileloop-task-"))
    children = Children()
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
        try:
            entry = run_one(repo, repo, spec.target, out, spec.per_run_s, list(spec.extra), child_env(), children,
                            lines.append, resume=records is not None)
        except Exception as exc:  # the run's failure is the entry's; what it left still travels back
            entry = {"schema": ENTRY_SCHEMA, "run": run_id, "target": spec.target, "error": f"{type(exc).__name__}: {exc}"}
        refs = run_refs(repo, run_id, branch)
        return TaskResult(target=spec.target, node=socket.gethostname(), entry=entry, refs=refs,
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


class RayEngine:
    """Each target's run a Ray task: on a local cluster started for the suite, or on the cluster
    at `address` (also RAY_ADDRESS)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.ray = import_ray()
        self.address = address or None

    def run(self, call: SuiteCall, children: Children) -> list[dict]:
        root, ray = call.root, self.ray
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
        logs = self._start(call, len(todo))
        try:
            if call.device == "cuda" and not ray.cluster_resources().get("GPU"):  # its tasks would wait forever
                raise UserError("the Ray cluster has no GPU for the runs (--device cuda)",
                                hint="join a cluster with GPUs (--ray=ADDRESS), or run on the CPU with --device cpu")
            start_ref = f"refs/heads/{call.start_branch}"
            shared = None
            remote = ray.remote(run_task)
            resources = {"num_gpus": 1, "num_cpus": 0} if call.device == "cuda" else {"num_cpus": 1}
            pending = {}
            for target in todo:
                job = self._job(call, target, start_ref)
                if job.bundle is None:  # every new run starts from the same bundle: one copy in the object store
                    if shared is None:
                        start_bundle = make_bundle(root, [start_ref])
                        call.log(f"[ray] the bundle of {call.start_branch} ({call.start_sha[:12]}): {len(start_bundle) / 1024:.0f} KiB")
                        shared = ray.put(start_bundle)
                    job = Job(target, job.refs, shared, None)
                spec = TaskInput(target=target, start_branch=call.start_branch, start_sha=call.start_sha, refs=job.refs,
                                 per_run_s=call.per_run_s, extra=call.extra, identity=identity)
                ref = remote.options(**resources).remote(spec, job.bundle, job.records)
                pending[ref] = (target, job.refs)
                call.log(f"[ray] {target}: " + (f"sent with its records (tileloop resume; {len(job.records) / 1024:.0f} KiB)"
                                                if job.records else "sent"))
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                if not ready:  # wait here, not inside Ray: a SIGTERM's exit raised in Ray's wait comes out as exit 1
                    time.sleep(WAIT_S)
                for ref in ready:
                    target, sent = pending.pop(ref)
                    done[target] = self._take(call, target, ref, sent)
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

    def _job(self, call: SuiteCall, target: str, start_ref: str) -> Job:
        """A new run (the shared bundle, filled in by the caller) or a run to resume: its refs, a
        bundle of them and of the start, and its records."""
        root, run_id = call.root, run_id_of(target)
        refs = {start_ref: call.start_sha}
        if existing_run(root, target) is None:
            return Job(target, refs, None, None)
        refs.update(run_refs(root, run_id, branch_of(target)))
        bundle = self.ray.put(make_bundle(root, list(refs)))
        return Job(target, refs, bundle, pack({RUN_FOLDER: st.run_dir(root, run_id)}))

    def _take(self, call: SuiteCall, target: str, ref, sent: dict[str, str]) -> dict:
        """A task's result brought into the repository and the output folder; its entry."""
        root, run_id = call.root, run_id_of(target)
        try:
            result: TaskResult = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # the task or its node died: nothing of the run came back
            call.log(f"[ray] {target}: the task failed, nothing came back: {type(exc).__name__}")
            return {"schema": ENTRY_SCHEMA, "run": run_id, "target": target,
                    "error": f"the Ray task failed and returned nothing ({type(exc).__name__}): "
                             "suite run --ray --resume starts it anew"}
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
            unpack(result.archive, RUN_FOLDER, st.run_dir(root, run_id), replace=True)
            rehome(root, run_id)
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
