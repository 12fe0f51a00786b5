"""Command line: `tileloop <command>`; `main(argv) -> int` so tests call it directly.

One module per command group: `lifecycle` (init, step, run, resume, demo), `target` (check, spec),
`reading` (status, history, results, report, experience), `tools` (doctor, compile, profile,
compare, decision-check), `playbook`, `suite`; `common` holds what they share. A new command is an `add_<name>(sub)` parser
function and a `cmd_<name>(args, settings) -> int` in its group's PARSERS and COMMANDS, and its
name in ORDER.

Every command takes --json and then prints exactly one JSON object on stdout (schema
`tileloop.cli/1`, described by the JSON Schemas in `schema/`); progress goes to stderr. Every failure is one line on stderr (`error: ...`) and,
with --json, one JSON object with `error` and `hint`: a user's mistake (argparse's included) exits
2, an interruption 130, a failure of tileloop itself or of the spec in a worker 1, with its
traceback written to a log file that the line names, never to the terminal.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from loop import __version__
from loop.cli import common, lifecycle, playbook, reading, suite, target, tools
from loop.cli.common import CLI_SCHEMA, write_traceback
from loop.common import arena, files
from loop.common import settings as settings_mod
from loop.common.errors import UserError

GROUPS = (lifecycle, target, tools, reading, playbook, suite)
PARSERS = {name: add for group in GROUPS for name, add in group.PARSERS.items()}
COMMANDS = {name: cmd for group in GROUPS for name, cmd in group.COMMANDS.items()}
# the order `tileloop --help` lists the commands in
ORDER = ("init", "step", "run", "resume", "check", "spec", "doctor", "compile", "profile", "compare", "demo", "report", "experience",
         "playbook", "suite", "decision-check", "status", "history", "results")


class UsageError(UserError):
    """A command line argparse refused: the same one line and exit code as every user error."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}", hint=f"{self.prog} --help")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="tileloop",
        description="Tune one GPU kernel by disciplined experiment: one change per iteration, committed on a git "
                    "branch, checked for correctness, timed against the current best, kept or reverted by explicit rules.")
    p.add_argument("--version", action="version", version=f"tileloop {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ORDER:
        PARSERS[name](sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if a in COMMANDS), None)
    as_json = "--json" in argv
    try:
        try:
            parser = build_parser()
            _refuse_unknown_options(parser, command, argv)
            args = parser.parse_args(argv)
        except UsageError as exc:
            if command is not None and exc.hint == "tileloop --help":
                exc.hint = f"tileloop {command} --help"
            return _fail(as_json, command, exc.message, exc.hint, exc.exit_code)
        command = args.command
        arena.sweep()  # the shared memory a judge killed mid-measurement left (loop/common/arena.py)
        files.sweep_scratch()  # the scratch folders of a tileloop process killed mid-command
        try:
            settings = settings_mod.load()
            code = COMMANDS[command](args, settings)
            sys.stdout.flush()  # a reader that went away is seen here, not at the interpreter's exit
            return code
        except UserError as exc:
            return _fail(as_json, command, exc.message, exc.hint, exc.exit_code, **exc.details)
        except KeyboardInterrupt:
            return _fail(as_json, command, "interrupted", "tileloop resume finishes or records the iteration in flight", 130)
        except BrokenPipeError:
            raise
        except Exception as exc:  # tileloop's own failure, or the spec's in a worker: one line, the traceback in a log
            log = write_traceback(exc, args)
            return _fail(as_json, command, f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                         f"the traceback is in {log}", 1, log=str(log))
    except BrokenPipeError:  # the reader of stdout went away (tileloop ... | head): nothing left to say
        _drop_stdout()
        return 141  # as a Unix tool killed by SIGPIPE reports it (128 + 13), without a word


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that nothing more (Python's flush at exit included) writes to the
    closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): replace the object
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout for the rest of the process
    finally:
        os.close(devnull)


def _refuse_unknown_options(parser: argparse.ArgumentParser, command: str | None, argv: list[str]) -> None:
    """Name an unknown option before argparse complains about anything else (a missing argument
    would otherwise hide it), with the closest known option."""
    if command is None:
        return
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = {s for action in sub._actions for s in action.option_strings}
    for token in argv[argv.index(command) + 1:]:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        prefix_of = [k for k in known if name.startswith("--") and k.startswith(name)]  # argparse's abbreviations
        if name.startswith("-") and name not in known and len(prefix_of) != 1 \
                and not name.lstrip("-").replace(".", "", 1).isdigit():
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise UsageError(f"tileloop {command}: unknown option {name}" + (f"; did you mean {close[0]}?" if close else ""),
                             hint=f"tileloop {command} --help")


def _fail(as_json: bool, command: str | None, message: str, hint: str | None, code: int, **extra) -> int:
    hint = hint or (f"tileloop {command} --help" if command else "tileloop --help")
    if as_json:
        common.print_json({"schema": CLI_SCHEMA, "command": command, "error": message, "hint": hint, **extra})
    print(f"error: {message}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
    return code
