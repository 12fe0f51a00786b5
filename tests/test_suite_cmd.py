"""`tileloop suite run|summarize` on a CPU run (interpreter): entries agree with the run's records,
the summary shows them, bad input is refused."""

from __future__ import annotations

import json

import pytest

from loop.cli import main
from loop.records import Record


def test_suite_run_then_summarize(kernel_repo, capsys):
    target = "kernels/vector_add/vector_add_triton.py"
    assert main(["suite", "run", target, "--device", "cpu", "--max-iters", "1", "--archs", "sm_90",
                 "--out-dir", "out", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    (entry,) = payload["entries"]
    recs = [Record.from_json(json.loads(line)) for line in (kernel_repo / "out" / "suite-vector-add-triton-results.jsonl").read_text().splitlines()]
    best = next(r for r in reversed(recs) if r.status == "keep")
    assert entry["baseline_ms"] == recs[0].latency_ms and entry["best_ms"] == best.latency_ms
    assert entry["iterations"] == len(recs) - 1 == 1
    assert entry["target_backend"] == "interpreter" and entry["device"].startswith("CPU")
    assert entry["largest_shape"]["shape"] == max((s["shape"] for s in recs[0].backends["interpreter"].shapes), key=lambda s: s[0])
    # the suite leaves the repository on the branch it started from, with the run on its own branch
    from tests.conftest import git
    assert git(kernel_repo, "rev-parse", "--abbrev-ref", "HEAD").strip() in ("main", "master")
    assert "tileloop/suite-vector-add-triton" in git(kernel_repo, "branch", "--list")
    best_src = (kernel_repo / "out" / "suite-vector-add-triton-best.py").read_text()
    assert best_src == git(kernel_repo, "show", f"{best.commit}:{target}")
    for name in ("report.md", "latency.png", "perf_results.md"):
        assert (kernel_repo / "out" / f"suite-vector-add-triton-{name}").is_file()

    assert main(["suite", "summarize", "out", "--out", "suite.md"]) == 0
    text = (kernel_repo / "suite.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| vector_add"))
    assert f"{recs[0].latency_ms:.6f}" in row and f"{best.latency_ms:.6f}" in row and "triton/interpreter" in row
    assert "CPU (Triton interpreter)" in text


def test_suite_refuses_bad_input(kernel_repo, capsys):
    assert main(["suite", "run", "kernels/nope.py", "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["suite", "summarize", "kernels"]) == 2
    assert "no suite entries" in capsys.readouterr().err
    (kernel_repo / "kernels" / "vector_add" / "spec.py").write_text("# edited\n")
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--device", "cpu"]) == 2
    assert "uncommitted changes" in capsys.readouterr().err


def test_largest_shape_prefers_bytes():
    from loop.suite import largest

    shapes = [{"shape": [4096, 4096], "bytes": 10.0}, {"shape": [2048, 16384], "bytes": 20.0}, {"shape": [8192, 1024], "bytes": 20.0}]
    assert largest(shapes)["shape"] == [2048, 16384]
    assert largest([]) is None


def test_suite_per_run_must_be_positive(kernel_repo, capsys):
    with pytest.raises(SystemExit):
        main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--per-run", "-3"])
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--per-run", "0"]) == 2
    assert "--per-run must be positive" in capsys.readouterr().err
