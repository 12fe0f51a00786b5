"""Git, through GitPython and the real git binary. One `Repo` per operation, always closed.

Invariants kept here: a run works on its own new branch from a clean tree; every experiment
is one commit with `Tileloop-*` trailers; the branch tip is the best kept version; rejected
experiments stay reachable under `refs/tileloop/<run>/<iteration>`; nothing else is touched.

Every git process tileloop starts goes through here (`open_repo`, `run_git`) and runs with
`safe_options`: no hook (`core.hooksPath` is the null device, below which no file can exist;
`--no-verify` alone skips only pre-commit and commit-msg), no fsmonitor command, no filter driver
(every `filter.<driver>` the configuration names has its clean, smudge and process commands
emptied), no gpg, no transport, no submodule recursion, no background gc. Kernel code runs as the
user and may plant any of these in `.git/config`, `.git/info/attributes`, `.gitattributes` or the
user's global configuration; `loop.records.git_files` puts the repository's own (`.git/hooks`,
`.git/info`, `.git/config`) back as they were when the run began.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loop.common.errors import UserError

TRAILER_PREFIX = "Tileloop-"
FALLBACK_IDENTITY = {
    "GIT_AUTHOR_NAME": "tileloop", "GIT_AUTHOR_EMAIL": "tileloop@localhost",
    "GIT_COMMITTER_NAME": "tileloop", "GIT_COMMITTER_EMAIL": "tileloop@localhost",
}


def _import_git():
    try:
        import git
    except ImportError:
        raise UserError("GitPython is not installed", hint="pip install gitpython") from None
    return git


# what a planted configuration could make git execute, switched off on every git command line
SAFE_CONFIG = (
    f"core.hooksPath={os.devnull}",  # no hook: nothing can be planted below the null device
    "core.fsmonitor=false",  # a command git runs on status, add, commit, checkout
    "core.sshCommand=false", "credential.helper=", "protocol.allow=never",  # no transport at all
    "commit.gpgSign=false", "tag.gpgSign=false", "log.showSignature=false",  # no gpg program
    "submodule.recurse=false", "status.submoduleSummary=false",  # no git run in a submodule's own configuration
    "gc.auto=0", "maintenance.auto=false",  # no background gc or maintenance after a commit
)
FILTER_COMMANDS = ("clean", "smudge", "process")  # an empty command: the driver does nothing


@functools.lru_cache(maxsize=1)
def _git_exe() -> str:
    """git as GitPython found it, resolved on PATH once: a command that changes PATH later (a test, a
    profile run with PATH narrowed to find ncu) still finds the git it started with."""
    name = _import_git().Git.GIT_PYTHON_GIT_EXECUTABLE or "git"
    return shutil.which(name) or name


def _filter_drivers(cwd: Path) -> list[str]:
    """Every filter driver the configuration seen from `cwd` names (reading configuration runs nothing)."""
    proc = subprocess.run([_git_exe(), *(a for c in SAFE_CONFIG for a in ("-c", c)), "config", "--null", "--name-only",
                           "--get-regexp", r"^filter\."], cwd=cwd, capture_output=True, text=True, timeout=60)
    names = []
    for key in proc.stdout.split("\0"):
        driver = key[len("filter."):key.rfind(".")] if key.count(".") >= 2 else ""
        if driver and driver not in names:
            names.append(driver)
    return names


def safe_options(cwd: Path) -> list[str]:
    """`-c key=value` settings for a git command run from `cwd`: no hook, fsmonitor, filter, gpg or transport."""
    settings = list(SAFE_CONFIG)
    for driver in _filter_drivers(cwd):
        if "=" in driver or "\n" in driver:
            raise UserError(f"the git configuration names a filter driver tileloop cannot switch off: {driver!r}",
                            hint="remove it (git config --get-regexp '^filter\\.' lists them) and try again")
        settings += [f"filter.{driver}.{cmd}=" for cmd in FILTER_COMMANDS] + [f"filter.{driver}.required=false"]
    return settings


def run_git(cwd: Path, *args: str, env: dict | None = None) -> str:
    """A git command outside a `Repo` (a repository being made, a worktree), with `safe_options`."""
    cmd = [_git_exe(), *(a for c in safe_options(cwd) for a in ("-c", c)), *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


@contextlib.contextmanager
def open_repo(root: Path, search_parent_directories: bool = False):
    git = _import_git()
    with git.Repo(root, search_parent_directories=search_parent_directories) as repo:
        repo.git.set_persistent_git_options(c=safe_options(Path(repo.working_tree_dir or root)))
        yield repo


def find_root(path: Path) -> Path:
    git = _import_git()
    start = path if path.is_dir() else path.parent
    if not start.exists():
        start = Path.cwd()
    try:
        with open_repo(start, search_parent_directories=True) as repo:
            if repo.bare or repo.working_tree_dir is None:
                raise UserError(f"{start} is in a bare git repository")
            return Path(repo.working_tree_dir).resolve()
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UserError(f"{start} is not inside a git repository", hint="run tileloop inside the repository that holds the kernel") from None


def root_or_folder(folder: Path) -> Path:
    """The repository that holds `folder`, or `folder` itself outside any repository (for commands
    that read a kernel where it lies: compile, check, profile, compare)."""
    try:
        return find_root(folder)
    except UserError:
        return folder


def _identity_env(repo) -> dict:
    """Commits need an identity; use the user's, else a neutral fallback (CI machines have none)."""
    reader = repo.config_reader()
    have = reader.has_option("user", "name") and reader.has_option("user", "email")
    return {} if have else FALLBACK_IDENTITY


