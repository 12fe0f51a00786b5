"""The environment is read in one place: `loop/common/settings.py` reads every variable a user sets
to change tileloop (TILELOOP_*); any other module that touches os.environ is listed here with what it
does with it (hands it on to a child process, or reads inside a child what was set there for it).
A new read elsewhere fails until it goes through settings, or is listed with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT
from loop.common import settings

SETTINGS = "loop/common/settings.py"
# module -> what it does with the environment (none of them reads a setting of tileloop's)
HANDED_ON = {
    "loop/common/processes.py": "a child reads TILELOOP_PARENT_PID, set for it by the tileloop that started it",
    "loop/measure/launch.py": "a worker's or judge's environment: the caller's, with its backend's variables",
    "loop/measure/external.py": "a harness command's environment: the caller's, without bytecode or pytest caches",
    "loop/suite/runner.py": "a suite's child tileloop: the caller's environment, this tileloop importable",
    "loop/suite/ray_cluster.py": "RAY_ADDRESS, Ray's own variable: join the cluster it names rather than start one; "
                                 "a local cluster's workers' PYTHONPATH: the driver's, after this tileloop's",
    "loop/run/demo.py": "the demo repository's git commands: the caller's environment and a fallback identity",
    "loop/judge/host.py": "a forked judge takes the environment of the request it serves",
    "loop/judge/fork.py": "a kernel process's environment: the judge's, with the pid of its judge",
    "loop/judge/kernel_process.py": "a kernel process's environment: the judge's, with the pid of its judge",
    "loop/worker/proof.py": "the interpreter backend's proof: TRITON_INTERPRET=1 in force in this worker",
    "loop/worker/environment.py": "the Tile IR variables in force in this worker, for the environment fingerprint",
    "loop/worker/aot.py": "TRITON_INTERPRET removed before an ahead-of-time build in this worker",
    "loop/worker/tilelang_build.py": "TileLang's own cache folder and default target, set in a kernel process "
                                     "before TileLang is imported there",
    "loop/common/namespaces.py": "TMPDIR set in a read-only kernel process or confined worker to its private "
                                 "scratch tmpfs, for the compilers it starts; the confined worker's cache folders "
                                 "(Triton's, cuTile's, TileLang's), kept writable",
    "loop/worker/serve.py": "cuTile's and torch inductor's cache folders set in a kernel process to its own, before "
                            "either is imported there",
    "loop/tools/doctor.py": "the isolation probe's child: the caller's environment, this tileloop importable",
    "loop/tools/campaign.py": "the L2 sizing's child (a spec's make_inputs): the caller's environment, this tileloop importable",
}
CHILD_PROTOCOL = {"TILELOOP_PARENT_PID"}  # set by tileloop for its children, never by a user


def touches_environment(tree: ast.AST) -> list[int]:
    """Lines that use os.environ, os.getenv/putenv/unsetenv, or import them from os."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "environb", "getenv", "putenv", "unsetenv") for a in node.names):
            lines.append(node.lineno)
    return lines


def tileloop_names(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.startswith("TILELOOP_") and n.value.rstrip("_").replace("_", "").isalnum()
            and n.value.upper() == n.value}


def sources():
    for folder in ("loop", "playbook"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            yield path.relative_to(REPO_ROOT).as_posix(), ast.parse(path.read_text())


def test_only_settings_reads_tileloop_variables_and_every_other_reader_is_listed():
    unlisted, settings_read = [], []
    for rel, tree in sources():
        lines = touches_environment(tree)
        if rel == SETTINGS or not lines:
            continue
        if rel not in HANDED_ON:
            unlisted.append(f"{rel}:{lines[0]}")
        read = tileloop_names(tree) - CHILD_PROTOCOL
        if read:
            settings_read.append(f"{rel}: {', '.join(sorted(read))}")
    assert not unlisted, ("the environment is read outside loop/common/settings.py: route the read through "
                          f"settings, or list the module in HANDED_ON with what it does: {unlisted}")
    assert not settings_read, f"a TILELOOP_ variable is read outside loop/common/settings.py: {settings_read}"


def test_the_scan_sees_each_way_of_reading_the_environment():
    for code in ("import os\nx = os.environ.get('TILELOOP_X')", "import os\nx = os.getenv('A')",
                 "from os import environ\n", "import os\nif 'A' in os.environ: pass"):
        assert touches_environment(ast.parse(code)), code
    assert not touches_environment(ast.parse("template = \"os.environ.get('DISABLE_CUTILE_TUNE')\"\n"))
    assert tileloop_names(ast.parse("'TILELOOP_WORKER_TIMEOUT' in env")) == {"TILELOOP_WORKER_TIMEOUT"}


def test_the_settings_tileloop_reads_elsewhere_go_through_settings(tmp_path):
    assert settings.load({"TILELOOP_WORKER_TIMEOUT": "5"}).worker_timeout_given
    assert not settings.load({}).worker_timeout_given
    where = tmp_path / "exp.jsonl"
    assert settings.experience_file({"TILELOOP_EXPERIENCE": str(where)}) == where
    assert settings.experience_file({}) == Path.home() / ".tileloop" / "experience.jsonl"
