"""Running the worker: a fresh subprocess per measurement, in its own process group, with a
hard timeout, its own TRITON_CACHE_DIR, and output captured to a log file (not a pipe, which
can deadlock when a kernel prints a lot). The result is the JSON file the worker wrote
atomically; no result means the process died, and that is typed here.

A worker that runs kernel code outside a judge (the compile gate, `check`: `CONFINED_MODES`) is
confined as a kernel process is, by the same code: its own session, SIGKILL when its parent dies,
no new privileges, every capability dropped, and a PID and mount namespace of its own where the
system allows it (`loop.common.namespaces.exec_confined`, its launcher)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from loop.backends import Backend, tileiras_environment
from loop.common.files import SOURCE_ROOT
from loop.common.namespaces import adopt_kept_cache
from loop.common.processes import PARENT_ENV, confine_zygote, die_with_parent, kill_process_group, record_pid
from loop.common.settings import Settings
from loop.measure.host import JudgeHost, start_host


CONFINED_MODES = ("compile", "check")  # worker jobs that run kernel code outside a judge
CONFINE = "import sys; from loop.common.namespaces import exec_confined; sys.exit(exec_confined(sys.argv[1:]))"


def confined_command(cmd: list[str]) -> list[str]:
    """`cmd` run by its launcher, which confines it (`loop.common.namespaces.exec_confined`); the
    launcher itself starts confined as the judge's zygote is (`Popen(preexec_fn=confine_zygote)`)."""
    return [cmd[0], "-c", CONFINE, *cmd]


