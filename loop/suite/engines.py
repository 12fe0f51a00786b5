"""The seam between a suite and whatever runs its targets: `SuiteCall` (what one `suite run` asks
for, checked once by the runner) and the `Engine` interface an engine implements. The runner owns
the checks, the records' places and the entries' form; an engine owns only where and when each
target's run happens: `runner.LocalEngine` on this host (one target after another in the
repository, or one per GPU in git worktrees), `ray_engine.RayEngine` on a Ray cluster. Another
engine (a batch scheduler, say) implements `Engine.run` and leaves the loop as it is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class SuiteCall:
    """One `suite run`, checked: the repository, the commit every run starts from, the targets in
    order, where entries go, the per-run limit and the arguments each `tileloop run` gets."""

    root: Path
    start_branch: str  # the branch the suite started from (the runs' origin)
    start_sha: str  # its commit: every run's branch starts here
    targets: tuple[str, ...]
    out_dir: Path
    per_run_s: float | None
    extra: tuple[str, ...]  # passed to each `tileloop run` (--device, --archs, --max-iters)
    resume: bool
    killed_here: str | None  # with --resume, the target whose killed one-GPU run left the repository on its branch
    log: Callable[[str], None]
    profile: bool = True  # an Nsight Compute profile of each best version that misses a target (on a GPU)

    @property
    def device(self) -> str:
        """The device each run is given (`--device`), cuda unless the call says otherwise."""
        extra = list(self.extra)
        return extra[extra.index("--device") + 1] if "--device" in extra else "cuda"


class Engine(Protocol):
    """Runs a suite's targets; one entry per target that ran (or was found finished), in the
    call's order. Each run's branch, its `refs/tileloop/<run>/...` and its records end up in the
    repository (or a worktree of it) as a local run leaves them; entries are written to `out_dir`."""

    name: str

    def run(self, call: SuiteCall, children) -> list[dict]:
        """Run every target of `call`; `children` kills this host's child processes on SIGTERM."""
        ...
