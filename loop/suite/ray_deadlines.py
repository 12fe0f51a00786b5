"""When the `--ray` driver stops waiting for a task, and why, in one line.

No task holds the suite up for good: one that has not said it began `START_S` after it was sent, or
after the suite's last task that had begun left the cluster (it may have waited for that one's
slot), and one still running `--per-run` plus `GRACE_S` after it began, is given up (`overdue`).
For one that never began, the reason is the last line of a traceback in the local cluster's worker
logs (`why_not_begun`), such as a worker that could not import Ray."""

from __future__ import annotations

import time
from pathlib import Path

from loop.suite.ray_cluster import LOGS

# a task's worker imports Ray, tileloop and the task's arguments, then says it began: one that has not, this
# long after it was sent or after the suite's other tasks left the cluster, never will (its workers die at
# start) or waits on a cluster too busy to run it
START_S = 120.0
# past a task's --per-run (which its own run keeps): the run's repair, its report (a final measurement on
# a GPU) and the way back; a task still running then is stuck
GRACE_S = 300.0
LOG_TAIL_BYTES = 64 * 1024  # read of each worker log's end for a traceback


def overdue(*, sent: float, started: float | None, node: str, per_run_s: float | None, held: float,
            session: Path | None) -> str | None:
    """Why the driver stops waiting for a task with nothing ready (one line), or None: it has not
    said it began (`started`, None) `START_S` after it was `sent` or after a task of the suite last
    held a slot (`held`: it may have waited for that one), or it is still running on `node`
    `per_run_s` plus `GRACE_S` after it began. `session`: the local cluster's session folder (None:
    a cluster joined), whose worker logs say why a task never began. Times: this host's monotonic clock."""
    now = time.monotonic()
    if started is None:
        if now - max(sent, held) < START_S:
            return None
        since = "the suite's other tasks left the cluster" if held > sent else "it was sent"
        return f"it had not begun {START_S:g} s after {since}: {why_not_begun(session)}"
    if per_run_s is not None and now - started > per_run_s + GRACE_S:
        return (f"it was still running on {node} {per_run_s + GRACE_S:g} s after it began (--per-run "
                f"{per_run_s:g} s, and {GRACE_S:g} s for its repair, report and way back); cancelled")
    return None


def why_not_begun(session: Path | None) -> str:
    """What the cluster's worker logs say of a task that never began, in words (one line); `session`:
    the local cluster's session folder, None for a cluster joined (its logs are on its nodes)."""
    if session is None:
        return ("no worker of the cluster ran it (its workers may die at start: see logs/worker-*.err in the Ray "
                "session folder of each node; or the cluster has no CPU or GPU free for it)")
    end = traceback_end(session / "logs")
    if end is None:
        return f"no worker of the local cluster ran it, and no worker log ({LOGS}/*.err) holds a traceback"
    line, name = end
    return f"a worker of the local cluster died at start: {line} ({LOGS}/{name})"


def traceback_end(logs: Path) -> tuple[str, str] | None:
    """The last line of the last traceback in the newest worker log (`*.err`) under a cluster's
    logs folder that holds one, and that log's path under the folder; None when none does."""
    found = []
    for path in logs.rglob("*.err"):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                text = f.read().decode(errors="replace")
            mtime = path.stat().st_mtime
        except OSError:  # rotated or removed meanwhile
            continue
        line = _exception_line(text)
        if line is not None:
            found.append((mtime, str(path.relative_to(logs)), line))
    if not found:
        return None
    _, name, line = max(found)
    return line, name


def _exception_line(text: str) -> str | None:
    """The line that ends the last Python traceback in `text` (`ModuleNotFoundError: ...`), or None."""
    head = text.rfind("Traceback (most recent call last):")
    if head < 0:
        return None
    for line in text[head:].splitlines()[1:]:
        if line.strip() and not line[0].isspace() and not set(line.strip()) <= set("^~ "):
            return line.strip()
    return None
