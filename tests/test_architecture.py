"""The shape of the package, enforced: the import contracts of pyproject.toml ([tool.importlinter]:
the orchestrator's layers, the worker and the playbook kept apart, pure decisions, no import cycles)
hold, each contract fails on a planted violation; and the size of modules and functions, as a
report for a reviewer (modules over 500 lines, functions over 100, shown in the warnings summary of
every run) and a wall far beyond it (800 and 150) that only a module or function grown out of
hand meets. A module is split by what it owns, never to get under a number."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("loop", "playbook")
REPORT_MODULE_LINES, REPORT_FUNCTION_LINES = 500, 100  # listed for a reviewer to read
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 800, 150  # refused: a module or function grown out of hand


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


class SizeReport(UserWarning):
    """Modules and functions a reviewer reads for whether they own one thing (not a failure)."""


def units(root: Path, module_lines: int, function_lines: int) -> tuple[list[str], list[str]]:
    """The modules of the packages under `root` longer than `module_lines`, and the functions longer
    than `function_lines`, one line each."""
    modules, functions = [], []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            text = path.read_text()
            if (n := len(text.splitlines())) > module_lines:
                modules.append(f"{rel}: {n} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if (n := node.end_lineno - node.lineno + 1) > function_lines:
                        functions.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return modules, functions


def test_sizes_are_reported_over_500_and_100_lines_and_refused_over_800_and_150():
    modules, functions = units(REPO_ROOT, REPORT_MODULE_LINES, REPORT_FUNCTION_LINES)
    if modules or functions:
        warnings.warn(SizeReport(f"for a reviewer: modules over {REPORT_MODULE_LINES} lines, functions over "
                                 f"{REPORT_FUNCTION_LINES}: " + "; ".join(modules + functions)), stacklevel=1)
    modules, functions = units(REPO_ROOT, MAX_MODULE_LINES, MAX_FUNCTION_LINES)
    assert not modules, f"modules over {MAX_MODULE_LINES} lines (what does each own?):\n" + "\n".join(modules)
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(functions)


def test_the_size_check_finds_a_long_module_and_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    filler = "\n".join(f"y{i} = {i}" for i in range(MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    (tmp_path / "loop").mkdir()
    (tmp_path / "playbook").mkdir()
    (tmp_path / "loop" / "long.py").write_text(f"def long():\n{body}\n{filler}\n")
    (tmp_path / "playbook" / "short.py").write_text(f"def short():\n{body[:-len(body.splitlines()[-1]) - 1]}\n")
    assert units(tmp_path, MAX_MODULE_LINES, MAX_FUNCTION_LINES) == (
        [f"{Path('loop/long.py')}: {MAX_MODULE_LINES + 1} lines"], [f"{Path('loop/long.py')}:1 long: {MAX_FUNCTION_LINES + 1} lines"])
    assert units(tmp_path, MAX_MODULE_LINES + 1, MAX_FUNCTION_LINES + 1) == ([], [])
