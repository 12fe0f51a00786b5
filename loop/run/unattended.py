"""The unattended loop (`tileloop run`): one playbook candidate per iteration, proposed for the
current best version, until a stop rule fires; a candidate that carries a sweep is one experiment
with its sweep (`loop.run.sweep`)."""

from __future__ import annotations

from pathlib import Path

from loop import decide
from loop.run.sweep import Sweeping
from loop.run.levers import analysis_of
from playbook import Candidate, next_candidate
from playbook.base import why_nothing


class Unattended(Sweeping):
    def run_loop(self, max_iters: int | None = None) -> decide.StopState:
        with self.hosting():
            return self._run_loop(max_iters)

    def _run_loop(self, max_iters: int | None) -> decide.StopState:
        self.state.mode = "run"
        self.save()
        done_here, why = 0, None
        while True:
            stop = self.stop_state()
            if stop.state != "continue":
                break
            if max_iters is not None and done_here >= max_iters:
                stop = decide.stopping("stop", f"reached --max-iters {max_iters}", self.timing_mode)
                break
            if self.state.device == "cuda" and (bad := self.gpu_health()):
                stop = decide.stopping("escalate", f"GPU health check failed: {bad}", self.timing_mode)
                break
            src = (self.root / self.state.target).read_text()
            an, _ = analysis_of(self, src)  # with the best version's distance to its roofline: big levers first
            cand = self._injected(self.state.last_iteration + 1) or next_candidate(src, an, self.state.tried,
                                                                                    self.state.demoted,
                                                                                    self.state.skip_recipes)
            if cand is None:
                stop = self.stop_state(exhausted=True)
                if stop.state == "stop" and stop.reason.startswith("playbook exhausted"):
                    why = why_nothing(src, an, self.state.tried, self.state.skip_recipes)
                break
            self.progress_view.update(iteration=self.state.last_iteration + 1, change=cand.title)
            self.apply_candidate(cand, announce=True)  # its sweep first, where it carries one (loop.run.sweep)
            done_here += 1
        # an exhausted playbook says, per recipe, why it has nothing left: where a new recipe or an edit would go
        self.state.stopped = {**stop.to_json(), **({"recipes": why} if why else {})}
        self.save()
        self.log(f"stopped: {stop.state}: {stop.reason}; best {self.progress_view.latency_text(self.state.best_latency_ms)} at {self.state.best_commit[:10]}")
        for rid, reason in (why or {}).items():
            self.log(f"  {rid}: {reason}")
        self.progress_view.close()
        return stop

    def _injected(self, n: int):
        """A fault planted by TILELOOP_TEST_INJECT for iteration n (tests of unattended runs), once."""
        for it, path in self.settings.test_inject:
            key = f"fault-injection:{it}"
            if it == n and key not in self.state.tried:
                return Candidate("fault-injection", "fault", key, f"injected fault: {Path(path).stem}",
                                 "a planted fault: it must be classified and reverted, and the run must go on",
                                 Path(path).read_text())
        return None
