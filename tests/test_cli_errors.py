"""Bad input to `tileloop init`: exit code 2, one `error:` line on stderr, and nothing touched.

Each case calls `loop.cli.main` in-process inside the `kernel_repo` fixture and compares a
snapshot of the repository (refs, HEAD, status including ignored files, every file's content)
before and after.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import copy_vector_add, git
from loop import cli
from loop.measure import probe as probe_mod

TARGET = "kernels/vector_add/vector_add_triton.py"


# ----------------------------------------------------------------------------- helpers


def snapshot(root: Path, include_exclude_file: bool = True) -> dict:
    """Everything a failed command must leave as it was."""
    snap: dict = {}
    if (root / ".git").exists():
        snap["status"] = git(root, "status", "--porcelain=v1", "--untracked-files=all", "--ignored")
        snap["refs"] = git(root, "for-each-ref", "--format=%(refname) %(objectname)")
        snap["head"] = (root / ".git" / "HEAD").read_text()
        snap["head_sha"] = git(root, "rev-parse", "HEAD")
        snap["stash"] = git(root, "stash", "list")
        exclude = root / ".git" / "info" / "exclude"
        if include_exclude_file:
            snap["exclude"] = exclude.read_text() if exclude.exists() else None
    snap["files"] = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }
    return snap


def commit_all(root: Path, message: str = "more") -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


class ReachedProbe(Exception):
    """Raised by the probe stub: the bad input was not caught before probing the environment."""


@pytest.fixture
def no_probe(monkeypatch):
    """Input errors must be refused before a worker (and a GPU second) is spent on the probe."""

    def refuse(*_args, **_kwargs):
        raise ReachedProbe("init probed the environment although its input was bad")

    monkeypatch.setattr(probe_mod, "probe_environment", refuse)


def assert_user_error(capsys, argv: list[str], *must_mention: str) -> str:
    """main(argv) returns 2, prints nothing on stdout and exactly one `error:` line on stderr."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for text in must_mention:
        assert text.lower() in lines[0].lower(), (text, lines[0])
    return lines[0]


def assert_untouched(root: Path, before: dict) -> None:
    assert snapshot(root) == before
    assert not (root / "sandbox").exists()


# ----------------------------------------------------------------------------- cases


def test_not_a_git_repository(tmp_path, clean_env, capsys, no_probe):
    work = tmp_path / "plain"
    work.mkdir()
    copy_vector_add(work)
    probe = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=work, capture_output=True, text=True)
    if probe.returncode == 0:
        pytest.skip("the temporary directory lies inside a git work tree")
    clean_env.chdir(work)
    before = snapshot(work)
    assert_user_error(capsys, ["init", TARGET, "--device", "cpu"], "git repository")
    assert not (work / ".git").exists()
    assert_untouched(work, before)


def test_tracked_changes_in_the_tree(kernel_repo, capsys, no_probe):
    spec = kernel_repo / "kernels" / "vector_add" / "spec.py"
    edited = spec.read_text() + "\n# local edit\n"
    spec.write_text(edited)
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", TARGET, "--device", "cpu"], "tracked changes", "spec.py")
    assert_untouched(kernel_repo, before)
    assert spec.read_text() == edited  # the user's work is never discarded


def test_tracked_changes_with_json_print_one_json_object(kernel_repo, capsys, no_probe):
    target = kernel_repo / TARGET
    target.write_text(target.read_text() + "\n# local edit\n")
    before = snapshot(kernel_repo)
    code = cli.main(["init", TARGET, "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    payload = json.loads(out)
    assert payload["schema"] == cli.CLI_SCHEMA and payload["command"] == "init"
    assert "tracked changes" in payload["error"]
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert_untouched(kernel_repo, before)


def test_unknown_skip_recipe(kernel_repo, capsys, no_probe):
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["run", "kernels/vector_add/vector_add_triton.py", "--device", "cpu", "--skip-recipe", "no-such"],
                      "unknown recipe 'no-such'", "launch-param")
    assert_untouched(kernel_repo, before)


def test_target_missing(kernel_repo, capsys, no_probe):
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", "kernels/vector_add/nothing_here_triton.py", "--device", "cpu"],
                      "nothing_here_triton.py", "does not exist")
    assert_untouched(kernel_repo, before)


