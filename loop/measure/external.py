"""External harness: drive a repository's own correctness and performance commands.

A run started with `--test-cmd` and `--bench-cmd` (e.g. a TileGym checkout with its pytest suites)
does not use the spec-based worker. Each measurement, in the repository's working tree:

1. the test command runs once on the candidate: exit status 0 is PASS, any other status is
   `incorrect`, running past the time limit is `timeout`; a printed verdict other than
   `VERIFY: PASS` (croq-tune's `VERIFY: FAIL max_abs_err=<v>`) is `incorrect` whatever the status;
2. the bench command runs `bench_repeats` rounds with incumbent and candidate interleaved
   (A B, B A, A B, ...). External harnesses import the target from its place, so for each run
   the target file holds that version's source; the candidate is always put back afterwards,
   also on errors and interrupts;
3. every run's records are parsed and matched across runs by identity; each record's paired
   latencies (one per round) are one "shape" for the paired decision rules of `loop.decide`.

Records come from a junitxml file (when the bench command contains `{junitxml}`, which is
replaced by a path under the run's sandbox) or else from lines the command prints (dicts, or
croq-tune's `TFLOPS: <v> time_ms: <v>`); what a record is and how it is parsed is
`loop.measure.bench_records`'s. A candidate's bench run that prints a failed verdict or a malformed
record line is `incorrect`; the incumbent's (or the baseline's) is the harness's failure.

Failures of the harness itself (no parsable record, the incumbent failing its bench, records
that differ between runs of the same version, files left in the working tree, and, at the
baseline, commands that never imported the target from the working tree, as seen in the bytecode
they wrote) raise ExternalHarnessError: they are not the candidate's fault.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from loop.common.errors import UserError
from loop.common.files import atomic_write_text
from loop.common.processes import die_with_parent
from loop.common.stats import geomean
from loop.measure.bench_records import (
    BenchRecord,
    ExternalHarnessError,
    MalformedRecord,
    difference,
    failed_verdict,
    parse_junitxml,
    parse_printed,
    show,
    summary,
)
from loop.measure.launch import kill_group
from loop.records import gitops
from loop.records.results import BackendResult

BACKEND = "harness"  # the one "backend" of an external run: whatever the bench command measures
TIMING_LABEL = "harness"
JUNITXML = "{junitxml}"
DEFAULT_REPEATS = 3
MIN_REPEATS = 2  # one paired sample per record cannot estimate noise
RESULT_SCHEMA = "tileloop.harness/1"
PYCACHE_DIR = "harness-pycache"  # beside the iterations' log folders: one bytecode tree per run
MESSAGE_TAIL = 600


# ---------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Harness:
    """The commands of an external run, stored in the run state so step and resume reuse them."""

    test_cmd: str
    bench_cmd: str
    bench_repeats: int = DEFAULT_REPEATS

    def __post_init__(self):
        for flag, cmd in (("--test-cmd", self.test_cmd), ("--bench-cmd", self.bench_cmd)):
            if not isinstance(cmd, str) or not cmd.strip():
                raise UserError(f"{flag} is empty", hint="give the shell command that runs your harness")
        if isinstance(self.bench_repeats, bool) or not isinstance(self.bench_repeats, int) \
                or self.bench_repeats < MIN_REPEATS:
            raise UserError(f"--bench-repeats must be an integer >= {MIN_REPEATS}, got {self.bench_repeats!r}",
                            hint="each round times incumbent and candidate once; noise needs at least two rounds")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Harness":
        return cls(**data)


def from_options(test_cmd: str | None, bench_cmd: str | None, bench_repeats: int | None) -> Harness | None:
    """The harness named on the command line, or None for a spec-based run."""
    if test_cmd is None and bench_cmd is None:
        if bench_repeats is not None:
            raise UserError("--bench-repeats needs --test-cmd and --bench-cmd")
        return None
    if test_cmd is None or bench_cmd is None:
        raise UserError("--test-cmd and --bench-cmd go together",
                        hint='e.g. --test-cmd "pytest tests/test_op.py -k \'not perf\'" '
                             '--bench-cmd "pytest tests/test_op.py -k perf --junitxml={junitxml}"')
    return Harness(test_cmd, bench_cmd, DEFAULT_REPEATS if bench_repeats is None else bench_repeats)


# ---------------------------------------------------------------------- running commands


@dataclass(frozen=True)
class CommandRun:
    status: Literal["ok", "failed", "timeout"]
    returncode: int | None
    wall_s: float
    log: Path

    def tail(self, limit: int = MESSAGE_TAIL) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:].strip()
        except OSError:
            return ""

    def to_json(self) -> dict:
        return {"status": self.status, "returncode": self.returncode, "wall_s": self.wall_s, "log": self.log.name}


def harness_env(pycache: Path) -> dict:
    """The caller's environment, set so that a harness leaves no bytecode or pytest cache in the
    working tree: bytecode goes to the run's own tree of it (PYTHONPYCACHEPREFIX, kept across
    commands, so that large packages such as torch compile once per run; also where tileloop sees
    that the harness imported the target), and pytest's cache provider is off."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env["PYTHONUNBUFFERED"] = "1"
    addopts = env.get("PYTEST_ADDOPTS", "")
    if "no:cacheprovider" not in addopts:
        env["PYTEST_ADDOPTS"] = (addopts + " -p no:cacheprovider").strip()
    return env


