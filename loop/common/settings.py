"""The one place where tileloop reads the environment variables a user sets to change its own
behaviour (TILELOOP_*), parsed strictly.

Each setting has a default, a parser, and an error message that names the valid values.
Elsewhere the environment is only handed on: copied into the environment of a child process
(a worker, a judge, a harness command, a suite's tileloop), with the variables a backend sets
(TRITON_INTERPRET, ENABLE_TILE, ...: they live with the backends, `loop/backends/`; the Tile IR
hints TILEIR_ENABLE_APPROX/FTZ are handed on as the user set them, else 0), or read inside
a child for what was set there for it: the pid of the tileloop that started it
(`processes.watch_parent`), the backend's variables as its proof and in the environment fingerprint
(`worker/proof.py`, `worker/environment.py`). `tests/test_env_reads.py` holds the code to this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from loop.common.errors import UserError


def _positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{name} must be a positive number, got {raw!r}") from None
    if value <= 0:
        raise UserError(f"{name} must be a positive number, got {raw!r}")
    return value


def _bool(name: str, raw: str) -> bool:
    table = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": False}
    try:
        return table[raw.strip().lower()]
    except KeyError:
        raise UserError(f"{name} must be one of 1/0/true/false/yes/no, got {raw!r}") from None


ZYGOTE_ENV = "TILELOOP_ZYGOTE"  # 0: every kernel process a fresh interpreter of its own
PID_NAMESPACE_ENV = "TILELOOP_PID_NAMESPACE"  # 0: kernel processes share the judge's PID namespace
READ_ONLY_ENV = "TILELOOP_READ_ONLY"  # 0: a kernel process may write wherever its user may
KILL_STAGES = ("apply", "commit", "verify", "measure", "decide", "record")


@dataclass(frozen=True)
class Settings:
    worker_timeout_s: float = 600.0  # per worker process (the seed's 10-minute iteration bound)
    # TILELOOP_WORKER_TIMEOUT was given: it overrides a run's own timeout for this session
    worker_timeout_given: bool = False
    python: str = ""  # interpreter for workers; default: the one running tileloop
    keep_worker_dirs: bool = True
    # an unattended run forks each judge from one process that imported torch once (loop/judge/host.py)
    judge_host: bool = True
    # kernel processes forked by a zygote per judge (loop/worker/zygote.py), else each a fresh interpreter
    zygote: bool = True
    # kernel processes in a PID (and mount) namespace of their own, where the machine allows one
    pid_namespace: bool = True
    # a kernel process sees the machine read-only but for its own cache and a private /tmp, where its mount
    # namespace is its own (loop.common.namespaces.read_only_view)
    read_only: bool = True
    # TILELOOP_AOT_CACHE: one Triton cache for the compile gate's ahead-of-time builds, shared by runs
    # (Triton keys each build by source, options and architecture); default: each run's own folder
    aot_cache: Path | None = None
    # fault injection for tests: the orchestrator SIGKILLs itself on entering this stage
    test_kill_at: str | None = None
    # fault injection for unattended-run tests: iteration -> a file whose source replaces that candidate
    test_inject: tuple[tuple[int, str], ...] = ()


def load(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    kwargs: dict = {}
    if "TILELOOP_WORKER_TIMEOUT" in env:
        kwargs["worker_timeout_s"] = _positive_float("TILELOOP_WORKER_TIMEOUT", env["TILELOOP_WORKER_TIMEOUT"])
        kwargs["worker_timeout_given"] = True
    if env.get("TILELOOP_PYTHON"):
        kwargs["python"] = env["TILELOOP_PYTHON"]
    if "TILELOOP_KEEP_WORKER_DIRS" in env:
        kwargs["keep_worker_dirs"] = _bool("TILELOOP_KEEP_WORKER_DIRS", env["TILELOOP_KEEP_WORKER_DIRS"])
    if "TILELOOP_JUDGE_HOST" in env:
        kwargs["judge_host"] = _bool("TILELOOP_JUDGE_HOST", env["TILELOOP_JUDGE_HOST"])
    if env.get("TILELOOP_AOT_CACHE"):
        folder = Path(env["TILELOOP_AOT_CACHE"]).expanduser()
        if not folder.is_absolute():
            raise UserError(f"TILELOOP_AOT_CACHE must be an absolute folder, got {env['TILELOOP_AOT_CACHE']!r}")
        kwargs["aot_cache"] = folder
    for name, key in ((ZYGOTE_ENV, "zygote"), (PID_NAMESPACE_ENV, "pid_namespace"), (READ_ONLY_ENV, "read_only")):
        if name in env:
            kwargs[key] = _bool(name, env[name])
    if env.get("TILELOOP_TEST_KILL_AT"):
        stage = env["TILELOOP_TEST_KILL_AT"]
        if stage not in KILL_STAGES:
            raise UserError(f"TILELOOP_TEST_KILL_AT must be one of {', '.join(KILL_STAGES)}, got {stage!r}")
        kwargs["test_kill_at"] = stage
    if env.get("TILELOOP_TEST_INJECT"):
        pairs = []
        for item in env["TILELOOP_TEST_INJECT"].split(","):
            n, sep, path = item.partition(":")
            if not sep or not n.strip().isdigit() or not path.strip():
                raise UserError(f"TILELOOP_TEST_INJECT must look like 4:path/a.py,9:path/b.py, got {item!r}")
            pairs.append((int(n), path.strip()))
        kwargs["test_inject"] = tuple(pairs)
    return Settings(**kwargs)


def experience_file(environ: dict[str, str] | None = None) -> Path:
    """Where experience across runs is kept: TILELOOP_EXPERIENCE, default ~/.tileloop/experience.jsonl
    (read at each use, so that one process can be pointed elsewhere, as the tests do)."""
    env = os.environ if environ is None else environ
    return Path(env.get("TILELOOP_EXPERIENCE") or Path.home() / ".tileloop" / "experience.jsonl")