@dataclass(frozen=True)
class TreeStatus:
    modified_tracked: tuple[str, ...]
    untracked: tuple[str, ...]


def tree_status(root: Path) -> TreeStatus:
    with open_repo(root) as repo:
        out = repo.git.status("--porcelain=v1", "-z", "--untracked-files=all")
    modified, untracked = [], []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if not entry:
            continue
        code, path = entry[:2], entry[3:]
        if code[0] in "RC":  # renames carry the source path as the next entry
            modified.append(entries[i])
            i += 1
        (untracked if code == "??" else modified).append(path)
    return TreeStatus(tuple(modified), tuple(untracked))


def require_clean(root: Path) -> None:
    status = tree_status(root)
    if status.modified_tracked:
        shown = ", ".join(status.modified_tracked[:5])
        raise UserError(f"the working tree has tracked changes ({shown})", hint="commit or stash them first; tileloop never discards your work")


def integrity_violations(root: Path, target: str, allowed_untracked: set[str]) -> tuple[list[str], list[str]]:
    """(tracked files other than the target that differ from HEAD, new untracked files)."""
    status = tree_status(root)
    others = [p for p in status.modified_tracked if p != target]
    new = [p for p in status.untracked if p not in allowed_untracked]
    return others, new


def set_aside(root: Path, tracked: list[str], untracked: list[str], where: Path) -> None:
    """Save a refused change (a patch of the tracked files, copies of new files) under `where`,
    then restore those paths: the tree is back to HEAD everywhere except the target."""
    import shutil

    where.mkdir(parents=True, exist_ok=True)
    untracked = list(untracked)
    with open_repo(root) as repo:
        if tracked:
            (where / "tracked.patch").write_text(repo.git.diff("--no-ext-diff", "--no-textconv", "HEAD", "--", *tracked) + "\n")
            in_head = set(repo.git.ls_tree("-r", "--name-only", "HEAD", "--", *tracked).splitlines())
            staged_only = [p for p in tracked if p not in in_head]  # added to the index, not in HEAD
            if staged_only:
                repo.git.rm("-q", "--cached", "--ignore-unmatch", "--", *staged_only)
                untracked += [p for p in staged_only if (root / p).exists() and p not in untracked]
            if in_head:
                repo.git.checkout("HEAD", "--", *[p for p in tracked if p in in_head])
    for rel in untracked:
        dest = where / "untracked" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(root / rel), dest)


