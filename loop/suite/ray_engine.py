"""`suite run --ray [ADDRESS]`: each target's run as one Ray task, on any node of a cluster, with no
shared filesystem assumed.

The driver (this process) sends each task (`ray_task.run_task`) a git bundle of the commit the
suite starts from (bytes through Ray's object store, one copy for every new run), or, for a run to
resume, a bundle of its refs and its records. What the task yields, a checkpoint per sealed
iteration and then its result, the driver takes into the repository as it comes: it fetches the
objects, sets the refs (each only where it is still as the task last left it), swaps the records
into `sandbox/<run>/` (where a suite without `--gpus` keeps them) and puts the result's entry,
report and log into the output folder, so that `tileloop history`, the records and the suite
summary read as for a local run. The entry names the node (its hostname) that ran it, and what the
run cost the driver (`DriverCost`: the bytes sent and returned, the seconds to fetch them and take
them in; `suite summarize` simulates the suite on more GPUs with it); the records' environment
names its GPU.

Checkpoints travel as items of the task's stream (a Ray streaming generator): the driver owns
them and reads them in order as they come, with no actor or store of its own to keep alive, and it
takes each in at once, so that a driver killed mid-suite leaves in the repository every checkpoint
that came back, and `suite run --ray --resume` sends those runs with them (`tileloop resume` in a
new task, from the last finished iteration), as it sends a run that came back cut off or killed
part-way. A task lost with its process or its node (`lost_errors`) is sent again once per suite
call, as a resume from the last checkpoint that came back (from the start if none did): no
finished iteration is lost or run twice, and the interrupted one is recorded once, as `tileloop
resume` records it; a second loss leaves the run as its last checkpoint left it, the entry saying
so. Ray's own retry of a task is off: it would start the run anew in a fresh clone. A SIGTERM
while something is taken in waits until it is in whole.

No task holds the suite up for good: one that has not said it began (`Started`) in time, or
still runs long past `--per-run` (`ray_deadlines`), is cancelled, and its entry says why in one
line (for one that never began, the last line of a traceback in the local cluster's worker logs,
such as a worker that could not import Ray); the suite goes on with the others. What of its run
came back stays, as for a failed task: `suite run --ray --resume` goes on from its last
checkpoint, or starts it anew.

With no ADDRESS (and no RAY_ADDRESS), tileloop starts a local cluster sized to the targets and
stops it at the end, its logs kept in `<out-dir>/ray-logs/`; with one, it joins that cluster
(`ray_cluster`), whose nodes need this tileloop installed (and the settings, TILELOOP_*, set as
they should be: a task's runs take the environment of the node's Ray worker). A local cluster's
workers import this tileloop, and Ray and the rest from the driver's own PYTHONPATH after it."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from loop.common.errors import UserError
from loop.records import gitops
from loop.run import state as st
from loop.suite.engines import SuiteCall
from loop.suite.ray_cluster import Cluster
from loop.suite.ray_deadlines import overdue
from loop.suite.ray_task import (
    OUT_FOLDER,
    RUN_FOLDER,
    Checkpoint,
    Started,
    TaskInput,
    TaskResult,
    last_sealed,
    make_bundle,
    pack,
    run_refs,
    run_task,
    take_records,
    take_refs,
    unpack,
)
from loop.suite.runner import Children
from loop.suite.summary import ENTRY_SCHEMA, write_entry
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
WAIT_S = 1.0  # between looks at the tasks' streams


def import_ray():
    """Ray, imported only when `--ray` is asked for; without it, one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray needs Ray, which is not installed here: {INSTALL_HINT}") from None
    return ray


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


# ------------------------------------------------------------------ the driver


@dataclass(frozen=True)
class Job:
    """A target to send: new (no records) or to resume (its refs and records go with it)."""

    target: str
    refs: dict[str, str]
    bundle: object  # an object reference to the bundle's bytes
    records: bytes | None
    bundle_bytes: int = 0  # the bundle's size


