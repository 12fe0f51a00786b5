"""The experiment: a run and every stage it runs, composed.

    RunCore (core.py)            state, paths, records, perf_results.md, stop state
    Measuring (measuring.py)     verify + measure: compile gate, workers or the external harness
    Recording (recording.py)     record + keep|revert, counters, experience
    Baseline (baseline.py)       iteration 0, and its resumption after a kill during init
    Iteration (iteration.py)     integrity -> commit -> measure -> decide -> record
    Unattended (unattended.py)   the playbook loop of `tileloop run`
    Suggesting (suggest.py)      an agent's step: the next suggestions, one recipe's candidate as the step
    Resume (resume.py)           an interrupted iteration finished or recorded exactly once (integrity as an iteration)

`loop.run.init.init_run` makes a new one (branch and baseline); `open_run` opens an existing one.
"""

from __future__ import annotations

from pathlib import Path

from loop.common.settings import Settings
from loop.records import gitops
from loop.run import state as st
from loop.run.core import Log, stderr_log
from loop.run.resume import Resume
from loop.run.suggest import Suggesting
from loop.run.unattended import Unattended


class Experiment(Unattended, Suggesting, Resume):
    """A run bound to its repository; every public method leaves state.json consistent."""


def open_run(run_id: str | None, settings: Settings, log: Log = stderr_log, cwd: Path | None = None) -> Experiment:
    root = gitops.find_root(cwd or Path.cwd())
    rid = st.current(root, run_id)
    return Experiment(root, st.load(root, rid), settings, log)
