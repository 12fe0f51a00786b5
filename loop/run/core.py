"""A run bound to its repository: its state, paths, records, perf_results.md and stop state.

`RunCore` is what every stage of a run shares; the stages add to it (`loop.run.experiment`
composes them). Every public method leaves state.json consistent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Callable

from loop import decide
from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.settings import Settings
from loop.measure.host import JudgeHost
from loop.measure.launch import run_worker, start_judge_host
from loop.records import gitops
from loop.backends import get as get_backend
from loop.records.perf_table import render_perf_results
from loop.records.results import Record, read_records
from loop.run import state as st
from loop.run.progress import ProgressView, plain_log
from playbook.cst.entry import spec_entry

Log = Callable[[str], None]
stderr_log = plain_log


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def portable_env(env: dict) -> dict:
    """The environment as records keep it: tools by name and version, not by where they were installed."""
    return {k: (os.path.basename(v) if k in ("tileiras", "ncu") and isinstance(v, str) else v) for k, v in env.items()}


def with_changes(record: Record, **changes) -> Record:
    return replace(record, **changes)


class RunCore:
    """A run bound to its repository; every public method leaves state.json consistent."""

    def __init__(self, root: Path, state: st.RunState, settings: Settings, log: Log = stderr_log):
        # the run's own per-worker timeout, unless TILELOOP_WORKER_TIMEOUT overrides it for this session
        if not settings.worker_timeout_given:
            settings = replace(settings, worker_timeout_s=state.worker_timeout_s)
        self.root, self.state, self.settings = root, state, settings
        self.policy = decide.Policy(**state.policy)
        self.progress_view = ProgressView(state.run_id, self.policy.max_iters, log)
        self.progress_view.update(best=state.best_latency_ms)
        self.log = self.progress_view.log
        self.host: JudgeHost | None = None  # an unattended run's judge host (`hosting`)

    def start_host(self) -> None:
        """The judge host of an unattended run (`loop.judge.host`): every judge that starts after it is
        ready is forked from it, past `import torch`; off with TILELOOP_JUDGE_HOST=0 or for a harness."""
        if self.settings.judge_host and not self.state.harness and self.host is None:
            self.host = start_judge_host(self.settings, self.dir / "judges")

    def close_host(self) -> None:
        host, self.host = self.host, None
        if host is not None:
            host.close()

    @contextlib.contextmanager
    def hosting(self):
        """A judge host for what runs inside (started here unless it already was), closed after it."""
        self.start_host()
        try:
            yield
        finally:
            self.close_host()

    @property
    def dir(self) -> Path:
        return st.run_dir(self.root, self.state.run_id)

    @property
    def results_path(self) -> Path:
        return self.dir / "results.jsonl"

    @property
    def perf_path(self) -> Path:
        return self.dir / "perf_results.md"

    def iter_dir(self, n: int) -> Path:
        """Everything one iteration's workers wrote: jobs, results, logs, the candidate copies."""
        return self.dir / "logs" / f"iter-{n:03d}"

    def records(self) -> list[Record]:
        return read_records(self.results_path)

    def save(self) -> None:
        st.save(self.root, self.state)

    def stage(self, name: str, **extra) -> None:
        assert self.state.inflight is not None
        self.state.inflight.update(stage=name, **extra)
        self.save()
        self.progress_view.update(stage=name)
        if self.settings.test_kill_at == name and self.state.inflight.get("iteration", 0) >= 1:
            # fault injection for the resume tests: a kill -9 on entering this stage
            os.kill(os.getpid(), signal.SIGKILL)

    @property
    def timing_mode(self) -> str:
        """How this run's iterations are timed: interpreter | gpu | harness."""
        return "harness" if self.state.harness else get_backend(self.state.target_backend).timing_label

    def render(self) -> None:
        header = {
            "target": f"`{self.state.target}` ({self.state.language})",
            "branch": f"`{self.state.branch}`",
            "target backend": self.state.target_backend,
            "device": self.state.env.get("gpu") or "CPU (Triton interpreter)",
        }
        if self.state.harness:
            header.update({"device": self.state.env.get("gpu") or "no GPU visible to tileloop",
                           "test command": f"`{self.state.harness['test_cmd']}`",
                           "bench command": f"`{self.state.harness['bench_cmd']}`"})
        text = render_perf_results(self.state.run_id, header, self.records(), self.state.target_backend, self.state.harness)
        atomic_write_text(self.perf_path, text)

    def progress(self) -> decide.Progress:
        """What the stop rules see. An interrupted iteration (a kill, a reboot) counts as an iteration
        but says nothing about the candidates: it is neither a crash nor a non-improvement there, so a
        resume right after a genuine crash does not escalate on the interruption."""
        real = [(o, v) for o, v in zip(self.state.outcomes, self.state.verdicts) if v != "interrupted"]
        decided = [v for o, v in real if o != "unmeasured"]
        return decide.Progress(
            iterations=max(self.state.last_iteration, 0), elapsed_s=self.state.active_s,
            outcomes=tuple(o for o, _ in real), last_verdict=decided[-1] if decided else None,
            crash_causes=tuple(c for c in self.state.crash_causes if c != "interrupted"), timing=self.timing_mode)

    def stop_state(self, exhausted: bool = False) -> decide.StopState:
        p = self.progress()
        if exhausted:
            p = replace(p, playbook_exhausted=True)
        return decide.stop_state(self.policy, p)

    def _check_position(self) -> None:
        branch = gitops.current_branch(self.root)
        if branch != self.state.branch:
            raise UserError(f"the repository is on {branch!r}, not the run's branch {self.state.branch!r}",
                            hint=f"git checkout {self.state.branch}")
        head = gitops.head_sha(self.root)
        if head != self.state.best_commit:
            raise UserError(f"branch tip {head[:10]} is not the run's best commit {self.state.best_commit[:10]}",
                            hint="tileloop resume repairs an interrupted iteration")

    def entry(self) -> tuple[str, ...]:
        """The target's entry point as its spec names it (ENTRY, or what an entry adapter calls): the
        playbook reads the forward path from there; () for a run without a spec (the default)."""
        spec = self.root / self.state.spec if self.state.spec else None
        try:
            return spec_entry(spec.read_text()) if spec else ()
        except (OSError, UnicodeDecodeError):
            return ()

    @property
    def arch(self) -> str:
        cap = self.state.env.get("capability")
        return f"sm_{cap[0]}{cap[1]}" if cap else "cpu"

    def gpu_health(self) -> str | None:
        """None when the device answers a tiny round trip within a minute, else why not."""
        workdir = self.dir / "logs" / "health"
        res = run_worker(workdir, None, None, self.settings, self.dir / "triton-cache" / "health", timeout_s=60, name="health")
        if res.get("status") == "ok":
            return None
        return f"{res.get('status')}: {res.get('message')}"
