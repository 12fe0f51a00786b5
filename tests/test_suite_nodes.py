"""The suite summary's rows per node and its plot of where and when each target ran, on synthetic
entries (no run, no Ray): each node's targets, wall time from its first start to its last end, GPU
and experiments; runs overlapping on one node drawn side by side; `suite summarize --json` gives
the rows and writes the plot beside its page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loop.cli import main
from loop.suite import nodes


def entry(target: str, node: str | None, started: float | None, ended: float | None, iterations: int = 2,
          device: str = "CPU (Triton interpreter)", **more) -> dict:
    """A whole suite entry as `suite run` writes one (a CPU run: no final measurement)."""
    op, stem = Path(target).parent.name, Path(target).stem
    e = {"schema": "tileloop.suite-entry/1", "run": f"suite-{stem}", "target": target, "op": op,
         "language": stem.rsplit("_", 1)[-1], "target_backend": "triton", "device": device, "timing": "interpreter",
         "baseline_ms": 2.0, "best_ms": 1.0, "best_iteration": 1, "speedup": 2.0, "largest_method": None, "methods": "",
         "largest_shape": {"shape": [1024], "dtype": "float32", "flops": 1024, "bytes": 12288},
         "largest_baseline": {}, "largest_best": {}, "final": [], "final_largest": None, "iterations": iterations,
         "outcomes": {"keep": 1, "revert": iterations - 1, "crash": 0, "unmeasured": 0},
         "median_iteration_wall_s": 1.0, "kept": ["#1 a change (2.00x)"], "stop": {"reason": "max iterations"},
         "availability": {}, "cut_off": False, "suite_wall_s": 3.0, **more}
    for key, value in (("node", node), ("started", started), ("ended", ended)):
        if value is not None:
            e[key] = value
    return e


T0 = 1_800_000_000.0  # a start time, seconds since the epoch


def suite_of_two_nodes() -> list[dict]:
    return [entry("kernels/a/a_triton.py", "n1", T0 + 10, T0 + 40, iterations=3, device="NVIDIA H100 80GB HBM3"),
            entry("kernels/b/b_triton.py", "n2", T0 + 5, T0 + 25, iterations=2, device="NVIDIA H100 80GB HBM3"),
            entry("kernels/c/c_triton.py", "n1", T0 + 41, T0 + 70, iterations=4, device="NVIDIA H100 80GB HBM3"),
            {"schema": "tileloop.suite-entry/1", "run": "suite-d-triton", "target": "kernels/d/d_triton.py", "node": "n2",
             "error": "the Ray task failed (NodeDiedError, a second time)"}]


def test_one_row_per_node_with_its_targets_wall_time_gpu_and_experiments():
    rows = {r["node"]: r for r in nodes.node_rows(suite_of_two_nodes())}
    assert [r["node"] for r in nodes.node_rows(suite_of_two_nodes())] == ["n2", "n1"]  # by first start
    n1, n2 = rows["n1"], rows["n2"]
    assert n1["targets"] == ["kernels/a/a_triton.py", "kernels/c/c_triton.py"] and n1["failed"] == []
    assert n1["wall_s"] == 60.0 and n1["experiments"] == 7 and n1["gpu"] == "NVIDIA H100 80GB HBM3"
    assert (n1["started"], n1["ended"]) == (T0 + 10, T0 + 70)
    # a failed entry counts among the node's targets, not its experiments; with no times, its wall time is unknown
    assert n2["targets"] == ["kernels/b/b_triton.py", "kernels/d/d_triton.py"] and n2["failed"] == ["kernels/d/d_triton.py"]
    assert n2["wall_s"] is None and n2["experiments"] == 2 and (n2["started"], n2["ended"]) == (T0 + 5, T0 + 25)
    page = "\n".join(nodes.markdown(nodes.node_rows(suite_of_two_nodes()), "No plot."))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in page.splitlines() if line.startswith("| n")][1:]  # the header first
    assert cells == [["n2", "NVIDIA H100 80GB HBM3", "b_triton, d_triton (failed)", "unknown", "2"],
                     ["n1", "NVIDIA H100 80GB HBM3", "a_triton, c_triton", "60", "7"]]


def test_a_cpu_run_an_unnamed_node_and_gpu_ids():
    es = [entry("kernels/a/a_triton.py", "host", T0, T0 + 3, gpu="0"),
          entry("kernels/b/b_triton.py", "host", T0 + 1, T0 + 9, gpu="1"),
          entry("kernels/c/c_triton.py", None, None, None)]  # made before entries named their node
    rows = {r["node"]: r for r in nodes.node_rows(es)}
    assert rows["host"]["gpu"] == "cpu" and rows["host"]["gpu_ids"] == ["0", "1"] and rows["host"]["wall_s"] == 9.0
    assert rows[nodes.UNNAMED]["wall_s"] is None and rows[nodes.UNNAMED]["started"] is None
    assert [r["node"] for r in nodes.node_rows(es)] == ["host", nodes.UNNAMED]  # untimed nodes last


def test_runs_overlapping_on_a_node_take_lanes_side_by_side():
    # (0,10) and (2,5) overlap: lanes 0 and 1; (5,8) starts when (2,5) ends: lane 1 again; (11,12) lane 0
    assert nodes.lanes([(0, 10), (2, 5), (5, 8), (11, 12)]) == [0, 1, 1, 0]
    # taken by start whatever the order given: (0,5) lane 0, (1,2) lane 1, (3,4) lane 1 (free again at 2)
    assert nodes.lanes([(3, 4), (0, 5), (1, 2)]) == [1, 0, 1]


def test_the_plot_is_written_or_the_page_says_why_not(tmp_path):
    path = tmp_path / "nodes.png"
    note, drawn = nodes.plot(suite_of_two_nodes(), path, "t")
    assert drawn and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert note.startswith("![where and when each target ran](nodes.png)") and "1 entries without times have no bar" in note
    note, drawn = nodes.plot([entry("kernels/a/a_triton.py", "n1", None, None)], tmp_path / "none.png", "t")
    assert not drawn and not (tmp_path / "none.png").exists() and "no entry says when its run started" in note


def test_summarize_gives_the_rows_per_node_and_writes_the_plot_beside_its_page(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "suite"
    out.mkdir()
    for e in suite_of_two_nodes():
        (out / f"{e['run']}.json").write_text(json.dumps(e))
    assert main(["suite", "summarize", "suite", "--out", "page.md", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["node"] for r in got["nodes"]] == ["n2", "n1"] and got["nodes"][1]["wall_s"] == 60.0
    assert got["plot"] == "page-nodes.png" and (tmp_path / "page-nodes.png").is_file()
    page = (tmp_path / "page.md").read_text()
    assert "## Nodes: where and when each target ran" in page and "![where and when each target ran](page-nodes.png)" in page
    # without --out, the plot goes into the suite's folder
    assert main(["suite", "summarize", "suite", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["plot"] == str(Path("suite") / "suite-nodes.png") and (out / "suite-nodes.png").is_file()


@pytest.mark.slow
def test_a_local_suite_entry_says_where_and_when_it_ran(kernel_repo, capsys):
    import socket
    import time

    before = time.time()
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--device", "cpu", "--max-iters", "1",
                 "--archs", "sm_90", "--out-dir", "out", "--json"]) == 0
    (e,) = json.loads(capsys.readouterr().out)["entries"]
    assert e["node"] == socket.gethostname() and before <= e["started"] <= e["ended"] <= time.time()
    assert main(["suite", "summarize", "out", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["nodes"][0]["targets"] == ["kernels/vector_add/vector_add_triton.py"] and got["nodes"][0]["gpu"] == "cpu"
    assert got["plot"] and (kernel_repo / got["plot"]).is_file()
