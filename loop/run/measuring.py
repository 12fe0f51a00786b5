"""The verify and measure stages of an iteration: the ahead-of-time compile gate, then one judge
per backend (or the repository's own test and bench commands), turned into typed results."""

from __future__ import annotations

from pathlib import Path

from loop.backends import get as get_backend
from loop.measure import external
from loop.measure.compile_gate import compile_gate, compile_summary
from loop.measure.evaluate import CPU_TIMING, measure, not_run
from loop.measure.launch import JudgeAhead
from loop.records.results import BackendResult
from loop.run.core import RunCore
from loop.target.contract import spec_dtypes


class Measuring(RunCore):
    def judge_ahead(self, n: int) -> JudgeAhead | None:
        """The target backend's judge, started now (with a kernel process for the incumbent and one for
        the candidate): it gets ready while the candidate is committed and compiled."""
        tb = self.state.target_backend
        if self.state.harness or not self.state.availability.get(tb, {}).get("available"):
            return None
        return JudgeAhead(self.iter_dir(n), f"worker-{tb}", get_backend(tb), self.settings, self.dir / "triton-cache" / tb,
                          self.state.device, kernels=2, host=self.host)

    def _measure(self, n: int, incumbent_src: str | None, candidate_src: str,
                 ahead: JudgeAhead | None = None) -> tuple[dict[str, BackendResult], dict, dict]:
        workdir = self.iter_dir(n)
        workdir.mkdir(parents=True, exist_ok=True)
        if self.state.harness:  # the repository's own test and bench commands decide (loop.external)
            if self.state.inflight is not None:
                self.stage("verify")

            def on_stage(what: str) -> None:  # the test command is the verify stage, entered above
                if what == "test":
                    self.log(f"#{n} test")
                else:
                    self._on_measure(n, what)

            results, raw = external.measure(
                root=self.root, target=self.state.target, harness=external.Harness.from_json(self.state.harness),
                workdir=workdir, incumbent_src=incumbent_src, candidate_src=candidate_src,
                timeout_s=self.settings.worker_timeout_s, allowed_untracked=set(self.state.untracked_at_start),
                on_stage=on_stage)
            return results, raw, {}
        label = "candidate" if incumbent_src is not None else "baseline"
        impls = self.implementations(workdir, {**({"incumbent": incumbent_src} if incumbent_src is not None else {}),
                                               label: candidate_src})
        gate = {}
        if self.state.inflight is not None:
            self.stage("verify")
        if self.state.archs:
            self.log(f"#{n} compile {','.join(self.state.archs)}")
            raw = compile_gate(workdir=workdir, spec_path=self.root / self.state.spec, target_dir=(self.root / self.state.target).parent,
                               target=impls[label], language=self.state.language, archs=self.state.archs,
                               settings=self.settings, cache_root=self.dir / "triton-cache",
                               dtypes=spec_dtypes(self.root / self.state.spec))
            gate = {"status": raw["status"], "archs": self.state.archs, "rows": compile_summary(raw)}
            if raw["status"] != "ok":
                reason = f"ahead-of-time compile failed: {raw.get('message', '')}"[:500]
                results = {name: not_run(name, self.state.availability, "compile gate failed") for name in self.state.backends}
                tb = self.state.target_backend
                results[tb] = BackendResult(tb, True, raw["status"], reason, correctness="FAIL",
                                            timing_label=get_backend(tb).timing_label,
                                            worker_dir=str(workdir.relative_to(self.root)))
                return results, {}, gate
        m = self.judged(n, workdir, impls, [label], self.state.backends, lambda s: self._on_measure(n, s), ahead)
        return m.results, m.raw, gate

    def implementations(self, workdir: Path, sources: dict[str, str]) -> dict[str, Path]:
        """Each implementation's source (label -> source) as a file of the measurement's folder."""
        stem = Path(self.state.target).stem
        impls = {}
        for label, source in sources.items():
            impls[label] = workdir / f"{stem}__{label.replace('-', '_')}.py"
            impls[label].write_text(source)
        return impls

    def judged(self, n: int, workdir: Path, impls: dict[str, Path], check: list[str], backends: list[str], on_stage,
               ahead: JudgeAhead | None = None):
        """One judged measurement of `impls` per backend of `backends` (`check`: the labels whose
        correctness is checked), with the run's spec, seed, device, caches and judge host."""
        return measure(root=self.root, workdir=workdir, spec_path=self.root / self.state.spec,
                       target_dir=(self.root / self.state.target).parent, impls=impls, check=check,
                       backend_names=backends, availability=self.state.availability,
                       target_backend=self.state.target_backend, device=self.state.device, seed=self.state.seed + n,
                       settings=self.settings, cache_root=self.dir / "triton-cache", on_stage=on_stage,
                       timing=CPU_TIMING if self.state.device == "cpu" else None, target=self.root / self.state.target,
                       ahead=ahead, host=self.host)

    def _on_measure(self, n: int, what: str) -> None:
        if self.state.inflight is not None and self.state.inflight.get("stage") != "measure":
            self.stage("measure")
        self.log(f"#{n} {what}")


def unchecked(raw: dict, backend: str) -> list[str]:
    """The dtypes the worker's correctness checks skipped, with why (bf16 under the interpreter)."""
    return list((raw.get(backend) or {}).get("correctness", {}).get("skipped") or [])
