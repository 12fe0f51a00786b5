"""A suite's best version that misses an unattended target is profiled under Nsight Compute, and the
results page quotes the profile as that row's why (`loop.suite.profiles`). No GPU here: the profile
payload is built by `loop.tools.profile` from ncu's own table of a softmax on an H200 (the fixture
tests/test_profile.py reads), and the profile command runs as the suite runs it, where it ends at
once for want of ncu or a GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loop.suite import profiles, runner, unattended
from loop.tools import ncu, profile
from test_suite_unattended import entry, final_row

FIXTURE = Path(__file__).parent / "fixtures" / "ncu" / "softmax_h200_raw.csv"
ROOT = Path(__file__).resolve().parent.parent


def payload_from_ncu() -> dict:
    """What `tileloop profile --json` prints for a profiled softmax: its kernels and their bottleneck."""
    kernels = profile.summarize(ncu.parse_raw_csv(FIXTURE.read_text()))
    return {"status": "ok", "ok": True, "shape": [4096, 16384], "dtype": "float16", "backend": "ptx",
            "gpu": "NVIDIA H200", "ncu_version": "2025.3", "stored": "sandbox/run/profile-3.json", "kernels": kernels,
            "bottleneck": {"kernel": kernels[0]["kernel"], **kernels[0]["bottleneck"]}}


def test_a_profile_is_kept_with_its_class_and_metrics_and_quoted_first_in_the_why():
    payload = payload_from_ncu()
    kept = profiles.kept(payload)
    assert kept["status"] == "ok" and kept["class"] == payload["bottleneck"]["class"]
    assert kept["metrics"]["memory_pct"] == payload["bottleneck"]["evidence"]["memory_pct"]
    text = profiles.note(kept)
    assert text.startswith(f"ncu at [4096, 16384] float16: {kept['class']}")
    assert f"memory {kept['metrics']['memory_pct']:.0f}%" in text and kept["reasons"][0] in text
    softmax = entry("softmax", "triton", [final_row("4096x16384", "float16", "0.100000", "0.120000", "0.090000", "0.80")],
                    ("4096x16384", "float16", 1e8, 2.7e8), 2, [10.0, 20.0], profile=kept,
                    roofline="0.80 of the same-run clone bandwidth")
    why = unattended.why(softmax)
    assert why.startswith(text) and "the run's lever analysis: best version at 0.80" in why
    assert "no profile recorded" not in why


def test_a_profile_that_could_not_be_made_says_why_and_claims_no_class():
    missing = profiles.kept({"status": "ncu_missing", "error": "ncu not found on PATH", "bottleneck": None})
    assert missing == {**missing, "status": "ncu_missing", "error": "ncu not found on PATH"} and "class" not in missing
    assert profiles.note(missing) == "no profile: ncu_missing: ncu not found on PATH"
    refused = profiles.kept({"error": "no GPU available: no CUDA device", "hint": "ncu profiles kernels on a GPU"})
    assert profiles.note(refused) == "no profile: error: no GPU available: no CUDA device"
    assert profiles.note(None) is None
    bare = entry("vector_add", "triton", [], ("1024", "float32", 1e3, 1.2e4), 1, [9.0])
    assert unattended.why(bare).startswith("no profile recorded")


def test_only_an_entry_with_a_target_missed_is_profiled():
    slow = entry("vector_add", "triton", [final_row("268435456", "float16", "0.400000", "0.390000", "0.380000", "0.90")],
                 ("268435456", "float16", 2.7e8, 1.6e9), 3, [20.0, 30.0, 40.0])
    fast = entry("vector_add", "cutile", [final_row("268435456", "float16", "0.370000", "0.390000", "0.380000", "0.97")],
                 ("268435456", "float16", 2.7e8, 1.6e9), 3, [20.0, 30.0, 40.0])
    unjudged = entry("vector_add", "cuda", [final_row("268435456", "float16", "0.370000", "0.390000", "n/a", "0.97")],
                     ("268435456", "float16", 2.7e8, 1.6e9), 3, [20.0, 30.0, 40.0])
    assert runner.missed_targets(slow) and runner.missed_targets(slow)[0].startswith("not met: clone 0.90")
    assert runner.missed_targets(fast) == [] and runner.missed_targets(unjudged) == []


def test_the_profile_command_is_the_one_the_suite_runs_and_its_failure_is_kept(tmp_path):
    """The command line the suite builds is one `tileloop profile` parses (shape and dtype of the final
    measurement's largest row, the run's backend); on a machine without ncu it ends with ncu_missing."""
    if shutil.which("ncu"):
        pytest.skip("ncu is installed here: the profile would run")
    slow = entry("vector_add", "triton", [final_row("4096", "float32", "0.400000", "0.390000", "0.380000", "0.90")],
                 ("4096", "float32", 4e3, 4.9e4), 1, [10.0])
    target = "kernels/vector_add/vector_add_triton.py"
    (tmp_path / "kernels").mkdir()
    shutil.copytree(ROOT / "kernels" / "vector_add", tmp_path / "kernels" / "vector_add")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    children = runner.Children()
    kept = profiles.profile_best(tmp_path, target, slow, runner.child_env(), children.popen, children.done, timeout_s=120)
    assert kept["command"][:4] == [sys.executable, "-m", "loop", "profile"]
    assert kept["command"][-6:] == ["--shape", "4096", "--dtype", "float32", "--backend", "ptx"]
    assert kept["status"] == "ncu_missing" and "ncu" in kept["error"], kept
    assert not children.live