@dataclass
class DriverCost:
    """What one target's run cost the driver, over every task of it in this suite call: the bytes
    sent (the bundle each task starts from, shared by new runs but fetched by each task's node, and a
    resumed run's records) and the time to make and put them; the checkpoints and the result that
    came back (their bundles' and archives' bytes), the time to fetch them from the object store and
    the time to take them into the repository."""

    sent_bytes: int = 0
    send_s: float = 0.0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    returned_bytes: int = 0
    fetch_s: float = 0.0
    take_s: float = 0.0

    def as_entry(self) -> dict:
        """The entry's `driver`: these, rounded, and the driver's seconds for the run in all."""
        return {"sent_bytes": self.sent_bytes, "send_s": round(self.send_s, 4), "checkpoints": self.checkpoints,
                "checkpoint_bytes": self.checkpoint_bytes, "returned_bytes": self.returned_bytes,
                "fetch_s": round(self.fetch_s, 4), "take_s": round(self.take_s, 4),
                "driver_s": round(self.send_s + self.fetch_s + self.take_s, 4)}


@dataclass
class Task:
    """A target's task in flight, as the driver follows it: its stream, the run's refs here as the
    task last left them (as sent, then as each checkpoint set them), the last iteration checkpointed
    here (-1: none), when it was sent and when it began (this host's monotonic clock), the node it
    ran on, why an earlier task of the target was lost (if one was), and what the run has cost the
    driver so far."""

    target: str
    stream: object  # Ray's generator of object references: word that it began, checkpoints, then the result
    refs: dict[str, str]
    checkpoint: int
    sent: float = 0.0
    started: float | None = None  # None: it has not said it began
    node: str = "its node"
    lost: str | None = None
    cost: DriverCost = field(default_factory=DriverCost)


class LostTask(Exception):
    """A task lost with its process or its node (its Ray error's name); the run may be sent again."""


def lost_errors(ray) -> tuple[type, ...]:
    """Ray's errors for a task whose process or node died, or whose checkpoint went with them
    (ObjectLostError: OwnerDiedError among them)."""
    names = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "OutOfMemoryError", "ObjectLostError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


class Sender:
    """Sends a target's run as a task: a new run with the one bundle of the start (put in the object
    store once), or the run as it is here (the last checkpoint or result that came back) to resume."""

    def __init__(self, ray, call: SuiteCall, remote, identity: tuple[str, str]):
        self.ray, self.call, self.remote, self.identity = ray, call, remote, identity
        self.start_ref = f"refs/heads/{call.start_branch}"
        self.shared = None
        self.shared_bytes = 0

    def send(self, target: str, lost: str | None = None, cost: DriverCost | None = None) -> Task:
        """The target's task started; `lost` says why an earlier one was lost (then it resumes),
        `cost` what the run cost the driver before (its earlier task's)."""
        call, t0 = self.call, time.monotonic()
        job = self.job(target)
        if job.bundle is None:  # every new run starts from the same bundle: one copy in the object store
            if self.shared is None:
                start_bundle = make_bundle(call.root, [self.start_ref])
                call.log(f"[ray] the bundle of {call.start_branch} ({call.start_sha[:12]}): {len(start_bundle) / 1024:.0f} KiB")
                self.shared, self.shared_bytes = self.ray.put(start_bundle), len(start_bundle)
            job = Job(target, job.refs, self.shared, None, self.shared_bytes)
        spec = TaskInput(target=target, start_branch=call.start_branch, start_sha=call.start_sha, refs=job.refs,
                         per_run_s=call.per_run_s, extra=call.extra, identity=self.identity, profile=call.profile)
        stream = self.remote.remote(spec, job.bundle, job.records)
        call.log(f"[ray] {target}: " + (f"sent with its records (tileloop resume; {len(job.records) / 1024:.0f} KiB)"
                                        if job.records else "sent"))
        here = last_sealed(call.root, run_id_of(target)) if job.records else -1
        cost = cost or DriverCost()
        cost.sent_bytes += job.bundle_bytes + len(job.records or b"")
        cost.send_s += time.monotonic() - t0
        return Task(target=target, stream=stream, refs=job.refs, checkpoint=here, sent=time.monotonic(), lost=lost,
                    cost=cost)

    def job(self, target: str) -> Job:
        """A new run (no bundle yet: the shared one goes with it) or a run to resume: its refs, a
        bundle of them and of the start, and its records."""
        root, run_id = self.call.root, run_id_of(target)
        refs = {self.start_ref: self.call.start_sha}
        if existing_run(root, target) is None:
            return Job(target, refs, None, None)
        refs.update(run_refs(root, run_id, branch_of(target)))
        data = make_bundle(root, list(refs))
        return Job(target, refs, self.ray.put(data), pack({RUN_FOLDER: st.run_dir(root, run_id)}), len(data or b""))


