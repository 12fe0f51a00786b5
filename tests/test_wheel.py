"""Installed, not cloned: a wheel built from this checkout carries the included kernels inside the
package (loop/kernels/, package data), installs nothing at the top level but `loop` and `playbook`
(and the `tileloop` console script), and `tileloop demo` runs from it outside any checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("loop", "playbook", "kernels", "pyproject.toml", "README.md")  # what the build reads


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built (by setuptools' PEP 517 backend, no network) from a copy of this checkout."""
    src = tmp_path_factory.mktemp("source")
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; b.build_wheel({str(out)!r})"],
                   cwd=src, check=True, capture_output=True, timeout=300)
    return next(out.glob("tileloop-*.whl"))


def test_the_wheel_carries_the_demo_kernels_and_nothing_at_the_top_level_but_its_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    ops = sorted(p.parent.name for p in (ROOT / "kernels").glob("*/*_triton.py"))
    assert "vector_add" in ops
    for op in ops:
        for f in (ROOT / "kernels" / op).glob("*.py"):
            assert f"loop/kernels/{op}/{f.name}" in names, f"the wheel lacks the included kernel file {op}/{f.name}"
    assert {n.split("/")[0] for n in names} == {"loop", "playbook", wheel.name.split("-py3")[0] + ".dist-info"}
    assert not any("__pycache__" in n for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode().split()
    assert scripts == ["[console_scripts]", "tileloop", "=", "loop.cli:main"]


def test_the_packaged_list_holds_every_package_of_the_source():
    """pyproject.toml lists the packages (so the included kernels can be mapped in as loop.kernels):
    a package added to loop/ or playbook/ and not listed would be missing from the wheel."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = find_packages(str(ROOT), include=["loop", "loop.*", "playbook", "playbook.*"])
    assert sorted(listed) == sorted(found + ["loop.kernels"])


@pytest.mark.slow  # a venv, an install and an interpreter demo run: minutes on a busy CPU
def test_tileloop_demo_runs_from_an_installed_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    # torch is large: the venv sees the system's packages (pip among them); tileloop itself comes from the wheel
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
                   check=True, capture_output=True)
    away = tmp_path / "elsewhere"  # outside the checkout: nothing of the source is importable from here
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    where = subprocess.run([str(python), "-c", "import loop, playbook; print(loop.__file__); print(playbook.__file__)"],
                           cwd=away, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert all(Path(w).is_relative_to(venv) for w in where), where
    demo = subprocess.run([str(venv / "bin" / "tileloop"), "demo", "--device", "cpu", "--max-iters", "1",
                           "--dir", str(away / "demo"), "--json"], cwd=away, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert demo.returncode == 0, demo.stderr[-3000:]
    payload = json.loads(demo.stdout)
    assert payload["repository"] == str((away / "demo").resolve()) and len(payload["records"]) == 2
    assert payload["records"][0]["correctness"] == "PASS"
    assert (away / "demo" / "kernels" / "vector_add" / "vector_add_triton.py").is_file()