def is_tracked(root: Path, rel: str) -> bool:
    with open_repo(root) as repo:
        return bool(repo.git.ls_files("--", rel).strip())


def git_dir(root: Path) -> str:
    with open_repo(root) as repo:
        return repo.git_dir


def git_dirs(root: Path) -> tuple[Path, Path]:
    """(the common git dir, this worktree's own git dir): the same folder outside a linked worktree."""
    with open_repo(root) as repo:
        return Path(repo.common_dir), Path(repo.git_dir)


def head_sha(root: Path) -> str:
    with open_repo(root) as repo:
        return repo.head.commit.hexsha


def current_branch(root: Path) -> str | None:
    with open_repo(root) as repo:
        return None if repo.head.is_detached else repo.active_branch.name


def branch_exists(root: Path, name: str) -> bool:
    with open_repo(root) as repo:
        return name in [h.name for h in repo.heads]


def check_branch_name(root: Path, name: str) -> None:
    git = _import_git()
    with open_repo(root) as repo:
        try:
            repo.git.check_ref_format("--branch", name)
        except git.GitCommandError:
            raise UserError(f"{name!r} is not a valid branch name") from None


def create_branch(root: Path, name: str) -> str:
    check_branch_name(root, name)
    with open_repo(root) as repo:
        repo.git.checkout("-b", name)
        return repo.head.commit.hexsha


def checkout(root: Path, name: str) -> None:
    with open_repo(root) as repo:
        repo.git.checkout(name)


def commit(root: Path, message: str, paths: list[str], allow_empty: bool = False) -> str:
    with open_repo(root) as repo:
        if paths:
            repo.git.add("--", *paths)
        args = ["--no-verify", "-q", "-F", "-"]
        if allow_empty:
            args.append("--allow-empty")
        with repo.git.custom_environment(**_identity_env(repo)):
            repo.git.commit(*args, istream=_stdin(message))
        return repo.head.commit.hexsha


def amend_message(root: Path, message: str) -> str:
    with open_repo(root) as repo:
        with repo.git.custom_environment(**_identity_env(repo)):
            repo.git.commit("--amend", "--allow-empty", "--no-verify", "-q", "-F", "-", istream=_stdin(message))
        return repo.head.commit.hexsha


def _stdin(text: str):
    """A real file for git's stdin (GitPython hands `istream` to Popen as is)."""
    import tempfile

    fh = tempfile.TemporaryFile()
    fh.write(text.encode())
    fh.seek(0)
    return fh


def reset_hard(root: Path, sha: str) -> None:
    with open_repo(root) as repo:
        repo.git.reset("--hard", "-q", sha)


def restore_file(root: Path, sha: str, rel: str) -> None:
    with open_repo(root) as repo:
        repo.git.checkout(sha, "--", rel)


def update_ref(root: Path, ref: str, sha: str) -> None:
    with open_repo(root) as repo:
        repo.git.update_ref(ref, sha)


def ref_sha(root: Path, ref: str) -> str | None:
    with open_repo(root) as repo:
        try:
            return repo.git.rev_parse("--verify", "-q", ref + "^{commit}").strip() or None
        except Exception:
            return None


def show_file(root: Path, sha: str, rel: str) -> str:
    with open_repo(root) as repo:
        return repo.git.show(f"{sha}:{rel}", strip_newline_in_stdout=False)


def commit_message(root: Path, sha: str) -> str:
    with open_repo(root) as repo:
        return repo.commit(sha).message


def parent_sha(root: Path, sha: str) -> str | None:
    with open_repo(root) as repo:
        parents = repo.commit(sha).parents
        return parents[0].hexsha if parents else None


