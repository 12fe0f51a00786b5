"""Golden outputs of a short interpreter session: the `--json` object of every command an agent or a
reviewer uses, and the run's perf_results.md and report.md, compared with files recorded before the
package was reshaped (tests/golden/). Timings, dates, hashes, paths and versions are masked; every
key, every status, every decision, every commit trailer and every table layout is compared as it is;
every output is also checked against its JSON Schema (loop/cli/schema/) before it is masked.

The session's decisions do not depend on timing noise: a wrong candidate (revert, incorrect), a
candidate that does not parse (crash, compile_error), a launch-only change that the interpreter
cannot time (unmeasured: num_warps), an unchanged target (a user error), and an unattended run
whose one experiment is a planted fault. Regenerate after an intended change with
TILELOOP_UPDATE_GOLDEN=1 and read the diff before committing it.
"""

from __future__ import annotations

import pytest

import json
import os
import re
import subprocess
from pathlib import Path

from cli_schema import problems
from loop.cli import main

GOLDEN = Path(__file__).parent / "golden"
FAULTS = Path(__file__).parent / "faults"
TARGET = "kernels/vector_add/vector_add_triton.py"

# values that differ from one run (or machine) to the next, whatever their type
VOLATILE_KEYS = {"env", "wall_s", "started", "finished", "created", "date", "samples_ms", "nrep", "active_s",
                 "python", "platform", "torch_version", "triton_version", "cutile_version", "probe", "log_tail",
                 "calls_per_sample", "notes", "registers", "spills", "local", "shared", "path", "detail",
                 "tuned", "source_hash", "worker_dir", "experience", "drawn", "isolation", "records_seal"}
MASKS = [
    (re.compile(r"\b[0-9a-f]{40}\b"), "<sha>"),
    (re.compile(r"\b[0-9a-f]{7,39}\b"), "<short-sha>"),
    (re.compile(r"\d{8}-\d{4}(-\d+)?"), "<stamp>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"), "<date>"),
    (re.compile(r"-?\d+\.\d+(e-?\d+)?"), "<num>"),
]


def mask_text(text: str, repo: Path) -> str:
    text = text.replace(str(repo.resolve()), "<repo>").replace(str(repo), "<repo>")
    for pattern, repl in MASKS:
        text = pattern.sub(repl, text)
    return text


def mask_table(text: str, repo: Path) -> str:
    """A markdown file masked, with the padding of its table cells (which follows the widths of the
    masked numbers) collapsed."""
    return "\n".join(re.sub(r" {2,}", " ", re.sub(r"-{3,}", "---", line)) if line.startswith("|") else line
                     for line in mask_text(text, repo).splitlines()) + "\n"


def mask(value, repo: Path, key: str = ""):
    if key in VOLATILE_KEYS:
        return "<volatile>"
    if isinstance(value, dict):
        return {k: mask(v, repo, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, repo, key) for v in value]
    if isinstance(value, float):
        return "<num>"
    if isinstance(value, str):
        return mask_text(value, repo)
    return value


def call(capsys, repo: Path, argv: list[str]) -> dict:
    """One command's output, checked against its schema as it came (before masking), then masked."""
    code = main(argv + ["--json"])
    payload = json.loads(capsys.readouterr().out)
    wrong = problems(payload)
    assert not wrong, f"tileloop {' '.join(argv)} --json does not fit its schema: {wrong}"
    return {"argv": argv, "exit": code, "json": mask(payload, repo)}


