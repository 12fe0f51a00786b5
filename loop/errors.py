"""User-facing errors: one line, a fix-it hint, a non-zero exit code, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or a state the user must fix. The CLI prints it as one line and exits 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"error: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class IntegrityError(UserError):
    """The working tree changed something other than the target file."""


class EnvironmentMismatch(UserError):
    """A resume was asked for on different hardware or toolchain."""
