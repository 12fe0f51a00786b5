"""A real improvement (bigger blocks), and, while it is measured, git made to run this file's
commands inside every later `tileloop step`: hooks that `--no-verify` does not skip (post-commit,
post-rewrite, reference-transaction, post-checkout, prepare-commit-msg) in .git/hooks and in a
hooksPath of its own, an fsmonitor command, and a filter driver for every file. Each one leaves a
`hook-ran-<what>` file at the repository's root if git ever runs it."""

import os
from pathlib import Path

import triton
import triton.language as tl

BLOCK = 1024
NUM_WARPS = 1


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


def _repository() -> Path | None:
    for folder in Path(__file__).resolve().parents:
        if (folder / ".git").is_dir():
            return folder
    return None


def _script(path: Path, what: str, root: Path, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch '{root}/hook-ran-{what}'\n{tail}")
    path.chmod(0o755)


_root = _repository()
if _root is not None:
    _git = _root / ".git"
    for _hook in ("post-commit", "post-rewrite", "reference-transaction", "post-checkout", "prepare-commit-msg",
                  "pre-commit", "post-index-change"):
        _script(_git / "hooks" / _hook, _hook, _root)
        _script(_git / "info" / "hooks" / _hook, f"{_hook}-in-hooks-path", _root)
    _script(_git / "info" / "fsmonitor", "fsmonitor", _root, "exit 1\n")
    with open(_git / "config", "a") as _fh:
        _fh.write(f"[core]\n\thooksPath = {_git / 'info' / 'hooks'}\n\tfsmonitor = {_git / 'info' / 'fsmonitor'}\n"
                  f"[filter \"tidy\"]\n\tclean = sh -c \"touch '{_root}/hook-ran-clean'; cat\"\n"
                  f"\tsmudge = sh -c \"touch '{_root}/hook-ran-smudge'; cat\"\n")
    with open(_git / "info" / "attributes", "a") as _fh:
        _fh.write("* filter=tidy\n")
    os.environ.pop("GIT_DIR", None)
