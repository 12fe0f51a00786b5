"""The agent path: a scripted agent drives the CLI through JSON only, and every command in
SKILL.md is run."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from loop.cli import main
from loop.records.results import read_records
from loop.records.perf_table import Row
from test_e2e_cpu import SMALL_SPEC, TARGET, git, small_repo  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
FAULTS = Path(__file__).parent / "faults"


def call(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + (["--json"] if "--json" not in argv else []))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_scripted_agent_session(small_repo, capsys):
    code, init = call(capsys, ["init", TARGET, "--device", "cpu", "--branch", "tileloop/agent", "--archs", "sm_90"])
    assert code == 0 and init["baseline"]["status"] == "keep" and init["schema"] == "tileloop.cli/1"
    target = small_repo / TARGET
    original = target.read_text()
    transcript = []

    def step(name, source, **flags):
        target.write_text(source)
        code, out = call(capsys, ["step", "-m", name, "--hypothesis", f"h: {name}", "--rationale", "r", "--expected", "e"])
        transcript.append((name, code, out))
        return code, out

    code, out = step("BLOCK 128 -> 1024", original.replace("BLOCK = 128", "BLOCK = 1024"))
    assert (code, out["status"], out["correctness"]) == (0, "keep", "PASS")
    assert out["noise_band"]["lo"] > 1.0 and out["stop"]["state"] == "continue"
    assert out["hypothesis"] == "h: BLOCK 128 -> 1024" and out["rationale"] == "r" and out["expected"] == "e"
    assert isinstance(out["suggestions"], list) and all("hypothesis" in s for s in out["suggestions"])
    best = (small_repo / TARGET).read_text()

    code, out = step("wrong values", best.replace("x + y", "x - y"))
    assert (out["status"], out["decision"]["verdict"]) == ("revert", "incorrect")
    code, out = step("compile error", FAULTS.joinpath("compile_error.py").read_text())
    assert (out["status"], out["decision"]["verdict"]) == ("crash", "compile_error")

    # each cheating edit of the target is rejected with the right reason
    cheats = {
        "cached_result": "incorrect", "partial_write": "incorrect", "input_mutation": "incorrect",
        "timer_patch": "incorrect", "nan_output": "incorrect",
    }
    for name, verdict in cheats.items():
        code, out = step(f"cheat: {name}", FAULTS.joinpath(f"{name}.py").read_text())
        assert code == 0 and (out["status"], out["decision"]["verdict"]) == ("revert", verdict), (name, out["decision"])
    zeros = best.replace("tl.store(out_ptr + offs, x + y, mask=mask)", "tl.store(out_ptr + offs, x * 0.0, mask=mask)")
    assert zeros != best
    code, out = step("cheat: zeros", zeros)
    assert (out["status"], out["decision"]["verdict"]) == ("revert", "incorrect")
    assert "timer tampering" in next(o for n, _, o in transcript if n == "cheat: timer_patch")["decision"]["reason"]

    # an edit outside the target is refused before it runs; the tree is restored, the edit saved
    spec = small_repo / "kernels" / "vector_add" / "spec.py"
    spec.write_text(spec.read_text().replace("(1e-6, 1e-6)", "(10.0, 10.0)"))
    (small_repo / "helper.py").write_text("x = 1\n")  # a new file the target imports: refused with the spec edit
    target.write_text(best.replace("NUM_WARPS = 1", "NUM_WARPS = 2").replace("import triton\n", "import triton\nimport helper\n", 1))
    head = git(small_repo, "rev-parse", "HEAD")
    code, out = call(capsys, ["step", "-m", "loosen the spec"])
    assert code == 2 and "refused" in out["error"] and "spec.py" in out["error"]
    assert git(small_repo, "rev-parse", "HEAD") == head
    assert "(1e-6, 1e-6)" in spec.read_text() and not (small_repo / "helper.py").exists()
    saved = list((small_repo / "sandbox").glob("*/refused/*"))
    assert len(saved) == 1 and (saved[0] / "tracked.patch").exists() and (saved[0] / "untracked" / "helper.py").exists()
    assert "NUM_WARPS = 2" in target.read_text()  # the target edit itself is kept for the agent to step
    assert "import helper" in target.read_text()
    target.write_text(best)

    # a git config change is refused and restored as well
    git(small_repo, "config", "core.hooksPath", "/tmp/evil-hooks")
    target.write_text(best.replace("NUM_WARPS = 1", "NUM_WARPS = 2"))
    code, out = call(capsys, ["step", "-m", "with a hook"])
    assert code == 2 and ".git/config" in out["error"]
    assert "evil-hooks" not in (small_repo / ".git" / "config").read_text()
    target.write_text(best)

    # history (from git alone) equals the records; status and results agree
    code, hist = call(capsys, ["history"])
    run_id = init["run"]
    records = read_records(small_repo / "sandbox" / run_id / "results.jsonl")
    assert [tuple(r.values()) for r in hist["rows"]] and len(hist["rows"]) == len(records) == 10
    assert [Row.from_record(r).status for r in records] == [row["status"] for row in hist["rows"]]
    code, status = call(capsys, ["status"])
    assert status["iterations"] == 9 and status["best_commit"] == records[1].commit
    code, exp = call(capsys, ["experience", "stats"])
    assert code == 0 and sum(r["tries"] for r in exp["stats"]) == 9


def skill_commands() -> list[str]:
    text = (ROOT / "SKILL.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip().startswith("tileloop ")]


def test_every_skill_command_runs(tmp_path, monkeypatch, capsys):
    """Run SKILL.md's commands in order in a repository holding a small softmax target."""
    op = tmp_path / "kernels" / "softmax"
    op.mkdir(parents=True)
    shutil.copy(ROOT / "kernels" / "softmax" / "softmax_triton.py", op)
    spec = (ROOT / "kernels" / "softmax" / "spec.py").read_text()
    spec = re.sub(r"CORRECTNESS_SHAPES = .*", "CORRECTNESS_SHAPES = [(1, 1), (5, 17), (9, 300)]", spec)
    spec = re.sub(r"INTERPRETER_SHAPES = .*", "INTERPRETER_SHAPES = [(4, 256)]", spec)
    spec = re.sub(r'DTYPES = .*', 'DTYPES = ["float32"]', spec)
    (op / "spec.py").write_text(spec)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "softmax")
    monkeypatch.chdir(tmp_path)
    commands = skill_commands()
    assert len(commands) >= 12
    seen = set()
    for line in commands:
        argv = shlex.split(line)[1:]
        if argv[0] in ("init", "run", "check"):
            argv += ["--device", "cpu", "--archs", "sm_90"]
        if argv[0] == "run":  # unattended run: one iteration is enough to prove the command
            argv[argv.index("--max-iters") + 1] = "1"
        if argv[0] == "step" and "--recipe" not in argv:  # a recipe step applies its candidate itself
            target = op / "softmax_triton.py"
            target.write_text(target.read_text().replace("BLOCK = 128", "BLOCK = 1024"))
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, (line, out.err[-2000:])
        if "--json" in argv:
            payload = json.loads(out.out)
            assert payload["schema"] == "tileloop.cli/1" and payload["command"] == argv[0], line
        seen.add(argv[0])
    assert {"doctor", "check", "compile", "init", "playbook", "experience", "step", "status", "results", "history",
            "report", "run", "resume"} <= seen
