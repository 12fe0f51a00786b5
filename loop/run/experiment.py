"""An existing run opened (`open_run`), and where each part of a run lives:

    core.py         Run: the run bound to its repository (settings, state, paths, records, stop state)
    init.py         a new run: its branch, its state, its baseline (`init_run`)
    baseline.py     iteration 0, and its resumption after a kill during init
    iteration.py    one iteration: the proposers (`edit`, `candidate`) and the stages apply -> commit ->
                    verify -> measure -> decide -> record -> finish (`evaluate` runs them)
    measuring.py    verify + measure: compile gate, judges or the external harness
    recording.py    the record (built once), finish, the counters, experience
    integrity.py    only the target changes: when applied, and after kernel code ran
    sweep.py        a candidate's values timed in one measurement before it is proposed
    suggest.py      the screen of candidates, an agent's suggestions, `step --recipe`'s candidate
    unattended.py   the playbook loop of `tileloop run`
    resume.py       an interrupted iteration finished or recorded exactly once
"""

from __future__ import annotations

from pathlib import Path

from loop.common.settings import Settings
from loop.records import gitops
from loop.run import state as st
from loop.run.core import Log, Run, stderr_log


def open_run(run_id: str | None, settings: Settings, log: Log = stderr_log, cwd: Path | None = None) -> Run:
    """The run `run_id` (None: the current one) of the repository at `cwd` (or the working directory)."""
    root = gitops.find_root(cwd or Path.cwd())
    rid = st.current(root, run_id)
    return Run(root, st.load(root, rid), settings, log)