def edit(repo: Path, old: str, new: str) -> None:
    path = repo / TARGET
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def session(repo: Path, capsys, monkeypatch) -> tuple[list[dict], dict[str, str]]:
    calls = []
    run = ["--device", "cpu", "--archs", "sm_90"]
    calls.append(call(capsys, repo, ["init", TARGET, *run, "--branch", "tileloop/golden"]))
    edit(repo, "x + y", "x - y")
    calls.append(call(capsys, repo, ["step", "-m", "subtract instead of add", "--hypothesis", "wrong on purpose"]))
    edit(repo, "pid = tl.program_id(0)", "pid = tl.program_id(0) +")
    calls.append(call(capsys, repo, ["step", "-m", "syntax error"]))
    edit(repo, "NUM_WARPS = 1", "NUM_WARPS = 4")
    calls.append(call(capsys, repo, ["step", "-m", "num_warps 1 -> 4", "--hypothesis", "more warps per program"]))
    calls.append(call(capsys, repo, ["step", "-m", "nothing changed"]))
    for argv in (["status"], ["history"], ["results"], ["report"], ["resume"], ["experience", "list"],
                 ["playbook", "list"], ["playbook", "show", "launch-param"],
                 ["playbook", "apply", "launch-param", TARGET, "--dry-run"]):
        calls.append(call(capsys, repo, argv))
    run_id = calls[0]["json"]["run"]
    files = {name: mask_table((repo / "sandbox" / "golden" / name).read_text(), repo)
             for name in ("perf_results.md", "report.md")}
    assert run_id == "golden"
    log = subprocess.run(["git", "log", "--format=%B%n-----", "tileloop/golden", "refs/tileloop/golden/1",
                          "refs/tileloop/golden/2", "refs/tileloop/golden/3"], cwd=repo, check=True,
                         capture_output=True, text=True).stdout
    files["commit-messages.txt"] = mask_text(log, repo)
    records = [mask(json.loads(line), repo) for line in (repo / "sandbox" / "golden" / "results.jsonl").read_text().splitlines()]
    files["records.json"] = json.dumps(records, indent=1, sort_keys=True) + "\n"
    # an unattended run from the first run's branch: its one experiment is a planted wrong kernel
    monkeypatch.setenv("TILELOOP_TEST_INJECT", f"1:{FAULTS / 'wrong_values.py'}")
    calls.append(call(capsys, repo, ["run", TARGET, *run, "--branch", "tileloop/golden-run", "--max-iters", "1"]))
    files["run-perf_results.md"] = mask_table((repo / "sandbox" / "golden-run" / "perf_results.md").read_text(), repo)
    return calls, files


def test_cli_outputs_match_the_golden_session(kernel_repo, capsys, monkeypatch):
    repo = kernel_repo
    calls, files = session(repo, capsys, monkeypatch)
    if os.environ.get("TILELOOP_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        (GOLDEN / "cli-session.json").write_text(json.dumps(calls, indent=1, sort_keys=True) + "\n")
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    expected = json.loads((GOLDEN / "cli-session.json").read_text())
    assert [c["argv"] for c in calls] == [c["argv"] for c in expected]
    for got, want in zip(calls, expected):
        assert got == want, f"tileloop {' '.join(got['argv'])} --json differs from its golden output"
    for name, text in files.items():
        assert text == (GOLDEN / name).read_text(), f"{name} differs from its golden copy"


@pytest.mark.slow  # the fast tier stays well under five minutes
def test_an_iteration_hands_its_job_to_the_judge_it_started_ahead(kernel_repo, capsys):
    """The orchestrator's judge started before the commit is the one that measures (its name and Triton
    cache are those the measurement asks for): its phases hold the wait for the job, which a judge
    started at measurement time does not have."""
    repo = kernel_repo
    call(capsys, repo, ["init", TARGET, "--device", "cpu", "--archs", "none", "--branch", "tileloop/ahead"])
    edit(repo, "NUM_WARPS = 1", "NUM_WARPS = 2")
    call(capsys, repo, ["step", "-m", "num_warps 1 -> 2"])
    (result,) = (repo / "sandbox").glob("*/logs/iter-001/worker-interpreter.result.json")
    phases = json.loads(result.read_text())["phases_s"]
    assert {"warm", "job"} <= set(phases) and phases["job"] <= phases["checked"], phases
    assert not list(result.parent.glob("*.pid"))  # judge and kernel processes ended
