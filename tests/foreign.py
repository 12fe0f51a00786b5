"""Code this project did not write, installed from PyPI at test time (never copied into the
project): Liger-Kernel's Triton ops and TileGym's cuTile ops, as a user's repository holds them.

`installed(requirement)` pip-installs one pinned distribution, without its dependencies, into a
folder of its own under the pytest session's temporary directory (once per session) and returns
that folder; `user_repo(root, files)` makes a git repository of the given files, committed, the way
a user's project holds an op module and the spec written for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LIGER = "liger-kernel==0.8.5"
TILEGYM = "tilegym==1.5.1"

_CACHE: dict[str, Path] = {}


def installed(requirement: str, base: Path) -> Path:
    """The folder that `pip install --no-deps --target` of `requirement` filled (its packages at
    the top). Fails the test with pip's output when the install fails: a check that cannot run is
    not a pass."""
    if requirement in _CACHE:
        return _CACHE[requirement]
    dest = base / requirement.replace("==", "-").replace("[", "_").replace("]", "")
    if not dest.exists():
        tmp = dest.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                              "--disable-pip-version-check", "--target", str(tmp), requirement],
                             capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_NO_INPUT": "1"})
        if out.returncode != 0:
            raise AssertionError(f"pip install {requirement} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        tmp.rename(dest)
    _CACHE[requirement] = dest
    return dest


def git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                         cwd=root, check=True, capture_output=True, text=True)
    return out.stdout


def user_repo(root: Path, files: dict[str, str | Path]) -> Path:
    """A git repository at `root` holding `files` (relative path -> text, or a file to copy), all
    committed on one commit; returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_text(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a user's kernel and its spec")
    return root


SPECS = Path(__file__).parent / "specs"


def liger_op_repo(root: Path, liger: Path, op: str, spec: str | Path | None = None, *,
                  runnable_on_the_cpu: bool = False) -> Path:
    """A user's repository holding Liger-Kernel's op module `ops/<op>.py`, as installed (`liger` is the
    installed `liger_kernel` folder), and a spec beside it: by default this project's
    `tests/specs/liger/<op>.py`. With `runnable_on_the_cpu`, the module is rewritten at test time
    (`interpreter_runnable`) so that the Triton interpreter runs it: the specs are then checked against
    Liger's own kernels on the CPU. The op modules import `liger_kernel.ops.utils`: put
    `liger.parent` on PYTHONPATH (`liger_env`)."""
    source = (liger / "ops" / f"{op}.py").read_text()
    if runnable_on_the_cpu:
        source = interpreter_runnable(source)
    spec = SPECS / "liger" / f"{op}.py" if spec is None else spec
    return user_repo(root, {f"ops/{op}.py": source, "ops/spec.py": spec.read_text() if isinstance(spec, Path) else spec})


def interpreter_runnable(source: str) -> str:
    """A Triton module with the two constructs of Liger's kernels that the Triton interpreter cannot
    run replaced by their equivalents there: `.to()` on a scalar argument (a Python number under the
    interpreter; the cast is dropped) and libdevice's `rsqrt` (`tl.rsqrt`). Test-time only: the GPU
    runs the module unchanged."""
    import re

    source = re.sub(r"\b(eps|offset|gate_multiplier)\.to\([^()]*\)", r"\1", source)
    return re.sub(r"(?<![\w.])rsqrt\(", "tl.rsqrt(", source)


def liger_env(monkeypatch, liger: Path) -> None:
    """The worker (which inherits the environment) finds `liger_kernel`, as a user's PYTHONPATH gives it."""
    monkeypatch.setenv("PYTHONPATH", str(liger.parent) + (os.pathsep + os.environ["PYTHONPATH"]
                                                           if os.environ.get("PYTHONPATH") else ""))
