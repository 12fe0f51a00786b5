"""The user's repository is theirs: which new files an iteration refuses (the ones the target or its
spec imports) and which it leaves alone (everything else), decided from the source, not by running it."""

from __future__ import annotations

import json
import shutil

import pytest
from test_void import edit, evaluate, run, step  # noqa: F401  (fixture)

from loop.cli import main
from loop.common.errors import IntegrityError
from loop.target.contract import imported_files

TARGET = "kernels/op/op_triton.py"


def write(root, rel: str, text: str = "") -> str:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return rel


def test_only_new_files_the_target_imports_are_its_business(tmp_path):
    write(tmp_path, TARGET, "import triton\nimport helper\nfrom pkg.sub import f\nfrom . import sibling\n")
    write(tmp_path, "kernels/op/spec.py", "import torch\n")
    new = [write(tmp_path, "kernels/op/helper.py", "import deeper\n"),  # imported by the target
           write(tmp_path, "kernels/op/deeper.py"),  # imported by helper, a new file too
           write(tmp_path, "kernels/op/pkg/__init__.py"), write(tmp_path, "kernels/op/pkg/sub.py"),
           write(tmp_path, "kernels/op/sibling.py"),
           write(tmp_path, "kernels/op/notes.py"),  # a new module nothing imports
           write(tmp_path, "step.json", "{}"), write(tmp_path, "kernels/op/.op_triton.py.swp", "x"),
           write(tmp_path, "NOTES.md", "# mine")]
    assert imported_files(tmp_path, TARGET, "kernels/op/spec.py", new) == sorted(
        ["kernels/op/helper.py", "kernels/op/deeper.py", "kernels/op/pkg/__init__.py", "kernels/op/pkg/sub.py",
         "kernels/op/sibling.py"])


def test_imports_by_name_and_from_the_spec_count_and_the_repository_root_resolves_too(tmp_path):
    write(tmp_path, TARGET, "import importlib\nmod = importlib.import_module('tables')\n")
    write(tmp_path, "kernels/op/spec.py", "import shared_inputs\n")
    new = [write(tmp_path, "kernels/op/tables.py"), write(tmp_path, "shared_inputs.py"), write(tmp_path, "other.py")]
    assert imported_files(tmp_path, TARGET, "kernels/op/spec.py", new) == ["kernels/op/tables.py", "shared_inputs.py"]
    assert imported_files(tmp_path, TARGET, None, new) == ["kernels/op/tables.py"]


@pytest.mark.slow
def test_a_step_leaves_the_users_untracked_files_alone(kernel_repo, capsys):
    target = kernel_repo / "kernels" / "vector_add" / "vector_add_triton.py"
    assert main(["init", str(target.relative_to(kernel_repo)), "--device", "cpu", "--archs", "none", "--json"]) == 0
    capsys.readouterr()
    mine = {"step.json": "", "NOTES.md": "# my notes\n", "kernels/vector_add/.vector_add_triton.py.swp": "swap",
            "kernels/vector_add/scratch.py": "print('not imported by anything')\n"}
    for rel, text in mine.items():
        (kernel_repo / rel).write_text(text)
    target.write_text(target.read_text().replace("x + y", "x - y"))
    assert main(["step", "-m", "wrong on purpose", "--json"]) == 0  # not refused: the step ran
    out = json.loads(capsys.readouterr().out)
    assert out["decision"]["verdict"] == "incorrect"
    assert {rel: (kernel_repo / rel).read_text() for rel in mine} == mine  # untouched, not moved
    assert not list((kernel_repo / "sandbox").glob("*/refused"))


def test_git_files_planted_between_steps_are_restored_and_the_step_refused(run, tmp_path):  # noqa: F811
    """.git/hooks, .git/info and .git/config are restored from the run's snapshot before a step, as the
    target's neighbours are; the step that found them changed is refused, the next one runs."""
    repo, exp, _ = run
    hook = repo / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\ntouch '{tmp_path / 'ran'}'\n")
    hook.chmod(0o755)
    (repo / ".git" / "info" / "attributes").write_text("* filter=tidy\n")
    with pytest.raises(IntegrityError, match=r"\.git/hooks, \.git/info"):
        step(exp, 1024)
    assert not hook.exists() and not (repo / ".git" / "info" / "attributes").exists()
    saved = list(exp.dir.glob("refused/*/git/.git/hooks/post-commit"))
    assert len(saved) == 1
    record, _ = evaluate(exp, "BLOCK 128 -> 1024")
    assert record.status == "keep" and not (tmp_path / "ran").exists()


def test_a_run_begun_with_only_a_config_snapshot_gets_the_whole_snapshot(run):  # noqa: F811
    repo, exp, _ = run
    config = repo / ".git" / "config"
    shutil.rmtree(exp.dir / "git-state")
    exp.state.records_seal.pop("git-state")
    (exp.dir / "git-config.snapshot").write_bytes(config.read_bytes())
    with open(config, "a") as fh:
        fh.write("[core]\n\tfsmonitor = true\n")
    edit(repo, 1024)
    with pytest.raises(IntegrityError, match=r"\.git/config"):
        evaluate(exp, "BLOCK 128 -> 1024")
    assert "fsmonitor" not in config.read_text() and (exp.dir / "git-state" / ".git" / "hooks").is_dir()
    assert evaluate(exp, "BLOCK 128 -> 1024")[0].status == "keep"
