"""Command line: `tileloop <command>`; `main(argv) -> int` so tests call it directly.

One module per command group: `lifecycle` (init, step, run, resume, demo), `reading` (status,
history, results, report, experience), `tools` (doctor, compile, profile, compare, decision-check),
`playbook`, `suite`; `common` holds what they share. A new command is an `add_<name>(sub)` parser
function and a `cmd_<name>(args, settings) -> int` in its group's PARSERS and COMMANDS, and its
name in ORDER.

Every command takes --json and then prints exactly one JSON object on stdout (schema
`tileloop.cli/1`); progress goes to stderr. A user error is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from loop import __version__
from loop.cli import lifecycle, playbook, reading, suite, tools
from loop.cli.common import CLI_SCHEMA
from loop.common import settings as settings_mod
from loop.common.errors import UserError

GROUPS = (lifecycle, tools, reading, playbook, suite)
PARSERS = {name: add for group in GROUPS for name, add in group.PARSERS.items()}
COMMANDS = {name: cmd for group in GROUPS for name, cmd in group.COMMANDS.items()}
# the order `tileloop --help` lists the commands in
ORDER = ("init", "step", "run", "resume", "doctor", "compile", "profile", "compare", "demo", "report", "experience",
         "playbook", "suite", "decision-check", "status", "history", "results")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tileloop",
        description="Tune one GPU kernel by disciplined experiment: one change per iteration, committed on a git "
                    "branch, checked for correctness, timed against the current best, kept or reverted by explicit rules.")
    p.add_argument("--version", action="version", version=f"tileloop {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ORDER:
        PARSERS[name](sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_mod.load()
        return COMMANDS[args.command](args, settings)
    except UserError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"schema": CLI_SCHEMA, "command": args.command, "error": exc.message, "hint": exc.hint}))
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: tileloop resume finishes or records the iteration in flight", file=sys.stderr)
        return 130
