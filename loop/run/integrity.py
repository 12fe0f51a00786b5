"""The repository around an iteration: only the target may change. Checked when a change is applied
(`check_integrity`), and after kernel code ran (`changed_while_measured`), which may have written
anywhere the user can."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from loop import decide
from loop.common.errors import IntegrityError
from loop.records import gitops
from loop.run.core import Run
from loop.target.contract import imported_files


def refused_dir(run: Run) -> Path:
    """Where what an iteration refused or put back is set aside: sandbox/<run>/refused/<time>/."""
    return run.dir / "refused" / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def violations(run: Run) -> tuple[list[str], list[str]]:
    """(changed tracked files other than the target, new files the target or spec imports)."""
    others, new = gitops.integrity_violations(run.root, run.state.target, set(run.state.untracked_at_start))
    imported = imported_files(run.root, run.state.target, run.state.spec or None, new)
    if len(imported) < len(new):
        run.log(f"left alone (new files the target does not import): {', '.join(p for p in new if p not in imported)[:300]}")
    return others, imported


def check_integrity(run: Run) -> None:
    """Only the target may change. A changed tracked file, or a new file that the target (or the
    spec) imports, is refused before it runs, set aside under sandbox/<run>/refused/<time>/ (a
    patch, copies of the new files) and restored; .git/hooks, .git/info and .git/config are
    restored from the run's snapshot the same way. Other new files (notes, an editor's swap file,
    `step --json > step.json`) are the user's: left where they are, and named in the log."""
    where = refused_dir(run)
    git_files = run.restore_git_dir(where)  # plain file operations: before git reads a planted file
    others, new = violations(run)
    if not (others or new or git_files):
        return
    if others or new:
        gitops.set_aside(run.root, others, new, where)
    listed = ", ".join((others + new + git_files)[:8])
    raise IntegrityError(f"refused: the change touches files other than the target {run.state.target}: {listed}; "
                         f"they were restored, the refused change is saved in {where.relative_to(run.root)}",
                         hint="an iteration may change the target file only")


def changed_while_measured(run: Run, cand_src: str) -> decide.Decision | None:
    """Kernel code runs as the user: it could write to the repository while it is measured (the
    spec, the target, the run's records, its branch, .git's hooks or config). Everything is put
    back (what differed set aside under sandbox/<run>/refused/). The target changed is the
    candidate's doing (revert, incorrect); anything else voids the measurement: nothing says the
    candidate did it (another process may have), so nothing is charged to it."""
    where = refused_dir(run)
    git_files = run.restore_git_dir(where)  # first: before git reads a planted file
    records = run.put_records_back()
    sha = run.state.inflight.commit if run.state.inflight else None
    if sha and gitops.put_branch_back(run.root, run.state.branch, sha):
        records.append(f"branch {run.state.branch}")
    others, new = violations(run)
    target = run.state.target
    target_changed = (run.root / target).read_text() != cand_src
    if target_changed:
        others.append(target)
    if not (others or new or git_files or records):
        return None
    if others or new:
        gitops.set_aside(run.root, others, new, where)
    listed = ", ".join((others + new + git_files + records)[:8])
    saved = f"; what changed is saved in {where.relative_to(run.root)}" if where.exists() else ""
    if target_changed:
        return decide.Decision("revert", "incorrect", f"the target changed while the candidate was measured ({listed}): "
                               f"the candidate's doing (restored{saved})")
    return decide.void(f"{listed} changed while the candidate was measured: the measurement is void, "
                       f"nothing is charged to the candidate (restored{saved})")
