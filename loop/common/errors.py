"""Errors that cross module boundaries: the user's (one line, a fix-it hint, exit code 2, no traceback),
tileloop's own failures inside a worker (not the candidate's fault), and the kernel's failure, the
same type on both sides of the kernel process's boundary."""

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


class KernelFailure(Exception):
    """A failure of kernel code, as data: the implementation `label` (candidate, incumbent, a
    reference) failed at what it was asked, typed by `status` (compile_error, runtime_error, oom,
    incorrect, uncorroborated, ...). Raised in the worker where kernel code is called; the kernel
    process sends it to the judge as `wire()`, the judge raises it again (its own findings about the
    process too), and a job's result file carries it as `result()`."""

    def __init__(self, status: str, label: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.label, self.message, self.detail = status, label, message, detail

    def wire(self) -> dict:
        """The `failure` of a kernel process's answer."""
        return {"status": self.status, "label": self.label, "message": self.message, "detail": self.detail}

    def result(self) -> dict:
        """The fields of a job's result that name the failure and the implementation that failed."""
        return {"status": self.status, "failed_impl": self.label, "message": self.message, "detail": self.detail}
