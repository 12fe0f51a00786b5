"""The entry point a target's spec names, read from the spec's source without running it.

A spec calls the target through `ENTRY = "<function>"` (default `run`), or through an adapter
`def entry(target, **inputs)` that overrides ENTRY; for an adapter, the entry points are the
attributes it reads of its first parameter (`target.LigerRMSNormFunction.apply(...)` names
LigerRMSNormFunction). The names go to `playbook.analysis.analyze(entry=...)`, which follows them
through the target's host code (playbook/cst/program.py).
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from playbook.cst.program import DEFAULT_ENTRY, refs


def spec_entry(spec_source: str) -> tuple[str, ...]:
    """The names of the target that the spec calls; `("run",)` by default, `()` when an adapter
    reads nothing of the target by name (then the target's own default applies)."""
    try:
        module = cst.parse_module(spec_source)
    except cst.ParserSyntaxError:
        return ()
    adapter = next((s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == "entry"), None)
    if adapter is not None:
        ps = [*adapter.params.posonly_params, *adapter.params.params]
        if not ps:
            return ()
        target = ps[0].name.value
        return tuple(sorted({attr for base, attr in refs(adapter.body).attrs if base == target}))
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if (isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == "ENTRY"
                                                          for t in small.targets)
                        and isinstance(small.value, cst.SimpleString)):
                    return (str(small.value.evaluated_value),)
    return (DEFAULT_ENTRY,)


def entry_beside(target: Path) -> tuple[str, ...]:
    """The entry point that the spec.py beside `target` names; `()` when there is no readable spec."""
    spec = target.parent / "spec.py"
    try:
        return spec_entry(spec.read_text())
    except (OSError, UnicodeDecodeError):
        return ()
