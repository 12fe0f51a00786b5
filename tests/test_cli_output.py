"""What the commands print, as a person or a program reads it: latencies in sensible digits, a stop
line that says something, JSON that never cuts what the table shortens, readable `status`, a closed
stdout that ends the command quietly, files written with the user's umask."""

from __future__ import annotations

from types import SimpleNamespace

from loop import decide
from loop.run.progress import ProgressView, latency_text
from loop.run.unattended import Unattended


def test_latencies_print_six_significant_digits():
    assert latency_text(12.758694000012838) == "12.7587 ms"
    assert latency_text(0.000123456789) == "0.000123457 ms"
    assert latency_text(None) == "-"


def test_the_stop_line_of_an_unattended_run_rounds_its_best_latency():
    lines: list[str] = []
    state = SimpleNamespace(mode="", stopped=None, best_latency_ms=12.758694000012838, best_commit="0123456789abcdef")
    run = SimpleNamespace(state=state, save=lambda: None, log=lines.append, timing_mode="interpreter",
                          stop_state=lambda **_: decide.StopState("stop", "no improvement twice in a row"),
                          progress_view=ProgressView("r", 5, log=lines.append, live=False))
    Unattended._run_loop(run, None)
    assert lines[-1] == "stopped: stop: no improvement twice in a row; best 12.7587 ms at 0123456789"
