"""The entry point a target's spec names, read from the spec's source without running it.

A spec calls the target through `ENTRY = "<function>"` (default `run`), or through an adapter
`def entry(target, **inputs)` that overrides ENTRY; for an adapter, the entry points are the
attributes it reads of its first parameter (`target.LigerRMSNormFunction.apply(...)` names
LigerRMSNormFunction). The reading is `loop.common.kernel_source.spec_entry`, the one the target's
contract checks use. The names go to `playbook.analysis.analyze(entry=...)`, which follows them
through the target's host code (playbook/cst/program.py).
"""

from __future__ import annotations

from pathlib import Path

from loop.common.kernel_source import spec_entry_of


def spec_entry(spec_source: str) -> tuple[str, ...]:
    """The names of the target that the spec calls; `("run",)` by default, `()` when an adapter
    reads nothing of the target by name, is no function of the spec's own, or the spec does not
    parse (then the target's own default applies). Read by `loop.common.kernel_source`."""
    entry = spec_entry_of(spec_source)
    return entry.names if entry is not None else ()


def entry_beside(target: Path) -> tuple[str, ...]:
    """The entry point that the spec.py beside `target` names; `()` when there is no readable spec."""
    spec = target.parent / "spec.py"
    try:
        return spec_entry(spec.read_text())
    except (OSError, UnicodeDecodeError):
        return ()
