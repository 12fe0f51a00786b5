"""The shape of the package, enforced: the import contracts of pyproject.toml ([tool.importlinter]:
the orchestrator's layers, the worker and the playbook kept apart, pure decisions, no import cycles)
hold, each contract fails on a planted violation, and no module or function outgrows its size."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("loop", "playbook")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the packages in `root`, with the contracts of its pyproject.toml."""
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", script, "--no-cache", "--no-logo", "pyproject.toml"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    out = lint_imports(REPO_ROOT)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "BROKEN" not in out.stdout and out.stdout.count("KEPT") == 9, out.stdout[-3000:]


def plant(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_each_contract_breaks_on_a_planted_violation(tmp_path):
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    plant(tmp_path, "loop.records.history", "from loop.run import state  # a layer importing one above it")
    plant(tmp_path, "loop.worker.bench", "from loop.decide import rules  # the untrusted side importing a decision")
    plant(tmp_path, "loop.measure.evaluate", "from loop.worker import bench  # the orchestrator importing kernel code")
    plant(tmp_path, "playbook.analysis", "from loop.records import gitops  # the playbook reaching into loop")
    plant(tmp_path, "loop.common.stats", "from loop.backends import base  # the shared leaf depending on a layer")
    plant(tmp_path, "loop.decide.rules", "import subprocess  # a decision doing I/O")
    plant(tmp_path, "loop.run.state", "from loop.run import core  # a cycle: core imports state")
    plant(tmp_path, "loop.judge.checks", "from loop.worker import serve  # the judge importing the kernel side")
    plant(tmp_path, "loop.measure.launch", "from loop.judge import run  # the orchestrator importing the judge")
    out = lint_imports(tmp_path)
    assert out.returncode != 0
    broken = [line for line in out.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert len(broken) == 9, out.stdout[-4000:]


def units() -> tuple[list[str], list[str]]:
    modules, functions = [], []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT)
            text = path.read_text()
            if (n := len(text.splitlines())) > MAX_MODULE_LINES:
                modules.append(f"{rel}: {n} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                        functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return modules, functions


def test_no_module_over_400_lines_and_no_function_over_80():
    modules, functions = units()
    assert not modules, "modules over 400 lines (split them by what each part owns):\n" + "\n".join(modules)
    assert not functions, "functions over 80 lines:\n" + "\n".join(functions)
