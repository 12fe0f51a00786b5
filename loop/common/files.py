"""Files written whole or not at all: a temporary file beside the target, fsync, os.replace; with the
mode any file the user makes gets (0666 less the umask), not the temporary file's private 0600."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# the folder that holds the `loop` package: workers and child runs import this tileloop from it, and
# in a source checkout it also holds the included kernels (kernels/) the demo copies
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux), else set and
    restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~umask())
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise



SCRATCH = "tileloop-scratch-"


def scratch(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for one command's work (a probe, a check, a build), named after this
    process, so that one left by a kill -9 is removed by the next tileloop command (`sweep_scratch`)."""
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-{kind}-")


def sweep_scratch(folder: Path | None = None) -> list[Path]:
    """Remove the scratch folders of tileloop processes no longer alive; returns what was removed."""
    import shutil

    return remove_dead(Path(folder or tempfile.gettempdir()), SCRATCH, shutil.rmtree)


def remove_dead(folder: Path, prefix: str, remove) -> list[Path]:
    """Remove (`remove(path)`) the entries of `folder` named `<prefix><pid>-...` whose process is no
    longer alive; returns what was removed. What this user cannot remove, or is gone meanwhile, stays out."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        try:
            remove(folder / name)
        except OSError:  # gone meanwhile, or another user's
            continue
        removed.append(folder / name)
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