def target_bytecode(pycache: Path, root: Path, target: str) -> list[Path]:
    """The bytecode that a harness's Python wrote for the target under `pycache` (any interpreter
    version, optimization level or pytest rewrite), by the tree's path as given and as resolved."""
    rel = Path(target)
    found: set[Path] = set()
    for base in {root.absolute(), root.resolve()}:
        folder = pycache / str(base / rel.parent).lstrip(os.sep)
        found.update(folder.glob(f"{rel.stem}.*.pyc"))
    return sorted(found)


def run_command(cmd: str, cwd: Path, log_path: Path, timeout_s: float, env: dict) -> CommandRun:
    """Run a user's shell command in its own process group, output to a log file, with a hard timeout."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, shell=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return CommandRun("timeout", None, round(time.monotonic() - started, 3), log_path)
        except BaseException:
            kill_group(proc)  # Ctrl-C or SIGTERM of the orchestrator: leave no process behind
            raise
    kill_group(proc)  # anything the command left running in the background would disturb the next timing
    return CommandRun("ok" if rc == 0 else "failed", rc, round(time.monotonic() - started, 3), log_path)


def _put_source(path: Path, source: str) -> None:
    """Write the target atomically, keeping its permission bits."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    atomic_write_text(path, source)
    os.chmod(path, mode)


def schedule(repeats: int, paired: bool) -> list[str]:
    """Run order: rounds of (incumbent, candidate), alternating which goes first (A B B A A B ...)."""
    if not paired:
        return ["baseline"] * repeats
    return [side for r in range(repeats) for side in (("incumbent", "candidate") if r % 2 == 0 else ("candidate", "incumbent"))]


# ---------------------------------------------------------------------- one measurement


def not_run_results(reason: str) -> dict[str, BackendResult]:
    return {BACKEND: BackendResult(BACKEND, True, "not_run", reason, timing_label=TIMING_LABEL)}


@dataclass(frozen=True)
class _Tree:
    """Where one measurement runs: the repository, its target, the iteration's log folder, the
    harness's environment and the run's bytecode tree (shared by every iteration of the run)."""

    root: Path
    target: str
    workdir: Path
    pycache: Path
    env: dict
    timeout_s: float

    @property
    def path(self) -> Path:
        return self.root / self.target

    @property
    def rel_dir(self) -> str:
        return str(self.workdir.relative_to(self.root))

    def run(self, cmd: str, name: str) -> tuple[CommandRun, bool]:
        """Run a command on whatever the target holds now; (the run, whether it imported the target).
        The target's bytecode is dropped first: a version swapped in within the same second as the
        last one, at the same size, is never run from the other's bytecode."""
        for stale in target_bytecode(self.pycache, self.root, self.target):
            stale.unlink(missing_ok=True)
        run = run_command(cmd, self.root, self.workdir / f"{name}.log", self.timeout_s, self.env)
        return run, bool(target_bytecode(self.pycache, self.root, self.target))


def measure(*, root: Path, target: str, harness: Harness, workdir: Path, incumbent_src: str | None,
            candidate_src: str, timeout_s: float, allowed_untracked: set[str],
            on_stage: Callable[[str], None] | None = None) -> tuple[dict[str, BackendResult], dict[str, dict]]:
    """Test the candidate, then time it against the incumbent (or alone, for the baseline).

    Returns ({BACKEND: result}, {BACKEND: raw}) where raw["timing"]["shapes"] has the layout
    `loop.decide.comparisons` reads. The target holds `candidate_src` when this returns or raises."""
    workdir.mkdir(parents=True, exist_ok=True)
    pycache = workdir.parent / PYCACHE_DIR
    tree = _Tree(root, target, workdir, pycache, harness_env(pycache), timeout_s)
    path = tree.path
    try:
        results, raw = _measure(tree, harness, incumbent_src, candidate_src, on_stage or (lambda _what: None))
    finally:
        if not path.exists() or path.read_text() != candidate_src:
            _put_source(path, candidate_src)
    others, new = gitops.integrity_violations(root, target, allowed_untracked)
    if others or new:
        raise ExternalHarnessError(
            f"the test or bench command left changes in the working tree outside the target: {', '.join((others + new)[:8])}",
            hint="a harness must write its outputs outside the repository (pytest: --junitxml={junitxml}) or to "
                 "git-ignored paths; remove them, then run tileloop again (after a step: tileloop resume)")
    atomic_write_text(workdir / "harness.result.json", json.dumps(raw, indent=1, default=str))
    return {BACKEND: results}, {BACKEND: raw}


