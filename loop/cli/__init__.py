"""Command line: `tileloop <command>`; `main(argv) -> int` so tests call it directly.

One module per command group: `lifecycle` (init, step, run, resume, demo), `target` (check, spec),
`reading` (status, history, results, report, experience), `tools` (doctor, compile, profile,
compare, decision-check), `playbook`, `suite`; `common` holds what they share. A group is imported
when one of its commands runs (or its options are parsed): `tileloop --help` imports none, `tileloop
status` only `reading`. A new command is a `Command` in LISTED here (its name, its group, its line of
`tileloop --help`), and an `add_<name>(sp)` filling its parser and a `cmd_<name>(args, settings) -> int`
in its group's PARSERS and COMMANDS.

Every command takes --json and then prints exactly one JSON object on stdout (schema
`tileloop.cli/1`, described by the JSON Schemas in `schema/`); progress goes to stderr. Every failure is one line on stderr (`error: ...`) and,
with --json, one JSON object with `error` and `hint`: a user's mistake (argparse's included) exits
2, an interruption 130, a failure of tileloop itself or of the spec in a worker 1, with its
traceback written to a log file that the line names, never to the terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import os
import sys
from types import ModuleType

from loop import __version__
from loop.cli import common
from loop.cli.common import CLI_SCHEMA, write_traceback
from loop.common import arena, files
from loop.common import settings as settings_mod
from loop.common.errors import UserError


@dataclasses.dataclass(frozen=True)
class Command:
    """A command by name: its group's module (under loop/cli) is imported only when the command runs
    or its options are parsed."""

    name: str
    group: str
    help: str

    def module(self) -> ModuleType:
        return importlib.import_module(f"loop.cli.{self.group}")

    def fill(self, sp: argparse.ArgumentParser) -> None:
        """The command's arguments and options, from its group."""
        self.module().PARSERS[self.name](sp)

    def __call__(self, args, settings) -> int:
        return self.module().COMMANDS[self.name](args, settings)


# every command, in the order `tileloop --help` lists them
LISTED = (
    Command("init", "lifecycle", "create the run branch and measure the baseline (iteration 0)"),
    Command("step", "lifecycle", "commit the working-tree edit of the target (or one recipe's candidate) and "
                                 "evaluate it (agent mode)"),
    Command("run", "lifecycle", "unattended: init, then one playbook candidate per iteration until a stop rule fires"),
    Command("resume", "lifecycle", "repair an interrupted iteration and, for unattended runs, continue the loop"),
    Command("check", "target", "validate a target and its spec without starting a run: every problem at once"),
    Command("spec", "target", "write a commented spec.py beside a target, from its entry point, to fill in"),
    Command("doctor", "tools", "GPU, driver, CUDA, torch, triton, nvtriton, cuda-tile, tileiras, ncu; per-backend availability"),
    Command("compile", "tools", "compile a target ahead of time for GPUs that are not here (no GPU needed)"),
    Command("profile", "tools", "Nsight Compute metrics of one shape and dtype, and the bottleneck class they imply"),
    Command("compare", "tools", "every implementation of an op, in every backend, against torch eager and torch.compile"),
    Command("demo", "lifecycle", "copy an included kernel into a fresh git repository and run the loop there"),
    Command("report", "reading", "sandbox/<run>/report.md and latency.png: path, backends, roofline, PyTorch"),
    Command("experience", "reading", "what worked before, across runs: list | recommend | stats"),
    Command("playbook", "playbook", "the recipes: list | show <id> | apply <id> <target> --dry-run | plan <target>"),
    Command("suite", "suite", "tune many targets unattended, one after another (run), or summarise such runs (summarize)"),
    Command("decision-check", "tools", "measure the keep/revert decision itself: A/A false keeps and the "
                                       "detection of a planted slowdown or speedup, each trial judged as an iteration"),
    Command("status", "reading", "where the run stands: best, iterations, stop state"),
    Command("history", "reading", "the run's experiments rebuilt from git alone (trailers)"),
    Command("results", "reading", "perf_results.md (or the records, with --json)"),
)
ORDER = tuple(c.name for c in LISTED)
COMMANDS = {c.name: c for c in LISTED}  # what runs each command: (args, settings) -> exit code


class UsageError(UserError):
    """A command line argparse refused: the same one line and exit code as every user error."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}", hint=f"{self.prog} --help")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command by name and help line; the options of every command, or with `only` of that
    one alone (its group's module is the only one imported)."""
    p = Parser(
        prog="tileloop",
        description="Tune one GPU kernel by disciplined experiment: one change per iteration, committed on a git "
                    "branch, checked for correctness, timed against the current best, kept or reverted by explicit rules.")
    p.add_argument("--version", action="version", version=f"tileloop {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in LISTED:
        sp = sub.add_parser(c.name, help=c.help)
        if only in (None, c.name):
            c.fill(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if a in COMMANDS), None)
    as_json = "--json" in argv
    try:
        try:
            parser = build_parser(command or "")
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
