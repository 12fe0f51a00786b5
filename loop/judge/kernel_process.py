"""The kernel process as the judge sees it: started with a pair of pipes (`loop.judge.fork`), asked
one request at a time, its answers read as data. A kernel's failure comes back as the
`KernelFailure` the kernel side raised (loop/common/errors.py; typed: compile error, runtime error,
oom, ...) and is raised here again; the process dying or breaking the protocol is typed here from
its exit and its log, and charged to the implementation the request concerned.

Between its requests a kernel process's whole tree (its process group) is stopped: a request
resumes it and stops every other kernel process first, so that no implementation runs while
another is asked (timed, audited, checked), and none works between the judge's writes and its next
request. After each answer the judge looks for strays (descendants that left the group, or were
orphaned to the judge or to the zygote that forked the kernel process; the parent that keeps a kernel
process in a namespace of its own is none), kills them and refuses the implementation (`uncorroborated`); so does CPU
time the tree used while it was stopped (which a stopped tree cannot use) beyond IDLE_CPU_S."""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from loop.common.channel import Channel, ChannelClosed
from loop.common.errors import KernelFailure
from loop.common.processes import Tree, kill_all, kill_process_group, record_pid
from loop.judge.fork import parents, start_kernel

IDLE_CPU_S = 0.05  # CPU seconds a stopped tree may show (a signal is not instant; clock ticks are 10 ms)
_LIVE: list["KernelProcess"] = []  # this judge's kernel processes, to stop all but the one asked
_ASKED: list["KernelProcess"] = []  # the kernel process whose request was sent last (`last_asked`)