def _measure(tree: _Tree, harness: Harness, incumbent_src: str | None, candidate_src: str,
             on_stage: Callable[[str], None]) -> tuple[BackendResult, dict]:
    label = "candidate" if incumbent_src is not None else "baseline"
    rel_dir = tree.rel_dir
    raw: dict = {"schema": RESULT_SCHEMA, "status": "ok", "harness": harness.to_json(), "runs": []}

    def failed(status: str, message: str) -> tuple[BackendResult, dict]:
        raw.update(status=status, message=message)
        return BackendResult(BACKEND, True, status, message, correctness="FAIL", timing_label=TIMING_LABEL,
                             worker_dir=rel_dir), raw

    on_stage("test")
    if tree.path.read_text() != candidate_src:
        _put_source(tree.path, candidate_src)
    test, imported = tree.run(harness.test_cmd, "test")
    raw["runs"].append({"command": "test", "side": label, **test.to_json(), "imported_target": imported})
    if test.status == "timeout":
        return failed("timeout", f"the test command ran past {tree.timeout_s:.0f}s and was killed (log: {rel_dir}/test.log)")
    if test.status == "failed":
        return failed("incorrect", f"the test command exited with code {test.returncode} (log: {rel_dir}/test.log): "
                                   f"...{test.tail()}")
    if (verdict := failed_verdict(_output(test))) is not None:
        return failed("incorrect", f"the test command printed {verdict!r} (log: {rel_dir}/test.log)")
    runs = _bench(tree, harness, incumbent_src, candidate_src, on_stage, raw)
    if isinstance(runs, tuple):  # the candidate's bench failed
        return failed(*runs)
    if incumbent_src is None and not any(r.get("imported_target") for r in raw["runs"]):
        raise ExternalHarnessError(
            f"neither the test command nor the bench command imported {tree.target} from this working tree "
            f"(logs: {rel_dir}/): they run another copy, so no change to the target would reach them",
            hint="put the tree first on their import path (e.g. PYTHONPATH=src for a src/ layout, or pip install -e .); "
                 "a command that imports it without writing bytecode (python -B, PYTHONDONTWRITEBYTECODE) cannot "
                 "be told apart: drop that; see docs/harness.md")
    reference = _check_records(runs, label, incumbent_src is not None)
    if isinstance(reference, tuple):
        return failed(*reference)
    entries, shapes, cand_medians, inc_medians = _paired(reference, runs, label, incumbent_src is not None)
    raw["timing"] = {"shapes": shapes}
    return BackendResult(BACKEND, True, "ok", "", geomean(cand_medians), geomean(inc_medians) if inc_medians else None,
                         "PASS", TIMING_LABEL, None, entries, rel_dir), raw


def _bench(tree: _Tree, harness: Harness, incumbent_src: str | None, candidate_src: str,
           on_stage: Callable[[str], None], raw: dict):
    """The bench command's rounds, incumbent and candidate interleaved: the records of each run per side,
    or (status, message) when the candidate's bench failed. A failure on the incumbent, or a run
    without records, is the harness's (ExternalHarnessError)."""
    label = "candidate" if incumbent_src is not None else "baseline"
    order = schedule(harness.bench_repeats, incumbent_src is not None)
    runs: dict[str, list[list[BenchRecord]]] = {"incumbent": [], label: []}
    for i, side in enumerate(order, 1):
        on_stage(f"bench {i}/{len(order)} ({side})")
        _put_source(tree.path, incumbent_src if side == "incumbent" else candidate_src)
        name = f"bench-{i:02d}-{side}"
        xml = tree.workdir / f"{name}.xml"
        xml.unlink(missing_ok=True)
        run, imported = tree.run(harness.bench_cmd.replace(JUNITXML, shlex.quote(str(xml))), name)
        raw["runs"].append({"command": "bench", "side": side, **run.to_json(), "imported_target": imported})
        where = f"log: {tree.rel_dir}/{name}.log"
        if run.status != "ok":
            what = f"ran past {tree.timeout_s:.0f}s and was killed" if run.status == "timeout" else f"exited with code {run.returncode}"
            if side == "incumbent":
                raise ExternalHarnessError(f"the bench command {what} on the incumbent (the best version so far), "
                                           f"run {i}/{len(order)} ({where}): ...{run.tail()}",
                                           hint="the harness or the machine changed; fix it, then tileloop resume")
            return ("timeout" if run.status == "timeout" else "runtime_error",
                    f"the bench command {what} on the {side} ({where}): ...{run.tail()}")
        try:
            verdict = failed_verdict(_output(run))
            if verdict is not None:
                raise MalformedRecord(f"the bench command printed {verdict!r}")
            runs[side].append(_records_of(run, harness, xml, f"{side}, run {i}/{len(order)}", where))
        except MalformedRecord as exc:
            message = f"{exc} on the {side}, run {i}/{len(order)} ({where})"
            if side == "candidate":
                return "incorrect", message
            raise MalformedRecord(message, hint="not the candidate's doing: fix the bench command or what it prints "
                                                "(docs/harness.md), then run again (after a step: tileloop resume)"
                                  ) from None
    return runs