def ensure_excluded(root: Path, pattern: str) -> None:
    """Keep tileloop's sandbox out of `git status` without touching tracked files."""
    with open_repo(root) as repo:
        try:
            repo.git.check_ignore("-q", pattern.strip("/") + "/probe")
            return
        except Exception:
            pass
        exclude = Path(repo.common_dir) / "info" / "exclude"  # shared by every worktree
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.exists() else ""
    if pattern not in text.splitlines():
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + pattern + "\n")


def delete_branch(root: Path, name: str) -> None:
    with open_repo(root) as repo:
        repo.git.branch("-D", name)


def put_branch_back(root: Path, branch: str, sha: str) -> bool:
    """HEAD on `branch` and `branch` at `sha` (after kernel code moved either); True when something moved."""
    with open_repo(root) as repo:
        ref = f"refs/heads/{branch}"
        on = repo.git.symbolic_ref("-q", "HEAD", with_exceptions=False).strip()
        at = repo.git.rev_parse("-q", "--verify", ref, with_exceptions=False).strip()
        if (on, at) == (ref, sha):
            return False
        repo.git.update_ref("-m", "tileloop: the run's branch put back", ref, sha)
        repo.git.symbolic_ref("HEAD", ref)
        return True


def clear_stale_locks(root: Path, grace_s: float = 2.0) -> list[str]:
    """Remove the lock files (index.lock, HEAD.lock) a git command left in this worktree's git dir
    when it was killed outright (SIGKILL of a run's process group mid-commit), which would fail every
    later checkout or commit with "index.lock: File exists". A lock is stale when it is still there
    after `grace_s` and no git process works in this worktree (read from /proc: its working folder);
    where /proc cannot be read, only a lock untouched for a minute is. Returns the names removed."""
    import time

    own = git_dirs(root)[1]
    locks = [own / name for name in ("index.lock", "HEAD.lock") if (own / name).exists()]
    if not locks:
        return []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(lock.exists() for lock in locks):
        time.sleep(0.1)
    left = [lock for lock in locks if lock.exists()]  # the others' git finished
    busy = _git_working_in(root.resolve()) if left else False
    removed = []
    for lock in left:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if busy is False or (busy is None and age > 60):
            lock.unlink(missing_ok=True)
            removed.append(lock.name)
    return removed


def _git_working_in(root: Path) -> bool | None:
    """Whether a live git process has its working folder in `root` (None: /proc cannot tell)."""
    proc = Path("/proc")
    if not (proc / "self" / "cwd").exists():
        return None
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            if (pid / "comm").read_text().strip() != "git":
                continue
            cwd = Path(os.readlink(pid / "cwd"))
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            return True
    return False


# ---------------------------------------------------------------- trailers


def parse_trailers(message: str) -> dict[str, str]:
    """Tileloop-* trailers of a commit message (last paragraph, `Key: value` lines)."""
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if not paragraphs:
        return {}
    out = {}
    for line in paragraphs[-1].splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.startswith(TRAILER_PREFIX):
            out[key] = value.strip()
    return out


def format_message(subject: str, body: str, trailers: dict[str, str]) -> str:
    clean = {k: " ".join(str(v).split()) for k, v in trailers.items()}
    parts = [" ".join(subject.split())]
    if body.strip():
        parts.append(body.strip())
    parts.append("\n".join(f"{k}: {v}" for k, v in clean.items()))
    return "\n\n".join(parts) + "\n"


def log_with_trailers(root: Path, revs: list[str]) -> list[tuple[str, str | None, dict[str, str]]]:
    """(sha, parent, trailers) for every commit reachable from `revs` that carries trailers."""
    with open_repo(root) as repo:
        out = []
        seen = set()
        for rev in revs:
            for c in repo.iter_commits(rev):
                if c.hexsha in seen:
                    continue
                seen.add(c.hexsha)
                t = parse_trailers(c.message)
                if t:
                    out.append((c.hexsha, c.parents[0].hexsha if c.parents else None, t))
        return out


def refs_under(root: Path, prefix: str) -> dict[str, str]:
    with open_repo(root) as repo:
        text = repo.git.for_each_ref("--format=%(refname) %(objectname)", prefix)
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())