def test_target_outside_the_repository(kernel_repo, tmp_path_factory, capsys, no_probe):
    outside = tmp_path_factory.mktemp("outside")  # not a git repository
    copy_vector_add(outside)
    target = outside / "kernels" / "vector_add" / "vector_add_triton.py"
    before, before_outside = snapshot(kernel_repo), snapshot(outside)
    assert_user_error(capsys, ["init", str(target), "--device", "cpu"], "outside the repository", str(kernel_repo))
    assert_untouched(kernel_repo, before)
    assert_untouched(outside, before_outside)
    assert not (outside / ".git").exists()


def test_target_in_another_repository_is_outside_this_one(kernel_repo, tmp_path_factory, capsys, no_probe):
    """The run's repository is the one tileloop runs in; a target in some other repository is refused."""
    other = tmp_path_factory.mktemp("other")
    git(other, "init", "-q")
    copy_vector_add(other)
    commit_all(other, "other repo")
    target = other / "kernels" / "vector_add" / "vector_add_triton.py"
    before, before_other = snapshot(kernel_repo), snapshot(other)
    assert_user_error(capsys, ["init", str(target), "--device", "cpu"], "outside the repository")
    assert_untouched(kernel_repo, before)
    assert_untouched(other, before_other)


def test_target_unparsable(kernel_repo, capsys, no_probe):
    broken = kernel_repo / "kernels" / "vector_add" / "broken_triton.py"
    broken.write_text("import triton\n\ndef run(x, y, out:\n    return out\n")
    commit_all(kernel_repo)
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", "kernels/vector_add/broken_triton.py", "--device", "cpu"],
                      "broken_triton.py", "does not parse", "line 3")
    assert_untouched(kernel_repo, before)


def test_no_spec_beside_the_target(kernel_repo, capsys, no_probe):
    lonely = kernel_repo / "kernels" / "lonely"
    lonely.mkdir()
    shutil.copy(kernel_repo / TARGET, lonely / "lonely_triton.py")
    commit_all(kernel_repo)
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", "kernels/lonely/lonely_triton.py", "--device", "cpu"], "no spec.py")
    assert_untouched(kernel_repo, before)


def test_spec_missing_a_required_name(kernel_repo, capsys, no_probe):
    spec = kernel_repo / "kernels" / "vector_add" / "spec.py"
    text, removed = re.subn(r"(?m)^TOLERANCES = .*\n", "", spec.read_text())
    assert removed == 1 and "TOLERANCES" not in text
    spec.write_text(text)
    commit_all(kernel_repo, "drop TOLERANCES")
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", TARGET, "--device", "cpu"], "missing required name", "TOLERANCES")
    assert_untouched(kernel_repo, before)


def test_existing_branch(kernel_repo, capsys, no_probe):
    git(kernel_repo, "branch", "taken")
    before = snapshot(kernel_repo)
    assert_user_error(capsys, ["init", TARGET, "--device", "cpu", "--branch", "taken"], "'taken'", "already exists")
    assert_untouched(kernel_repo, before)


