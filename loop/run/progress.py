"""Progress of a run: a live status line (rich) on a terminal, plain log lines otherwise.

Plain lines go to stderr with a timestamp, so an unattended run's log reads well in a file; on
a terminal, rich keeps one status line (iteration, change, stage, elapsed, best) under the log.
"""

from __future__ import annotations

import datetime as dt
import sys
import time


def latency_text(ms: float | None) -> str:
    """A latency as a person reads it: six significant digits and the unit (`12.7587 ms`), never a float's
    seventeen; `-` when there is none."""
    return "-" if ms is None else f"{ms:.6g} ms"


def plain_log(message: str) -> None:
    print(f"[tileloop {dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


class ProgressView:
    latency_text = staticmethod(latency_text)  # for the run's own log lines, which reach the view only

    def __init__(self, run_id: str, max_iters: int, log=plain_log, live: bool | None = None):
        self.run_id, self.max_iters, self._log = run_id, max_iters, log
        self.fields = {"iteration": None, "change": "", "stage": "", "best": None}
        self.started = time.monotonic()
        self._status = None
        use_live = sys.stderr.isatty() if live is None else live
        if use_live and log is plain_log:
            try:
                from rich.console import Console

                self._console = Console(stderr=True)
                self._status = self._console.status(self._line())
                self._status.start()
            except ImportError:
                self._status = None

    def _line(self) -> str:
        f = self.fields
        elapsed = int(time.monotonic() - self.started)
        best = latency_text(f["best"])
        it = f"{f['iteration']}/{self.max_iters}" if f["iteration"] is not None else "-"
        return f"{self.run_id} · iteration {it} · {f['change']} · {f['stage']} · {elapsed // 60}m{elapsed % 60:02d}s · best {best}"

    def update(self, **fields) -> None:
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        if self._status is not None:
            self._status.update(self._line())

    def log(self, message: str) -> None:
        if self._status is not None:
            self._console.log(message)
        else:
            self._log(message)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
