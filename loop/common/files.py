"""Files written whole or not at all: a temporary file beside the target, fsync, os.replace."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# the folder that holds the `loop` package: workers and child runs import this tileloop from it, and
# in a source checkout it also holds the included kernels (kernels/) the demo copies
SOURCE_ROOT = Path(__file__).resolve().parents[2]

def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

