"""The user's repository is theirs: which new files an iteration refuses (the ones the target or its
spec imports) and which it leaves alone (everything else), decided from the source, not by running it."""

from __future__ import annotations

import json

import pytest

from loop.cli import main
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
