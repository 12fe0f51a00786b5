"""Where TileLang comes from: the installed distribution's version, whether what `import tilelang` needs
is there, and the install that brings it (read by `tileloop doctor` and by the tests that skip
without it). Found without importing TileLang (an import takes seconds and starts its TVM)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

INSTALL_HINT = "pip install -e '.[tilelang]'"
PINNED = "0.1.15"  # the version tileloop is tested with (its autotuner changed in 0.1.11, its API in 0.1.13)
# the modules `import tilelang` imports beyond torch and numpy: its FFI, its solver, and two helpers
NEEDS = ("tilelang", "tvm_ffi", "z3", "psutil", "tqdm")


def version() -> str | None:
    """The installed tilelang distribution's version; None where it is not installed."""
    try:
        return importlib.metadata.version("tilelang")
    except importlib.metadata.PackageNotFoundError:
        return None


def missing() -> list[str]:
    """The modules `import tilelang` needs that cannot be found here."""
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


def status() -> dict:
    """{version, importable, reason}: reason says what is missing and what installs it (None when nothing)."""
    found = version()
    lacking = missing()
    if found is None:
        return {"version": None, "importable": False, "reason": f"not installed: {INSTALL_HINT}"}
    if lacking:
        return {"version": found, "importable": False,
                "reason": f"tilelang {found} cannot be imported: {', '.join(lacking)} not found ({INSTALL_HINT})"}
    other = f" (tileloop is tested with {PINNED})" if found != PINNED else ""
    return {"version": found, "importable": True, "reason": None if not other else other.strip(" ()")}


def line() -> str:
    """doctor's line: TileLang's version and the targets a run's architectures map to, or why it cannot
    be imported and what installs it."""
    found = status()
    if not found["importable"]:
        return f"tilelang:       {found['reason']}"
    tested = "" if found["reason"] is None else f"; {found['reason']}"
    return f"tilelang:       {found['version']}, importable (builds for sm_90a, sm_100a from sm_90, sm_100{tested})"
