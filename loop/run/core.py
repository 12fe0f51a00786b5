"""The run: one value bound to its repository (settings, state, paths, records, perf_results.md,
stop state, the judge host), which every stage function of an iteration takes (`loop.run.iteration`).
Every public method leaves state.json consistent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from loop import decide
from loop.common.errors import IntegrityError, UserError
from loop.common.files import atomic_write_text
from loop.common.messages import Stage
from loop.common.settings import Settings
from loop.measure.host import JudgeHost
from loop.measure.launch import run_worker, start_judge_host
from loop.records import git_files, gitops
from loop.backends import get as get_backend
from loop.records.perf_table import render_perf_results
from loop.records.results import Record, read_records
from loop.run import state as st
from loop.run.progress import ProgressView, plain_log
from playbook.cst.entry import spec_entry

Log = Callable[[str], None]
stderr_log = plain_log
SEALED = ("results.jsonl", "perf_results.md")  # written by the orchestrator only, sealed in the state
GIT_SNAPSHOT = "git-state"  # .git/hooks, .git/info, .git/config as they were when the run began
HEALTH_FRESH_S = 300.0  # a measurement the device answered this recently stands for the health check


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def portable_env(env: dict) -> dict:
    """The environment as records keep it: tools by name and version, not by where they were installed."""
    return {k: (os.path.basename(v) if k in ("tileiras", "ncu") and isinstance(v, str) else v) for k, v in env.items()}


def _read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class Run:
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
        # the records as this process wrote them (or found them sealed): what `put_records_back` restores
        self._state_intact = st.intact(root, state.run_id)
        path = st.state_path(root, state.run_id)  # what it was loaded from: a later writer is seen by `save`
        self._state_text: str | None = path.read_text() if self._state_intact and path.exists() else None
        self._sealed: dict[str, bytes] = {}
        self._foreign: list[str] = []  # records found rewritten by someone else since this process wrote them
        # when a judge of this process last got an answer from the device (time.monotonic()): `gpu_health`
        # is skipped within HEALTH_FRESH_S of it (that measurement was the round trip)
        self.device_answered: float | None = None
        # the compile gate's summary, and the iteration it passed at, per (source, spec, language, architectures)
        # that passed in this process: the same source is not built again (a remeasure, an A/A pair)
        self.gated: dict[str, tuple[dict, int]] = {}

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
        """state.json from the state in memory; a state.json someone else wrote since is noted (`put_records_back`)."""
        if self._state_text is not None:
            path = st.state_path(self.root, self.state.run_id)
            if (path.read_text() if path.exists() else None) != self._state_text and "state.json" not in self._foreign:
                self._foreign.append("state.json")
        self._state_text = st.save(self.root, self.state)

    # ------------------------------------------------------------ the records sealed

    def seal(self) -> None:
        """The records as the orchestrator just wrote them: their hashes (and the best commit) in the
        state, their bytes in memory. Only tileloop writes them; `records_changed` finds any other writer."""
        self._sealed = {name: _read(self.dir / name) for name in SEALED}
        self.state.records_seal = {**self.state.records_seal, "tip": self.state.best_commit,
                                   **{name: _digest(data) for name, data in self._sealed.items()}}
        self.save()

    def records_changed(self) -> list[str]:
        """What of the run's records differs from what tileloop wrote last: state.json (its own hash),
        results.jsonl (its sealed bytes, followed at most by a record an interrupted iteration appended),
        perf_results.md, the branch, the snapshot of the git files."""
        seal = self.state.records_seal
        path = st.state_path(self.root, self.state.run_id)
        written = self._state_text is None or (path.read_text() if path.exists() else None) == self._state_text
        changed = [] if self._state_intact and written else ["state.json"]
        for name in SEALED:
            data, want = _read(self.dir / name), seal.get(name)
            if want is None:
                continue
            if len(data) < want["bytes"] or _digest(data[:want["bytes"]]) != want:
                changed.append(name)
            elif len(data) > want["bytes"] and (name != "results.jsonl" or not self._unfinished(data, want["bytes"])):
                changed.append(name)
        tip = seal.get("tip")
        if tip and self.state.inflight is None and gitops.ref_sha(self.root, f"refs/heads/{self.state.branch}") != tip:
            changed.append(f"branch {self.state.branch}")
        snap = self.dir / GIT_SNAPSHOT
        if seal.get(GIT_SNAPSHOT) and git_files.git_dir_digest(snap) != seal[GIT_SNAPSHOT]:
            changed.append(f"{st.SANDBOX}/{self.state.run_id}/{GIT_SNAPSHOT}")
        return changed

    def _unfinished(self, data: bytes, sealed: int) -> bool:
        """Whether what follows the sealed records is the record of an iteration a kill cut short
        between writing it and sealing it (resume finishes it), and nothing else."""
        try:
            done = {json.loads(line).get("iteration") for line in data[:sealed].decode().splitlines() if line.strip()}
            extra = [json.loads(line) for line in data[sealed:].decode().splitlines() if line.strip()]
        except (ValueError, AttributeError):
            return False
        # the iteration after the sealed ones, or the one in flight (the state's last iteration is the
        # records' own, read past the seal: it cannot vouch for them)
        now = {max((i for i in done if isinstance(i, int)), default=-1) + 1,
               self.state.inflight.iteration if self.state.inflight else None}
        return all(isinstance(r, dict) and r.get("iteration") in now - done for r in extra)

    def check_records(self) -> None:
        """Before an iteration or a resume: the records are tileloop's. A perf_results.md rewritten alone
        is regenerated from results.jsonl (the rewritten copy set aside); anything else is refused."""
        changed = self.records_changed()
        if self.perf_path.name in changed and len(changed) == 1:
            where = self.dir / "refused" / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            where.mkdir(parents=True, exist_ok=True)
            if self.perf_path.exists():
                (where / self.perf_path.name).write_bytes(self.perf_path.read_bytes())
            self.render()
            self.log(f"perf_results.md differs from what tileloop sealed (rewritten, or a kill before its seal): "
                     f"regenerated from results.jsonl (the copy found is in {where.relative_to(self.root)})")
        elif changed:  # nothing is written: the state in memory is what was found
            raise IntegrityError(
                f"refused: the run's records were changed outside tileloop since it last wrote them "
                f"({', '.join(changed)}); nothing was run or written",
                hint=f"tileloop history --run {self.state.run_id} rebuilds the run from git alone; if you edited "
                     f"them, undo the edit; else start a new run: tileloop init {self.state.target} --branch NAME")
        self._sealed = {name: _read(self.dir / name) for name in SEALED}

    def put_records_back(self) -> list[str]:
        """After kernel code ran: the records (and state.json) as this process wrote them, put back where
        they differ; returns what differed."""
        changed, self._foreign = list(self._foreign), []
        if self._sealed:
            for name, data in self._sealed.items():
                if _read(self.dir / name) != data:
                    changed.append(name)
                    atomic_write_text(self.dir / name, data.decode())
        path = st.state_path(self.root, self.state.run_id)
        if self._state_text is not None and (path.read_text() if path.exists() else None) != self._state_text:
            changed.append("state.json")
            atomic_write_text(path, self._state_text)
        return list(dict.fromkeys(changed))

    # ------------------------------------------------------------ the git files

    def snapshot_git_dir(self) -> None:
        """.git/hooks, .git/info and .git/config as they are at the run's start, sealed in the state."""
        snap = self.dir / GIT_SNAPSHOT
        if snap.exists():
            shutil.rmtree(snap)
        git_files.snapshot_git_dir(self.root, snap)
        self.state.records_seal = {**self.state.records_seal, GIT_SNAPSHOT: git_files.git_dir_digest(snap)}
        self.save()

    def restore_git_dir(self, where: Path) -> list[str]:
        """The git files put back from the run's snapshot (what differed moved under `where`); a run
        begun before the snapshot was kept gets it now, its .git/config from the older snapshot."""
        snap = self.dir / GIT_SNAPSHOT
        if not snap.exists():
            old = self.dir / "git-config.snapshot"
            config = git_files.guarded_paths(self.root)[".git/config"]
            changed = old.exists() and config.read_bytes() != old.read_bytes()
            if changed:
                where.mkdir(parents=True, exist_ok=True)
                (where / "git-config").write_bytes(config.read_bytes())
                config.write_bytes(old.read_bytes())
            self.snapshot_git_dir()
            return [".git/config"] if changed else []
        want = self.state.records_seal.get(GIT_SNAPSHOT)
        if want and git_files.git_dir_digest(snap) != want:
            raise IntegrityError(f"refused: the run's snapshot of its git files ({snap.relative_to(self.root)}) was "
                                 "changed outside tileloop: .git cannot be restored from it",
                                 hint=f"inspect .git/hooks, .git/info and .git/config by hand; start a new run: "
                                      f"tileloop init {self.state.target} --branch NAME")
        return git_files.restore_git_dir(self.root, snap, where / "git")

    def stage(self, name: Stage, commit: str | None = None) -> None:
        """The in-flight iteration at stage `name` (with its commit, once made), saved."""
        assert self.state.inflight is not None
        self.state.inflight = self.state.inflight.at(name, commit)
        self.save()
        self.progress_view.update(stage=name)
        if self.settings.test_kill_at == name and self.state.inflight.iteration >= 1:
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
        self.seal()  # every time the records were written: results.jsonl is appended before perf_results.md

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

    def stop_state(self, exhausted: bool = False) -> decide.Stop:
        p = self.progress()
        if exhausted:
            p = replace(p, playbook_exhausted=True)
        return decide.stop_state(self.policy, p)

    def check_position(self) -> None:
        """Before a change is applied: the records are tileloop's, the repository is on the run's branch,
        at its best commit."""
        self.check_records()
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
        """None when the device answers a tiny round trip within a minute, else why not. A judge that got
        the device's answers within the last HEALTH_FRESH_S seconds was that round trip: no worker is
        started (one costs ~5 s, a torch import and a CUDA context, on an H200)."""
        if self.device_answered is not None and time.monotonic() - self.device_answered < HEALTH_FRESH_S:
            return None
        workdir = self.dir / "logs" / "health"
        res = run_worker(workdir, None, None, self.settings, self.dir / "triton-cache" / "health", timeout_s=60, name="health")
        if res.get("status") == "ok":
            return None
        return f"{res.get('status')}: {res.get('message')}"