def test_no_gpu_without_device_cpu(kernel_repo, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible; this case needs a CPU-only machine")
    before = snapshot(kernel_repo, include_exclude_file=False)
    code = cli.main(["init", TARGET])  # default --device cuda; this one does run the probe worker
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "--device cpu" in errors[0] and "gpu" in errors[0].lower()
    assert err.splitlines()[-1] == errors[0]
    # progress lines ("[tileloop hh:mm:ss] probing the environment") may precede the error
    assert all(line.startswith("[tileloop ") for line in err.splitlines()[:-1]), err
    assert "Traceback" not in err
    # .git/info/exclude may have gained /sandbox/ (done before the probe); nothing else may change
    assert snapshot(kernel_repo, include_exclude_file=False) == before
    assert not (kernel_repo / "sandbox").exists()


@pytest.mark.parametrize("argv, option", [
    (["init", TARGET, "--device", "tpu"], "--device"),
    (["init", TARGET, "--device", "cpu", "--target-backend", "foo"], "--target-backend"),
    (["init", TARGET, "--device", "cpu", "--time-budget", "abc"], "--time-budget"),
    (["run", TARGET, "--device", "cpu", "--max-iters", "0"], "--max-iters"),
])
def test_unknown_option_values(kernel_repo, capsys, no_probe, argv, option):
    before = snapshot(kernel_repo)
    code = cli.main(argv)  # argparse's errors follow the one error contract: a return code, no SystemExit
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert option in err and "error:" in err
    assert_untouched(kernel_repo, before)


# ----------------------------------------------------------------------------- one error contract, every command

BAD_INPUT = {  # per command: an invocation that must be refused before anything runs
    "init": ["init", "kernels/vector_add/nothing_triton.py", "--device", "cpu"],
    "step": ["step", "-m", "a change"],  # no run yet
    "run": ["run", "kernels/vector_add/nothing_triton.py", "--device", "cpu"],
    "resume": ["resume"],
    "check": ["check", "kernels/vector_add/nothing_triton.py", "--device", "cpu"],
    "spec": ["spec", "kernels/vector_add/vector_add_triton.py"],  # a spec is there already
    "doctor": ["doctor", "--verbose"],
    "compile": ["compile", "kernels/vector_add/nothing_triton.py"],
    "profile": ["profile", "kernels/vector_add/nothing_triton.py"],
    "compare": ["compare", "kernels/nothing"],
    "demo": ["demo", "--op", "nothing"],
    "report": ["report"],
    "experience": ["experience", "recommend"],
    "playbook": ["playbook", "show", "no-such-recipe"],
    "suite": ["suite", "summarize", "sandbox/nothing"],
    "decision-check": ["decision-check", "kernels/vector_add/nothing_triton.py", "--device", "cpu"],
    "status": ["status"],
    "history": ["history"],
    "results": ["results"],
}


def test_bad_input_covers_every_command():
    assert set(BAD_INPUT) == set(cli.COMMANDS) == set(cli.ORDER)


def assert_json_error(capsys, argv: list[str], code: int = 2) -> dict:
    """main(argv + --json): the exit code, exactly one JSON object on stdout (error and hint) and one
    `error:` line on stderr, no traceback anywhere."""
    rc = cli.main(argv + ["--json"])
    out, err = capsys.readouterr()
    assert rc == code, (argv, rc, out, err)
    payload = json.loads(out)  # one object: json.loads refuses anything after it
    assert payload["schema"] == cli.CLI_SCHEMA and payload["error"] and payload["hint"], payload
    assert err.splitlines()[-1].startswith("error: ") and payload["error"] in err.splitlines()[-1], err
    assert all(line.startswith("[tileloop ") for line in err.splitlines()[:-1]), err
    assert "Traceback" not in out + err
    return payload


@pytest.mark.parametrize("command", list(BAD_INPUT))
def test_every_command_refuses_bad_input_in_one_line_and_one_json_object(kernel_repo, capsys, no_probe, command):
    before = snapshot(kernel_repo)
    payload = assert_json_error(capsys, BAD_INPUT[command])
    assert payload["command"] == command
    assert_untouched(kernel_repo, before)


@pytest.mark.parametrize("command", list(BAD_INPUT))
def test_every_command_names_an_unknown_option(kernel_repo, capsys, no_probe, command):
    payload = assert_json_error(capsys, [command, "--no-such-flag"])
    assert "--no-such-flag" in payload["error"] and payload["hint"] == f"tileloop {command} --help"


def test_an_unknown_option_is_named_before_a_missing_argument(kernel_repo, capsys, no_probe):
    payload = assert_json_error(capsys, ["step", "--optimisation", "x"])
    assert "--optimisation" in payload["error"] and "did you mean --optimization" in payload["error"]
    assert cli.main(["run", TARGET, "--device", "cpu", "--max-iter", "0"]) == 2  # an abbreviation still works
    assert "--max-iters" in capsys.readouterr().err


def test_an_unknown_command_is_one_line(capsys):
    assert cli.main(["no-such-command"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "invalid choice" in err and "Traceback" not in err


def test_a_failure_of_tileloop_itself_is_one_line_with_its_traceback_in_a_log(kernel_repo, capsys, monkeypatch):
    def broken(args, settings):
        raise RuntimeError("an internal failure\nwith a second line")

    monkeypatch.setitem(cli.COMMANDS, "status", broken)
    payload = assert_json_error(capsys, ["status"], code=1)
    assert payload["error"] == "RuntimeError: an internal failure"
    log = Path(payload["log"])
    assert str(log) in payload["hint"] and "Traceback" in log.read_text() and "with a second line" in log.read_text()
