"""Shared fixtures: a throw-away git repository holding the vector_add kernel, a copy of a reference
op with a rewritten target, a clean environment for workers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
VECTOR_ADD = Path(__file__).parent.parent / "kernels" / "vector_add"

# tileloop is not necessarily installed; make `import loop` work from a plain `pytest` run too.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# git settings of the developer's machine must not leak into the temporary repositories.
GIT_ENV_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES")
TILELOOP_ENV_VARS = ("TILELOOP_WORKER_TIMEOUT", "TILELOOP_PYTHON", "TILELOOP_KEEP_WORKER_DIRS")


def git(root: Path, *args: str) -> str:
    """Run git in `root` with an argument list (never a shell) and return its stdout."""
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                         cwd=root, check=True, capture_output=True, text=True)
    return out.stdout


def section(source: str, start: str, end: str) -> str:
    """The text of `source` from `start` up to (not including) the next `end` after it."""
    i = source.index(start)
    return source[i:source.index(end, i + len(start))]


def materialise(root: Path, op: str, lang: str, source: str, **spec_values) -> Path:
    """A copy of kernels/<op>/ at root/<op> with `source` as its target <op>_<lang>.py and, for
    each keyword, that top-level assignment of its spec.py replaced (DTYPES=[...],
    CORRECTNESS_SHAPES=[...]); returns the target's path."""
    folder = root / op
    shutil.copytree(REPO_ROOT / "kernels" / op, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = folder / "spec.py"
    for name, value in spec_values.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", spec.read_text(), count=1, flags=re.M)
        assert n == 1, f"{name} is not a one-line assignment in {op}/spec.py"
        spec.write_text(text)
    target = folder / f"{op}_{lang}.py"
    target.write_text(source)
    return target


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No tileloop overrides from the outside (worker timeout, python, interpreter), cwd tmp_path."""
    for name in ("TILELOOP_WORKER_TIMEOUT", "TILELOOP_PYTHON", "TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def copy_vector_add(dest_root: Path) -> Path:
    dest = dest_root / "kernels" / "vector_add"
    shutil.copytree(VECTOR_ADD, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.fixture
def clean_env(monkeypatch):
    for name in GIT_ENV_VARS + TILELOOP_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def kernel_repo(tmp_path, clean_env):
    """tmp_path as a git repository with kernels/vector_add committed; the cwd for the test."""
    git(tmp_path, "init", "-q")
    copy_vector_add(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "vector_add")
    clean_env.chdir(tmp_path)
    assert os.getcwd() == str(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def _private_experience(tmp_path_factory, monkeypatch):
    """Experience entries from tests go to a temporary file, never to the user's home."""
    monkeypatch.setenv("TILELOOP_EXPERIENCE", str(tmp_path_factory.mktemp("experience") / "experience.jsonl"))


@pytest.fixture(scope="session", autouse=True)
def _shared_aot_cache(tmp_path_factory):
    """The compile gate's ahead-of-time builds share one Triton cache for the whole test session
    (TILELOOP_AOT_CACHE), under pytest's own temporary folder (both xdist workers of one session name
    the same one; pytest removes old sessions' folders): the tests build the same few kernels for
    sm_90 in dozens of runs, and Triton keys each build by source, options and architecture. A value
    set from outside stands."""
    if "TILELOOP_AOT_CACHE" in os.environ:
        yield
        return
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "aot-cache"
    folder.mkdir(exist_ok=True)
    os.environ["TILELOOP_AOT_CACHE"] = str(folder)
    try:
        yield
    finally:
        os.environ.pop("TILELOOP_AOT_CACHE", None)


@pytest.fixture(autouse=True)
def _private_temporary_folder(tmp_path_factory, monkeypatch):
    """A test's temporary files (a failure's traceback log outside a run, a child's scratch folders) go
    to a folder of its own under pytest's, never to the system's temporary folder."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setattr(tempfile, "tempdir", folder)


@pytest.fixture
def writable_by_kernels(tmp_path) -> Path:
    """A folder a kernel process can write where it sees the machine read-only
    (`loop.common.namespaces.read_only_view`): one of its own under /dev/shm, which stays writable
    there (the judge's CPU arenas), else `tmp_path`. For a probe that reports back through a file."""
    import shutil
    import uuid

    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    folder = Path("/dev/shm") / f"tileloop-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def liger_kernel(tmp_path_factory) -> Path:
    """The folder holding Liger-Kernel's `liger_kernel` package, installed from PyPI for this session."""
    from foreign import LIGER, installed

    return installed(LIGER, tmp_path_factory.getbasetemp()) / "liger_kernel"


@pytest.fixture(scope="session")
def tilegym(tmp_path_factory) -> Path:
    """The folder holding TileGym's `tilegym` package, installed from PyPI for this session."""
    from foreign import TILEGYM, installed

    return installed(TILEGYM, tmp_path_factory.getbasetemp()) / "tilegym"


@pytest.fixture(autouse=True)
def json_contract(monkeypatch):
    """Every JSON object the CLI prints in a test is checked against its schema (loop/cli/schema/,
    tests/cli_schema.py): a test whose outputs drift from their schema fails, whatever it asserts."""
    import loop.cli.common as cli_common
    from cli_schema import Observer

    observer, printer = Observer(), cli_common.print_json

    def checked(obj: dict) -> None:
        observer(obj)
        printer(obj)

    monkeypatch.setattr(cli_common, "print_json", checked)
    yield observer
    assert not observer.failures, "\n".join(observer.failures)


# The slow tier's longest tests (over a minute each on a two-core CI machine), started first: a long
# test picked up last keeps one worker busy while the other has nothing left; started first, the short
# tests fill in around them. The slow tier runs with `--dist loadgroup` (.ci/run): each test (or
# xdist_group) goes to whichever worker is free, a few at a time, in this order. (`--dist load` would
# hand the first eighth of the collection to one worker at the start, all of these on the same one.)
LONGEST_FIRST = (
    "test_decision_check.py::test_cpu_",  # with the module fixture cpu_check's other user, so it is made once
    "test_decision_check.py::test_every_json_field_is_documented",
    "test_suite_cmd.py::test_a_killed_suite_resumes_each_run_where_it_stopped",
    "test_faults.py::test_cpu_faults_through_the_loop",
    "test_recipes_cutile_autotune.py::test_every_config_compiles_ahead_of_time_for_hopper_and_blackwell[matmul]",
    "test_adversaries.py::test_no_adversary_is_kept_under_the_interpreter",
    "test_suite_cmd.py::test_a_run_cut_off_by_per_run_goes_on_with_resume",
    "test_agent.py::test_every_skill_command_runs",
    "test_agent.py::test_scripted_agent_session",
    "test_suite_cmd.py::test_a_killed_one_gpu_suite_resumes_from_the_run_branch_it_left",
    "test_e2e_cpu.py::test_unattended_run_and_resume",
    "test_suite_cmd.py::test_suite_on_several_gpus_uses_one_worktree_per_gpu",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        for i, name in enumerate(LONGEST_FIRST):  # startswith: a grouped test's nodeid ends in `@group`
            if item.nodeid.endswith(name) or item.nodeid.split("/")[-1].startswith(name):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
