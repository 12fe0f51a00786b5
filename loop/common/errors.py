"""Errors that cross module boundaries: the user's (one line, a fix-it hint, exit code 2, no traceback)
and tileloop's own failures inside a worker (not the candidate's fault)."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or a state the user must fix. The CLI prints it as one line and exits 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, **details):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details  # more fields for the --json error object (e.g. every problem of a check)

    def one_line(self) -> str:
        return f"error: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class IntegrityError(UserError):
    """The working tree changed something other than the target file."""


class EnvironmentMismatch(UserError):
    """A resume was asked for on different hardware or toolchain."""


class HarnessFailure(Exception):
    """The spec or tileloop itself failed in the worker: not the candidate's fault."""


class SpecError(Exception):
    """The spec is unusable as a test (e.g. a reference so small that zeros would pass). Raised where
    the spec is read or run, in a worker or the judge; reported as `spec_error`, never as the
    candidate's failure."""
