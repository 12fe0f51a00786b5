"""The command line imports a command group when it runs it: `tileloop --help` imports no group
and no source analysis, `tileloop status` only its own group; every command listed names the
group that holds its parser and its function, and every group's command is listed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from loop import cli

GROUPS = ("lifecycle", "target", "tools", "reading", "playbook", "suite")

# main(argv) in a fresh interpreter; prints which groups (and whether libcst) were imported
PROBE = """
import json, sys
from loop.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
groups = sorted(m.removeprefix("loop.cli.") for m in sys.modules if m.startswith("loop.cli.") and m != "loop.cli.common")
print(json.dumps({"groups": groups, "libcst": "libcst" in sys.modules}), file=sys.__stderr__)
"""


def imported(argv: list[str], cwd) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    return json.loads(out.stderr.strip().splitlines()[-1])


def test_help_imports_no_command_group(tmp_path):
    assert imported(["--help"], tmp_path) == {"groups": [], "libcst": False}


@pytest.mark.parametrize(("argv", "group"), [(["status", "--json"], "reading"), (["doctor", "--help"], "tools"),
                                             (["suite", "--bogus"], "suite")])
def test_a_command_imports_its_own_group_alone(tmp_path, argv, group):
    assert imported(argv, tmp_path)["groups"] == [group]


def test_every_listed_command_is_its_groups_and_every_groups_command_is_listed():
    held = set()
    for group in GROUPS:
        module = cli.Command("", group, "").module()
        assert set(module.PARSERS) == set(module.COMMANDS), group
        held |= {(name, group) for name in module.COMMANDS}
    assert held == {(c.name, c.group) for c in cli.LISTED}
    assert list(cli.COMMANDS) == list(cli.ORDER) and len(cli.ORDER) == len(cli.LISTED)