def with_package_path(env: dict) -> dict:
    """`env` with this tileloop first on PYTHONPATH, so that `python -m loop...` children import it,
    and PYTHONSAFEPATH set (Python 3.11+): no child puts its working folder (a run's iteration folder,
    which kernel code outside a read-only view could have written) ahead of it on sys.path, where a
    module planted there would be imported by a judge or a zygote in place of tileloop's or the
    standard library's."""
    env["PYTHONPATH"] = str(SOURCE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONSAFEPATH"] = "1"
    return env


def _worker_env(backend: Backend | None, cache_dir: Path) -> dict:
    env = dict(os.environ)
    if backend is not None:
        for key in backend.unset:
            env.pop(key, None)
        env.update(backend.environment({k: os.environ[k] for k in backend.explicit if k in os.environ}))
        if backend.language == "cutile":
            tileiras_environment(env)
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    # an autotuned version's choice per key is kept in the run's cache, beside its compiled kernels: an
    # incumbent that autotunes is not tuned again, at every key, in every measurement it is paired in
    # (on an H100 that made each experiment after a kept autotune 60-100 s); a new version's source is a
    # new cache key, so a candidate is always tuned afresh. The user's own setting stands.
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    env[PARENT_ENV] = str(os.getpid())
    with_package_path(env)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


def judge_environment() -> dict:
    """The environment a judge host starts with: a judge's, before its backend and cache are set."""
    return _worker_env(None, Path(os.devnull))


def start_judge_host(settings: Settings, folder: Path) -> JudgeHost | None:
    """A run's judge host, with the interpreter and environment its judges get (`loop.measure.host`)."""
    return start_host(_python(settings), judge_environment(), folder)


def _log_tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def worker_command(settings: Settings, workdir: Path, name: str, job: dict | None) -> list[str]:
    """The worker's command line as `run_worker` runs it (after its launcher, if any): a measurement
    (a job without a `mode`) goes to the judge, which starts the kernel process itself; every other
    job, the probe and the health check to a worker."""
    module = "loop.judge" if job is not None and job.get("mode") is None else "loop.worker"
    cmd = _command(settings, module, workdir, name)
    if job is None:
        return cmd + ["--health" if name == "health" else "--probe"]
    return cmd + ["--job", str(_job_path(workdir, name))]


def _python(settings: Settings) -> str:
    return settings.python or sys.executable


def _command(settings: Settings, module: str, workdir: Path, name: str) -> list[str]:
    return [_python(settings), "-m", module, "--result", str(workdir / f"{name}.result.json")]


def _job_path(workdir: Path, name: str) -> Path:
    return workdir / f"{name}.job.json"


def _write_job(workdir: Path, name: str, job: dict) -> Path:
    path = _job_path(workdir, name)
    path.write_text(json.dumps(job, indent=1))
    return path


def adopt_kept_caches(cache_dir: Path, job: dict | None) -> list[str]:
    """The incumbent's own Triton cache folder (its compiled kernels, Triton's and cuTile's tuned
    choices), where it has none, taken from the folder its source filled as the kept candidate
    (`namespaces.adopt_kept_cache`); the labels adopted."""
    adopted = []
    for impl in (job or {}).get("impls") or ():
        if impl.get("label") == "incumbent" and Path(impl.get("path", "")).is_file():
            if adopt_kept_cache(cache_dir, Path(impl["path"]).read_bytes()):
                adopted.append(impl["label"])
    return adopted


def run_worker(workdir: Path, job: dict | None, backend: Backend | None, settings: Settings,
               cache_dir: Path, timeout_s: float | None = None, name: str = "worker",
               launcher: Sequence[str] = (), procs: list | None = None, ahead: "JudgeAhead | None" = None,
               host: JudgeHost | None = None) -> dict:
    """Run one worker (`python -m loop.worker --job J --result R`, or `--probe`/`--health` when `job`
    is None) or, for a measurement, the judge (`python -m loop.judge`); always returns a result dict
    with a typed `status`. A judge hands its result over a pipe that no kernel process holds (the
    file it also writes is for the logs): a forged result file, or a judge killed from its kernel
    processes, is never read as a verdict.
    `launcher` is a command that runs the worker as its child (a profiler: `ncu ... <worker>`).
    `procs`, when given, receives the worker's Popen, so that a caller running workers from threads
    can kill them all when it is interrupted (a signal reaches the main thread only).
    `ahead`: a judge started before its job (`JudgeAhead`), for this very worker name and cache; it is
    handed the job instead of a new process being started. `host`: the run's judge host, which forks
    a judge (already past `import torch`) where it can (`loop.measure.host`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    adopt_kept_caches(cache_dir, job)
    if ahead is not None and ahead.usable(name, cache_dir):
        launched = ahead.submit(job)
    else:
        if ahead is not None:
            ahead.cancel()
        cmd = [*launcher, *worker_command(settings, workdir, name, job)]
        confined = not launcher and job is not None and job.get("mode") in CONFINED_MODES
        launched = _Launched(workdir, name, confined_command(cmd) if confined else cmd, job, backend, cache_dir,
                             host=host if not launcher else None, confined=confined)
    if procs is not None:
        procs.append(launched.proc)
    return launched.wait(timeout_s or settings.worker_timeout_s)


class _Launched:
    """A started worker or judge: its process, log, pid file and (a judge's) result pipe."""

    def __init__(self, workdir: Path, name: str, cmd: list[str], job: dict | None, backend: Backend | None,
                 cache_dir: Path, job_pipe: bool = False, host: JudgeHost | None = None, confined: bool = False):
        self.result_path, self.log_path = workdir / f"{name}.result.json", workdir / f"{name}.log"
        self.result_path.unlink(missing_ok=True)
        if job is not None:
            _write_job(workdir, name, job)
        self.piped = _ResultPipe() if cmd[cmd.index("-m") + 1] == "loop.judge" else None
        fds: tuple[int, ...] = ()
        if self.piped is not None:
            cmd += ["--result-fd", str(self.piped.write_fd)]
            fds = (self.piped.write_fd,)
        self.job_w = None
        if job_pipe:  # the judge reads its job's path from this pipe once it is ready
            job_r, self.job_w = os.pipe()
            cmd += ["--job-fd", str(job_r)]
            fds += (job_r,)
        self.started = time.monotonic()
        env = _worker_env(backend, cache_dir)
        with open(self.log_path, "w") as log:
            self.proc = host.spawn(cmd, env, workdir, log.fileno(), fds) if host is not None else None
            if self.proc is None:
                self.proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=not confined,
                                             preexec_fn=confine_zygote if confined else die_with_parent, pass_fds=fds)
        if job_pipe:
            os.close(job_r)
        if self.piped is not None:
            self.piped.started()
        self.pid_file = workdir / f"{name}.pid"
        record_pid(self.pid_file, self.proc.pid)  # for `tileloop resume`, should this process be killed and the worker not

    def wait(self, timeout: float) -> dict:
        proc, log_path = self.proc, self.log_path
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return {"status": "timeout", "message": f"worker exceeded {timeout:.0f}s and was killed (process group)",
                    "log_tail": _log_tail(log_path), "wall_s": round(time.monotonic() - self.started, 3)}
        except BaseException:
            kill_group(proc)  # Ctrl-C or SIGTERM of the orchestrator: leave no GPU process behind
            raise
        finally:
            if proc.poll() is None:
                kill_group(proc)
            self.pid_file.unlink(missing_ok=True)
        wall = round(time.monotonic() - self.started, 3)
        piped = self.piped
        text = piped.text() if piped is not None else (self.result_path.read_text() if self.result_path.exists() else None)
        if text and (piped is None or proc.returncode == 0):
            result = json.loads(text)
            result.setdefault("wall_s", wall)
            if result.get("status") not in ("ok",):
                result["log_tail"] = _log_tail(log_path)
            return result
        rc = proc.returncode
        how = f"killed by signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited with code {rc}"
        tail = _log_tail(log_path)
        status = "oom" if "out of memory" in tail.lower() else "runtime_error"
        return {"status": status, "message": f"{'judge' if piped else 'worker'} {how} without a result", "log_tail": tail,
                "wall_s": wall}


class JudgeAhead:
    """A judge started before its job: it starts its kernel processes, imports torch and makes its
    CUDA context (so do they) while the orchestrator commits the candidate and compiles it; the job
    then goes to it over a pipe (`run_worker(..., ahead=...)`). Called off, it ends with nothing done."""

    def __init__(self, workdir: Path, name: str, backend: Backend, settings: Settings, cache_dir: Path,
                 device: str, kernels: int, host: JudgeHost | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.name, self.cache_dir = workdir, name, cache_dir
        cmd = _command(settings, "loop.judge", workdir, name) + ["--kernels", str(kernels), "--device", device]
        self.launched: _Launched | None = _Launched(workdir, name, cmd, None, backend, cache_dir, job_pipe=True, host=host)

    def usable(self, name: str, cache_dir: Path) -> bool:
        """Alive, and started for this worker name and Triton cache (its environment holds the cache)."""
        return (self.launched is not None and name == self.name and cache_dir == self.cache_dir
                and self.launched.proc.poll() is None)

    def submit(self, job: dict) -> _Launched:
        launched, self.launched = self.launched, None
        path = _write_job(self.workdir, self.name, job)
        try:
            os.write(launched.job_w, str(path).encode())  # a path: far below a pipe's atomic write size
        except OSError:
            pass  # the judge died first: its exit and log say how (`_Launched.wait`)
        finally:
            os.close(launched.job_w)
        launched.started = time.monotonic()  # the measurement's time limit counts from its job
        return launched

    def cancel(self) -> None:
        """End it, with the kernel processes it started (they die with it)."""
        launched, self.launched = self.launched, None
        if launched is None:
            return
        os.close(launched.job_w)
        kill_group(launched.proc)
        launched.pid_file.unlink(missing_ok=True)


class _ResultPipe:
    """The read end of a judge's result pipe, drained by a thread (a result larger than the pipe's
    buffer must not block the judge while this process waits for it)."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)

    def started(self) -> None:
        os.close(self.write_fd)  # the judge holds the only write end now
        self._thread.start()

    def _drain(self) -> None:
        with os.fdopen(self.read_fd, "rb") as fh:
            while chunk := fh.read(1 << 16):
                self._chunks.append(chunk)

    def text(self) -> str:
        self._thread.join(timeout=10)
        return b"".join(self._chunks).decode(errors="replace")


def kill_group(proc: subprocess.Popen) -> None:
    kill_process_group(proc.pid, lambda: proc.poll() is None)  # a judge the host forked this instant: no group yet
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
