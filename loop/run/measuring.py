"""The verify and measure stages of an iteration: the ahead-of-time compile gate (`verify`), then
one judge per backend, or the repository's own test and bench commands (`measure_version`), turned
into typed results."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

from loop.backends import get as get_backend
from loop.measure import external
from loop.measure.compile_gate import compile_gate, compile_summary
from loop.measure.evaluate import CPU_TIMING, measure, not_run
from loop.measure.launch import JudgeAhead
from loop.records.results import BackendResult
from loop.run.core import Run
from loop.target.contract import spec_dtypes

Measured = tuple[dict[str, BackendResult], dict, dict]  # (results per backend, the judges' raw results, the gate)


def judge_ahead(run: Run, n: int) -> JudgeAhead | None:
    """The target backend's judge, started now (with a kernel process for the incumbent and one for
    the candidate): it gets ready while the candidate is committed and compiled."""
    tb = run.state.target_backend
    if run.state.harness or not run.state.availability.get(tb, {}).get("available"):
        return None
    return JudgeAhead(run.iter_dir(n), f"worker-{tb}", get_backend(tb), run.settings, run.dir / "triton-cache" / tb,
                      run.state.device, kernels=2, host=run.host)


def measure_version(run: Run, n: int, incumbent_src: str | None, candidate_src: str,
                    ahead: JudgeAhead | None = None) -> Measured:
    """Verify and measure `candidate_src` (beside `incumbent_src`; None for the baseline) as iteration n."""
    workdir = run.iter_dir(n)
    workdir.mkdir(parents=True, exist_ok=True)
    if run.state.harness:
        return measure_external(run, n, workdir, incumbent_src, candidate_src)
    label = "candidate" if incumbent_src is not None else "baseline"
    impls = implementations(run, workdir, {**({"incumbent": incumbent_src} if incumbent_src is not None else {}),
                                           label: candidate_src})
    failed, gate = verify(run, n, workdir, impls[label])
    if failed is not None:
        return failed, {}, gate
    m = judged(run, n, workdir, impls, [label], run.state.backends, lambda s: on_measure(run, n, s), ahead)
    return m.results, m.raw, gate


def measure_external(run: Run, n: int, workdir: Path, incumbent_src: str | None, candidate_src: str) -> Measured:
    """The repository's own test (the verify stage) and bench commands decide (`loop.measure.external`)."""
    if run.state.inflight is not None:
        run.stage("verify")

    def on_stage(what: str) -> None:  # the test command is the verify stage, entered above
        if what == "test":
            run.log(f"#{n} test")
        else:
            on_measure(run, n, what)

    results, raw = external.measure(
        root=run.root, target=run.state.target, harness=external.Harness.from_json(run.state.harness),
        workdir=workdir, incumbent_src=incumbent_src, candidate_src=candidate_src,
        timeout_s=run.settings.worker_timeout_s, allowed_untracked=set(run.state.untracked_at_start),
        on_stage=on_stage)
    return results, raw, {}


def verify(run: Run, n: int, workdir: Path, target: Path) -> tuple[dict[str, BackendResult] | None, dict]:
    """The verify stage: `target` compiled ahead of time for the run's architectures. Returns (the
    results of a failed gate, else None; the gate's summary, {} without a gate)."""
    if run.state.inflight is not None:
        run.stage("verify")
    if not run.state.archs:
        return None, {}
    key = gate_key(run, target)
    if key in run.gated:  # this very source passed the gate in this process (a remeasure, an A/A pair)
        gate, at = run.gated[key]
        run.log(f"#{n} compile {','.join(run.state.archs)}: passed before (#{at}), not built again")
        return None, gate
    run.log(f"#{n} compile {','.join(run.state.archs)}")
    raw = compile_gate(workdir=workdir, spec_path=run.root / run.state.spec, target_dir=(run.root / run.state.target).parent,
                       target=target, language=run.state.language, archs=run.state.archs,
                       settings=run.settings, cache_root=run.dir / "triton-cache",
                       dtypes=spec_dtypes(run.root / run.state.spec))
    gate = {"status": raw["status"], "archs": run.state.archs, "rows": compile_summary(raw)}
    if raw["status"] == "ok":
        run.gated[key] = (gate, n)
        return None, gate
    reason = f"ahead-of-time compile failed: {raw.get('message', '')}"[:500]
    results = {name: not_run(name, run.state.availability, "compile gate failed") for name in run.state.backends}
    tb = run.state.target_backend
    results[tb] = BackendResult(tb, True, raw["status"], reason, correctness="FAIL",
                                timing_label=get_backend(tb).timing_label,
                                worker_dir=str(workdir.relative_to(run.root)))
    return results, gate


def gate_key(run: Run, target: Path) -> str:
    """What the gate's verdict depends on: the candidate's source, the spec, the language, the
    architectures (the rest of the target's folder is checked unchanged by every iteration)."""
    digest = hashlib.sha256()
    for part in (target.read_bytes(), (run.root / run.state.spec).read_bytes(), run.state.language.encode(),
                 ",".join(run.state.archs).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def implementations(run: Run, workdir: Path, sources: dict[str, str]) -> dict[str, Path]:
    """Each implementation's source (label -> source) as a file of the measurement's folder."""
    stem = Path(run.state.target).stem
    impls = {}
    for label, source in sources.items():
        impls[label] = workdir / f"{stem}__{label.replace('-', '_')}.py"
        impls[label].write_text(source)
    return impls


def judged(run: Run, n: int, workdir: Path, impls: dict[str, Path], check: list[str], backends: list[str],
           on_stage: Callable[[str], None], ahead: JudgeAhead | None = None):
    """One judged measurement of `impls` per backend of `backends` (`check`: the labels whose
    correctness is checked), with the run's spec, seed, device, caches and judge host."""
    m = measure(root=run.root, workdir=workdir, spec_path=run.root / run.state.spec,
                target_dir=(run.root / run.state.target).parent, impls=impls, check=check,
                backend_names=backends, availability=run.state.availability,
                target_backend=run.state.target_backend, device=run.state.device, seed=run.state.seed + n,
                settings=run.settings, cache_root=run.dir / "triton-cache", on_stage=on_stage,
                timing=CPU_TIMING if run.state.device == "cpu" else None, target=run.root / run.state.target,
                ahead=ahead, host=run.host)
    if run.state.device == "cuda" and (m.raw.get(run.state.target_backend) or {}).get("status") == "ok":
        run.device_answered = time.monotonic()  # the device answered this judge: `Run.gpu_health` skips its worker
    return m


def on_measure(run: Run, n: int, what: str) -> None:
    if run.state.inflight is not None and run.state.inflight.stage != "measure":
        run.stage("measure")
    run.log(f"#{n} {what}")


def unchecked(raw: dict, backend: str) -> list[str]:
    """The dtypes the worker's correctness checks skipped, with why (bf16 under the interpreter)."""
    return list((raw.get(backend) or {}).get("correctness", {}).get("skipped") or [])
