"""Without a GPU: `tileloop check` checks what needs none (make_inputs and the reference on the CPU,
the spec's contract, the build) and says in one line that the kernel itself was not run, why, and
the command that runs it; `init`/`run` of a cuTile target name what works here instead of a
suggestion that is then refused. No GPU is assumed absent: the worker's CUDA probe is stubbed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import loop.target.check as target_check  # noqa: E402
from conftest import REPO_ROOT, git  # noqa: E402
from loop.cli import main  # noqa: E402
from loop.measure import probe  # noqa: E402
from loop.worker import check_job  # noqa: E402


@pytest.fixture
def no_gpu(monkeypatch):
    """The check job in this process, on a machine whose torch sees no CUDA device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:  # the check job of a cuTile target wraps cuTile's compile: put back after the test
        from cuda.tile import _execution
        monkeypatch.setattr(_execution.kernel, "_compile", _execution.kernel._compile)
    except ImportError:
        pass

    def in_process(workdir, job, backend, settings, cache, name=""):
        assert job["device"] == "cuda" and job["mode"] == "check"
        return {"status": "ok", **check_job.check_job(job)}

    monkeypatch.setattr(target_check, "run_worker", in_process)
    return monkeypatch


def op_copy(tmp_path: Path, op: str, lang: str) -> Path:
    """kernels/<op> copied, checked at two small shapes."""
    folder = tmp_path / op
    shutil.copytree(REPO_ROOT / "kernels" / op, folder, ignore=shutil.ignore_patterns("__pycache__"))
    spec = folder / "spec.py"
    text = spec.read_text()
    start = text.index("CORRECTNESS_SHAPES = ")
    spec.write_text(text[:start] + "CORRECTNESS_SHAPES = [(1, 7), (5, 33)]" + text[text.index("\n", start):])
    return folder / f"{op}_{lang}.py"


def check_json(capsys, target: Path) -> tuple[int, dict]:
    code = main(["check", str(target), "--archs", "none", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("lang, runs_it", [("triton", "--device cpu runs it under the Triton interpreter"),
                                           ("cutile", "on a machine with a GPU runs it")])
def test_check_without_a_gpu_checks_the_spec_and_says_the_kernel_was_not_run(no_gpu, tmp_path, capsys, lang, runs_it):
    if lang == "cutile":
        pytest.importorskip("cuda.tile")
    target = op_copy(tmp_path, "softmax", lang)
    code, out = check_json(capsys, target)
    assert code == 0 and out["ok"] and out["problems"] == [], out["problems"]
    (first, *_) = out["warnings"]
    assert first["what"].startswith("the kernel itself was not run: ")
    assert ("no GPU is visible here" if lang == "triton" else "cuTile kernels run on a GPU only") in first["what"]
    assert f"tileloop check {target}" in first["hint"] and runs_it in first["hint"]
    assert not any("bfloat16 is not checked" in w["what"] for w in out["warnings"])  # torch runs bf16 on the CPU
    main(["check", str(target), "--archs", "none"])
    assert capsys.readouterr().out.strip().endswith("passes every check that needs no GPU; the kernel itself was not run")


def test_the_spec_is_still_checked_without_a_gpu(no_gpu, tmp_path, capsys):
    """make_inputs and the reference run on the CPU at every dtype: their failures, and a reference an
    all-zero output would pass, are found without a GPU."""
    target = op_copy(tmp_path, "softmax", "triton")
    spec = target.parent / "spec.py"
    spec.write_text(spec.read_text() + "\n\ndef reference(x, out):\n    return torch.softmax(x, -1) * 1e-9\n")
    code, out = check_json(capsys, target)
    assert code == 2
    assert any("an all-zero output would pass the comparison" in p["what"] and "bfloat16" in p["what"]
               for p in out["problems"]), out["problems"]
    assert out["warnings"][0]["what"].startswith("the kernel itself was not run")


def test_run_and_init_of_a_cutile_target_without_a_gpu_name_what_works_here(kernel_repo, monkeypatch, capsys):
    shutil.copytree(REPO_ROOT / "kernels" / "softmax", kernel_repo / "kernels" / "softmax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git(kernel_repo, "add", "-A")
    git(kernel_repo, "commit", "-qm", "softmax")
    monkeypatch.setattr(probe, "probe_environment", lambda root, settings: {"cuda_available": False,
                                                                           "cuda_reason": "no CUDA device is visible"})
    target = "kernels/softmax/softmax_cutile.py"
    for argv in (["run", target], ["init", target], ["init", target, "--device", "cpu"]):
        assert main([*argv, "--json"]) == 2
        out = json.loads(capsys.readouterr().out)
        assert "a cuTile target runs on a GPU only" in out["error"], out
        assert "--device cpu" not in out["hint"]  # never a suggestion that is then refused
        for works in (f"tileloop check {target}", f"tileloop compile {target} --arch sm_90,sm_100",
                      f"tileloop playbook plan {target}"):
            assert works in out["hint"]
    assert main(["init", "kernels/vector_add/vector_add_triton.py", "--json"]) == 2  # Triton: the interpreter works
    assert "pass --device cpu" in json.loads(capsys.readouterr().out)["hint"]
    assert git(kernel_repo, "branch", "--list", "tileloop/*") == ""