class KernelSideError(Exception):
    """The spec or tileloop failed in the kernel process (`spec_error`, `harness_error`)."""

    def __init__(self, status: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


class KernelProcess:
    """`warm`: the device the process gets ready for (torch, Triton, the CUDA context) before its
    first request, in parallel with the judge's own start."""

    def __init__(self, workdir: Path, name: str, python: str | None = None, warm: str | None = None):
        to_kernel_r, to_kernel_w = os.pipe()
        to_judge_r, to_judge_w = os.pipe()
        self.log_path = workdir / f"{name}.kernel.log"
        self.pid_file = workdir / f"{name}.kernel.pid"  # for `tileloop resume`, should the judge be killed first
        self.proc = start_kernel(workdir, self.log_path, (to_kernel_r, to_judge_w), warm, python, self.pid_file)
        os.close(to_kernel_r)
        os.close(to_judge_w)
        self.channel, self.read_fd = Channel(to_judge_r, to_kernel_w), to_judge_r
        self.unstuck = 0  # times it was found stopped while asked (by a sibling or its stray) and resumed
        self._tree: Tree | None = None
        self.running = True  # until its first request (it imports torch: no kernel code yet)
        self.stopped_cpu: float | None = None
        self.idle_cpu_s = 0.0  # CPU seconds its tree used while stopped
        self.sent_at = self.answered_at = 0.0  # the judge's clock (perf_counter) around the last request
        _LIVE.append(self)

    @property
    def tree(self) -> Tree:
        """Its tree in /proc, once its pid is known (a process the zygote forks has one once the
        zygote is ready: `loop.judge.fork`)."""
        if self._tree is None:
            record_pid(self.pid_file, self.proc.pid)
            self._tree = Tree(self.proc.pid, parents=parents())
        return self._tree

    def rename(self, name: str) -> None:
        """Name the log and pid files after the implementation this process was given (a process
        started before the job came has a number for a name)."""
        self.proc.pid  # known: its pid file is written (by a zygote's fork, once the zygote is ready)
        workdir = self.log_path.parent
        log_path, pid_file = workdir / f"{name}.kernel.log", workdir / f"{name}.kernel.pid"
        self.log_path = self.log_path.rename(log_path)  # the process writes on: its file keeps its inode
        self.pid_file = self.pid_file.rename(pid_file) if self.pid_file.exists() else pid_file

    def request(self, message: dict, label: str) -> dict:
        """Send one request and return its answer; `label` is the implementation it concerns (charged
        with the failure if the process dies or answers what is not an answer)."""
        self.send(message, label)
        return self.answer(message, label)

    def send(self, message: dict, label: str) -> None:
        self.resume(label)
        _ASKED[:] = [self]
        self.sent_at = time.perf_counter()
        try:
            self.channel.send(message)
        except ChannelClosed:
            raise self._death(label, message.get("op")) from None

    def answer(self, message: dict, label: str) -> dict:
        """The answer to `message`, sent before (`send`); the tree stopped again once it came. While
        waiting, a process found stopped (by someone else: the judge stops only the others) is resumed."""
        while not select.select([self.read_fd], [], [], 0.05)[0]:
            if self.tree.is_stopped():
                self.unstuck += 1
                self.tree.signal(signal.SIGCONT)
        try:
            answer = self.channel.receive()
        except ChannelClosed:
            raise self._death(label, message.get("op")) from None
        except ValueError as exc:  # not JSON, not an object, too long
            self.kill()
            raise KernelFailure("runtime_error", label, f"the kernel process broke the protocol during "
                                f"{message.get('op')}: {exc}"[:500]) from None
        self.answered_at = time.perf_counter()
        self.pause(label)
        if "failure" in answer:  # one implementation per process: its failure is the label asked, whatever it says
            f = answer["failure"]
            raise KernelFailure(str(f.get("status", "runtime_error")), label,
                                str(f.get("message", ""))[:2000], str(f.get("detail", ""))[-4000:])
        if "error" in answer:
            e = answer["error"]
            raise KernelSideError(str(e.get("status", "harness_error")), str(e.get("message", "")), str(e.get("detail", "")))
        if answer.get("ok") is not True:
            raise KernelFailure("runtime_error", label, f"the kernel process answered {str(answer)[:200]} to "
                                f"{message.get('op')}")
        return answer

    def resume(self, label: str) -> None:
        """Every other kernel process stopped, this one's tree resumed; CPU its tree used while it
        was stopped (which a stopped tree cannot) beyond IDLE_CPU_S refuses it."""
        for other in _LIVE:
            if other is not self and other.running:
                other.pause(None)
            elif other is not self:  # stopped already, unless someone resumed it: stopped again
                other.tree.stop()
        if self.stopped_cpu is not None:
            self.idle_cpu_s += max(self.tree.cpu_s() - self.stopped_cpu, 0.0)
            if self.idle_cpu_s > IDLE_CPU_S:
                self.kill()
                raise KernelFailure("uncorroborated", label, f"the kernel process's tree used {self.idle_cpu_s:.3f} s "
                                    "of CPU while it was stopped between its requests (a process outside its reach?)")
        self.tree.signal(signal.SIGCONT)
        self.running = True

    def pause(self, label: str | None) -> None:
        """This tree stopped; its strays (descendants outside its process group) killed and, when
        `label` is given, its implementation refused."""
        self.tree.stop()
        self.running = False
        strays = self.tree.scan(_kernels())
        if strays:
            kill_all(strays)
            if label is not None:
                self.kill()
                raise KernelFailure("uncorroborated", label, f"the kernel process left {len(strays)} process(es) "
                                    "outside its process group (a daemon, a helper in a session of its own): killed; "
                                    "kernel code may not run beside the measurement")
        self.stopped_cpu = self.tree.cpu_s()

    def _death(self, label: str, op: str | None) -> KernelFailure:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        how = f"killed by signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited with code {rc}"
        tail = self.log_tail()
        status = "oom" if "out of memory" in tail.lower() else "runtime_error"
        return KernelFailure(status, label, f"the kernel process {how} during {op}", tail)

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def kill(self) -> None:
        """The process, its group and every descendant it left (strays included) killed."""
        if self.proc.poll() is None:
            kill_process_group(self.proc.pid, lambda: self.proc.poll() is None)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for _ in range(3):  # what the group's death orphaned comes back to the judge (a subreaper)
            left = self.tree.scan(_kernels()) + sorted(self.tree.members - {self.proc.pid})
            if not left:
                break
            kill_all(left)
            self.tree.members &= {self.proc.pid}
        self.running = False

    def close(self) -> None:
        """End the process: it holds nothing to save (its log is unbuffered), and a CUDA process's
        orderly teardown would cost the measurement a second or more."""
        self.kill()
        self.channel.close()
        self.pid_file.unlink(missing_ok=True)
        if self in _LIVE:
            _LIVE.remove(self)
        if self in _ASKED:
            _ASKED.clear()


def last_asked() -> KernelProcess | None:
    """The kernel process this judge sent its latest request to (any request: a sample, an audit, an
    empty one, a load), None before the first: what ran on the machine just before the next request,
    whose timing may show what that process left running (`corroborate.interference`)."""
    return _ASKED[0] if _ASKED else None


def _kernels() -> set[int]:
    """This judge's kernel processes and the processes that keep them (where each is the init of a
    namespace of its own, its parent: `loop.worker.zygote.nest`): never strays of one another's tree."""
    trees = [k.tree for k in _LIVE]
    return {t.pid for t in trees} | {t.keeper for t in trees if t.keeper is not None}


def sample_times(answer: dict, n: int, label: str) -> list[float]:
    """The `n` sample times of an answer, or the kernel process's failure."""
    ms = answer.get("ms")
    if not isinstance(ms, list) or len(ms) != n:
        raise KernelFailure("runtime_error", label, f"the kernel process answered {str(ms)[:80]} for {n} sample(s)")
    return [time_of({"ms": x}, "ms", label) for x in ms]


def require_launches(answer: dict, n: int, label: str) -> None:
    """Every one of the `n` samples of a (non-empty) timed request launched at least one of the
    target's kernels (`loop.worker.launches`), or the implementation is refused: its timed calls
    did not run its kernels (a candidate that calls torch instead)."""
    counts = answer.get("launches")
    if not isinstance(counts, list) or len(counts) != n:
        raise KernelFailure("runtime_error", label, f"the kernel process reported launches {str(counts)[:80]} for {n} sample(s)")
    if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
        raise KernelFailure("uncorroborated", label, "a timed request launched none of the target's kernels "
                            f"(launches per sample: {counts[:8]}): the timed calls must run the target's own kernels")


def time_of(answer: dict, key: str, label: str) -> float:
    """A positive finite number from a kernel process's answer, or its failure."""
    value = answer.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise KernelFailure("runtime_error", label, f"the kernel process reported {key}={value!r}, not a time")
    return float(value)


def ask_all(kernels: dict[str, KernelProcess], messages: dict[str, dict]) -> dict[str, dict]:
    """The same kind of request to several processes (work that times nothing: loading, capturing),
    one after the other (only one kernel process runs at a time); the first failure is raised,
    charged to its implementation."""
    return {label: kernels[label].request(message, label) for label, message in messages.items()}


class Pool:
    """Kernel processes started before the job is known (the judge started ahead of it), given to
    the implementations in order; the ones left over are ended."""

    def __init__(self, workdir: Path, name: str, count: int, warm: str | None):
        self.workdir, self.name = workdir, name
        self.free = [KernelProcess(workdir, f"{name}-{k}", warm=warm) for k in range(count)]

    def take(self, label: str, warm: str | None) -> KernelProcess:
        """A started process, renamed for `label`, or a new one when none is left."""
        if not self.free:
            return KernelProcess(self.workdir, f"{self.name}-{label}", warm=warm)
        kernel = self.free.pop(0)
        kernel.rename(f"{self.name}-{label}")
        return kernel

    def close(self) -> None:
        for kernel in self.free:
            kernel.close()
        self.free = []