def _output(run: CommandRun) -> str:
    try:
        return run.log.read_text(errors="replace")
    except OSError:
        return ""


def _records_of(run: CommandRun, harness: Harness, xml: Path, which: str, where: str) -> list[BenchRecord]:
    """The records one bench run emitted (junitxml or printed); none is the harness's failure."""
    if JUNITXML in harness.bench_cmd:
        if not xml.exists():
            raise ExternalHarnessError(f"the bench command wrote no junitxml file at {xml} ({where}): ...{run.tail()}",
                                       hint="pass --junitxml={junitxml} to pytest in --bench-cmd")
        records = parse_junitxml(xml)
    else:
        records = parse_printed(_output(run))
    if not records:
        source = f"junitxml {xml.name}" if JUNITXML in harness.bench_cmd else "output"
        hint = ("each record is a dict with a latency in ms (median_ms, latency_ms, ms, or median): printed one "
                "per line (pytest -s), or recorded with record_property and --junitxml={junitxml}; see docs/harness.md")
        if JUNITXML not in harness.bench_cmd and "pytest" in harness.bench_cmd:
            hint = ("pytest keeps what tests record with record_property out of its output (TileGym's perf tests "
                    "record there): add -o junit_family=xunit1 --junitxml={junitxml} to --bench-cmd; see docs/harness.md")
        raise ExternalHarnessError(
            f"the bench command emitted no parsable record in its {source} ({which}, {where}); output tail: ...{run.tail()}",
            hint=hint)
    return records


def _check_records(runs: dict, label: str, paired: bool):
    """The reference run's records (the incumbent's first run, or the baseline's), once every run of the
    same version emitted the same records; (status, message) when the candidate's records differ."""
    reference_side = "incumbent" if paired else label
    reference = runs[reference_side][0]
    ref_keys = {r.key for r in reference}  # unique within a run: repeated identities are numbered
    for records in runs[reference_side][1:]:
        if {r.key for r in records} != ref_keys:
            raise ExternalHarnessError(f"the bench command emitted different records on two runs of the same version "
                                       f"({difference(reference, records)})",
                                       hint="records are matched by name/op/backend/provider/shape/dtype/pass; "
                                            "make the bench deterministic in what it reports")
    if paired:
        for records in runs[label]:
            if {r.key for r in records} != ref_keys:
                return ("incorrect", f"the bench emitted different records for the candidate than for the "
                                     f"incumbent ({difference(reference, records)})")
    return reference


def _paired(reference: list[BenchRecord], runs: dict, label: str, paired: bool):
    """Per record: the summary of each side (entries, for the record) and the paired samples (shapes, in
    the layout `loop.decide.comparisons` reads), with the medians the geometric means are taken of."""
    entries, shapes, cand_medians, inc_medians = [], [], [], []
    for ref in reference:
        cand = [next(r for r in records if r.key == ref.key) for records in runs[label]]
        entry = {"shape": [ref.label], "dtype": show(dict(ref.identity).get("dtype", "")), "record": ref.fields(),
                 "method": "harness", label: summary(cand)}
        impls = {label: {"samples_ms": [r.latency_ms for r in cand]}}
        cand_medians.append(entry[label]["median_ms"])
        if paired:
            inc = [next(r for r in records if r.key == ref.key) for records in runs["incumbent"]]
            entry["incumbent"] = summary(inc)
            impls["incumbent"] = {"samples_ms": [r.latency_ms for r in inc]}
            inc_medians.append(entry["incumbent"]["median_ms"])
        entries.append(entry)
        shapes.append({"shape": [ref.label], "record": ref.fields(), "impls": impls})
    return entries, shapes, cand_medians, inc_medians


