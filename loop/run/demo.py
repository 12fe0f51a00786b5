"""`tileloop demo`: an included kernel copied into a fresh git repository, where the loop can run."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from loop.common.errors import UserError
from loop.common.files import SOURCE_ROOT
from loop.records import gitops


def included_kernels() -> Path:
    """The included kernels: inside the package where tileloop was installed from a wheel (`loop/kernels/`,
    package data), else the source checkout's `kernels/` (the suite; an editable install reads it there)."""
    packaged = Path(__file__).resolve().parents[1] / "kernels"
    return packaged if packaged.is_dir() else SOURCE_ROOT / "kernels"


def demo_ops() -> list[str]:
    """The included kernels with a Triton target (the demo runs it under the interpreter without a GPU)."""
    return sorted(p.parent.name for p in included_kernels().glob("*/*_triton.py"))


def make_demo_repository(op: str, where: Path | None) -> Path:
    """A new git repository (in `where`, or a new temporary folder) holding kernels/<op>/, committed."""
    source = included_kernels() / op
    if not source.is_dir():
        raise UserError(f"the demo kernel {source} is missing",
                        hint="reinstall tileloop (its wheel carries the included kernels), or run it from a source checkout")
    where = where or Path(tempfile.mkdtemp(prefix="tileloop-demo-"))
    if where.exists() and any(where.iterdir()):
        raise UserError(f"demo folder {where} is not empty")
    shutil.copytree(source, where / "kernels" / op, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {**os.environ, **gitops.FALLBACK_IDENTITY}
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", f"{op}: first version"]):
        gitops.run_git(where, *cmd, env=env)
    return where
