"""A target whose run leaves no records (its baseline does not pass, its file is no kernel) gets an
entry that says why, in the suite's output folder: on a 4x H200 a TileLang matmul whose baseline
failed to build left only its log, and the summary called it "started, no entry (killed or still
running)"."""

from __future__ import annotations

import json
import os
import subprocess

from loop.measure.launch import with_package_path
from loop.suite.runner import Children, last_error, run_one


def test_a_run_without_records_writes_an_entry_with_its_reason(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "kernels").mkdir()
    target = tmp_path / "kernels" / "not_a_kernel.py"
    target.write_text("x = 1\n")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "k"], cwd=tmp_path, check=True)
    out = tmp_path / "sandbox" / "suite"
    out.mkdir(parents=True)
    said = []
    entry = run_one(tmp_path, tmp_path, "kernels/not_a_kernel.py", out, 120.0, ["--device", "cpu"],
                    with_package_path(dict(os.environ)), Children(), said.append)
    written = json.loads((out / f"{entry['run']}.json").read_text())
    assert written == entry and entry["error"].startswith("no records (exit ")
    why = last_error(out / f"{entry['run']}.log")
    assert why and entry["error"].endswith(why) and why in said[-1]


def test_the_last_error_line_of_a_log(tmp_path):
    log = tmp_path / "r.log"
    log.write_text("[tileloop 08:07:07] probing\nerror: first\n[tileloop] more\nerror: the baseline does not pass: x\n")
    assert last_error(log) == "the baseline does not pass: x"
    log.write_text("[tileloop] nothing wrong\n")
    assert last_error(log) is None and last_error(tmp_path / "missing.log") is None
    log.write_text("error: " + "y" * 1000 + "\n")
    assert last_error(log) == "y" * 300