class RayEngine:
    """Each target's run a Ray task: on a local cluster started for the suite, or on the cluster
    at `address` (also RAY_ADDRESS)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.ray = import_ray()
        self.cluster = Cluster(self.ray, address)

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
        session = self.cluster.start(len(todo), call.log)
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
            # when a task of the suite that had begun last held a slot of the cluster: a task that has not begun
            # may be waiting for that slot, and its time to begin counts from then
            held = 0.0
            while tasks:
                ready, _ = ray.wait([t.stream for t in tasks], num_returns=len(tasks), timeout=0)
                if not ready:  # wait here, not inside Ray: a SIGTERM's exit raised in Ray's wait comes out as exit 1
                    time.sleep(WAIT_S)
                for task in [t for t in tasks if any(t.stream is r for r in ready)]:
                    try:
                        entry = self._follow(call, task)
                    except LostTask as lost:
                        tasks.remove(task)
                        held = time.monotonic() if task.started is not None else held
                        if task.target in resent:
                            done[task.target] = self._failed(call, task, f"{lost}, a second time")
                        else:
                            resent.append(task.target)
                            tasks.append(self._resend(call, sender, task, str(lost)))
                        continue
                    if entry is not None:
                        tasks.remove(task)
                        held = time.monotonic() if task.started is not None else held
                        done[task.target] = entry
                held = time.monotonic() if any(t.started is not None for t in tasks) else held
                for task in [t for t in tasks if not any(t.stream is r for r in ready)]:
                    why = overdue(sent=task.sent, started=task.started, node=task.node, per_run_s=call.per_run_s,
                                  held=held, session=session)
                    # given up only if nothing came from it meanwhile (it may have begun during the sleep)
                    if why is not None and not ray.wait([task.stream], num_returns=1, timeout=0)[0]:
                        tasks.remove(task)
                        held = time.monotonic() if task.started is not None else held
                        self._cancel(task)
                        done[task.target] = self._failed(call, task, why)
        finally:
            self.cluster.stop(session, call.out_dir)
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
        t0 = time.monotonic()
        try:
            item = self.ray.get(next(task.stream))
        except StopIteration:
            return self._failed(call, task, "its stream ended with no result")
        except lost_errors(self.ray) as exc:
            raise LostTask(type(exc).__name__) from exc
        except self.ray.exceptions.RayError as exc:
            return self._failed(call, task, type(exc).__name__)
        task.cost.fetch_s += time.monotonic() - t0  # the item's bytes from its node's object store to this one
        if task.started is None:  # any item says the task began (`Started` is its first)
            task.started = time.monotonic()
        if isinstance(item, Started):
            task.node = item.node
            call.log(f"[ray] {task.target}: began on {item.node} (task pid {item.pid})")
            return None
        with sigterm_held():  # a SIGTERM now ends the suite once what came back is in whole
            if isinstance(item, Checkpoint):
                self._checkpoint(call, task, item)
                return None
            return self._take(call, task, item)

    def _cancel(self, task: Task) -> None:
        """A task given up on cancelled (a pending one never runs; a running one's worker is killed,
        its run's processes with it); what of its run came back stays here."""
        with contextlib.suppress(self.ray.exceptions.RayError, TypeError, ValueError):  # ended meanwhile
            self.ray.cancel(task.stream, force=True)

    def _resend(self, call: SuiteCall, sender: Sender, task: Task, lost: str) -> Task:
        """A lost task's run sent again: resumed from its last checkpoint here, or from the start."""
        call.log(f"[ray] {task.target}: the task on {task.node} was lost ({lost}); sending it again "
                 + (f"to resume from iteration {task.checkpoint}, the last checkpoint that came back"
                    if task.checkpoint >= 0 else "from the start: no checkpoint had come back"))
        reason = (f"the Ray task on {task.node} was lost ({lost}) "
                  + (f"after iteration {task.checkpoint} had come back; resumed from it" if task.checkpoint >= 0
                     else "before a checkpoint had come back; started again") + " in a new task")
        return sender.send(task.target, lost=reason, cost=task.cost)

    def _failed(self, call: SuiteCall, task: Task, why: str) -> dict:
        """The entry of a task that failed: what of its run is here (the last checkpoint) and what
        the next `--resume` does with it."""
        run_id = run_id_of(task.target)
        kept = (f"its checkpoint of iteration {task.checkpoint} is here, and suite run --ray --resume goes on from it"
                if task.checkpoint >= 0 else "nothing of its run came back: suite run --ray --resume starts it anew")
        call.log(f"[ray] {task.target}: the task failed ({why}); {kept}")
        entry = {"schema": ENTRY_SCHEMA, "run": run_id, "target": task.target, "error": f"the Ray task failed ({why}): {kept}"}
        write_entry(call.out_dir, entry)
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
        task.cost.checkpoints += 1
        task.cost.checkpoint_bytes += len(checkpoint.bundle or b"") + len(checkpoint.archive)
        task.cost.take_s += time.monotonic() - t0
        call.log(f"[ray] {task.target}: iteration {checkpoint.iteration} checkpointed from {checkpoint.node} "
                 f"(task pid {checkpoint.pid}): bundle {len(checkpoint.bundle or b'') / 1024:.0f} KiB, "
                 f"records {len(checkpoint.archive) / 1024:.0f} KiB, taken in {time.monotonic() - t0:.2f} s")

    def _take(self, call: SuiteCall, task: Task, result: TaskResult) -> dict:
        """A task's result brought into the repository and the output folder; its entry (with why
        an earlier task of the run was lost, if one was, and what the run cost the driver)."""
        target, sent, lost = task.target, task.refs, task.lost
        root, run_id = call.root, run_id_of(target)
        for line in result.log:
            call.log(f"[{result.node}] {line}")
        t0 = time.monotonic()
        refused = take_refs(root, result.refs, result.bundle, sent)
        entry = {**result.entry, "node": result.node, **({"lost_task": lost} if lost else {})}
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
        task.cost.returned_bytes += len(result.bundle or b"") + len(result.archive)
        task.cost.take_s += time.monotonic() - t0
        entry["driver"] = task.cost.as_entry()
        write_entry(call.out_dir, entry)
        return entry

def _identity(root: Path) -> tuple[str, str]:
    """The author git would use in `root` (its configuration or GIT_AUTHOR_*): name, email."""
    found = re.match(r"(.*) <(.*)> \d+ [-+]\d{4}$", git_output(root, "var", "GIT_AUTHOR_IDENT"))
    if not found:
        raise UserError("git has no author identity here: the runs' commits need one",
                        hint="git config user.name NAME; git config user.email EMAIL")
    return found.group(1), found.group(2)
