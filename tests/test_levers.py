"""Big levers first: where the best version's distance to its roofline is measured, the playbook
offers the variable that bounds a kernel far from it (tile or block size, warps, occupancy) before
hints worth a few percent; without a measurement the static order stands unchanged."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

from loop.decide.rules import Policy
from loop.records.results import BackendResult, Record
from loop.run import levers
from playbook.analysis import HINT_GAIN, LEVER_SHARE, REMEASURE_OVER, Experiment, Learned, analyze
from playbook.base import experiment, ranked, ranked_experiments

# A user's cuTile element-wise kernel written with small 1-D tiles and no tuning of its own.
SMALL_TILES = '''
import cuda.tile as ct
import torch

TILE = 256


@ct.kernel
def scale_kernel(x, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    a = ct.load(x, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=a * 2.0)


def run(x, out):
    n = out.numel()
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(n, TILE), 1, 1), scale_kernel, (x, out, TILE))
    return out
'''


def _first(src: str, headroom: float | None, skip=("cutile-autotune",), learned=()):
    an = dataclasses.replace(analyze(src), headroom=headroom, learned=learned)
    return ranked(src, an, (), (), skip)


def test_far_from_the_roofline_the_tile_size_comes_before_hints():
    static = _first(SMALL_TILES, None)
    measured = _first(SMALL_TILES, 0.6)
    assert static[0].kind == "store-tma"  # the static table: the store path first (the order that stopped a run at 1.01x)
    assert measured[0].kind == "block" and measured[0].title.startswith("TILE 256 ->")
    hints = [i for i, c in enumerate(measured) if c.kind in ("store-tma", "latency")]
    levers_at = [i for i, c in enumerate(measured) if c.kind in ("block", "occupancy")]
    assert max(levers_at) < min(hints)


def test_without_a_measured_headroom_the_static_order_is_unchanged():
    src = open("kernels/softmax/softmax_triton.py").read()
    an = analyze(src)
    order = an.priority()
    got = ranked(src, an, (), ())
    static = sorted(got, key=lambda c: (c.tier, order.index(c.kind) if c.kind in order else len(order)))
    assert [c.key for c in got] == [c.key for c in static]


def test_at_the_roofline_a_hint_can_come_before_a_small_lever():
    an = dataclasses.replace(analyze(SMALL_TILES), headroom=0.995)
    assert an.expected_gain("store-tma") == math.log1p(HINT_GAIN)
    assert an.expected_gain("occupancy") < an.expected_gain("store-tma")
    far = dataclasses.replace(an, headroom=0.5)
    assert far.expected_gain("occupancy") > far.expected_gain("store-tma")
    assert far.expected_gain("block") == LEVER_SHARE["block"] * math.log(2)


def test_experience_of_the_lane_moves_a_kind():
    never_kept = (Learned("block", tries=8, kept=0, log_gain_kept=0.0),)
    first = _first(SMALL_TILES, 0.6, learned=never_kept)[0]
    assert first.kind != "block"  # eight tries, none kept: below the occupancy lever now
    an = dataclasses.replace(analyze(SMALL_TILES), headroom=0.6, learned=never_kept)
    assert "0 of 8 kept" in an.order_reason("block")


def _record(fracs: dict[tuple, float], iteration: int = 0) -> Record:
    label = "baseline" if iteration == 0 else "candidate"
    shapes = [{"shape": list(s), "dtype": "bfloat16", "bytes": s[0] * s[1] * 4, "clone_gbps": 2900.0,
               label: {"median_ms": 1.0, "frac_clone_bw": f}} for s, f in fracs.items()]
    res = BackendResult("cutile", True, "ok", "", 1.0, None, "PASS", "gpu", None, shapes)
    return Record(run="r", iteration=iteration, optimization="baseline", status="keep", correctness="PASS", latency_ms=1.0,
                  target_backend="cutile", backends={"cutile": res}, commit="c", parent="p", hypothesis="", env={},
                  source_hash="h", started="", finished="", wall_s=0.0)


def test_the_roofline_is_read_at_the_largest_shape():
    where = levers.roofline(_record({(1024, 1024): 0.9, (16384, 16384): 0.61, (4096, 4096): 0.8}), "cutile")
    assert where.fraction == 0.61 and "[16384, 16384]" in where.basis and "2900 GB/s" in where.basis
    over = levers.roofline(_record({(16384, 16384): 1.13}, iteration=3), "cutile")
    assert over.fraction == 1.0 and "above 1" in over.basis
    assert levers.roofline(_record({(8, 8): 0.5}), "ptx") is None  # another backend's record: nothing measured
    cpu = _record({(8, 8): 0.5})
    cpu.backends["cutile"].shapes[0]["baseline"].pop("frac_clone_bw")
    assert levers.roofline(cpu, "cutile") is None


def test_playbook_plan_prints_the_order_and_its_reason(tmp_path):
    target = tmp_path / "scale_cutile.py"
    target.write_text(SMALL_TILES)
    out = subprocess.run([sys.executable, "-m", "loop", "playbook", "plan", str(target), "--roofline-fraction", "0.6",
                          "--json"], capture_output=True, text=True, cwd=tmp_path, check=True)
    plan = json.loads(out.stdout)["plan"]
    assert plan["roofline"]["fraction"] == 0.6 and plan["why"].startswith("by expected gain")
    kinds = [o["kind"] for o in plan["order"]]
    assert kinds.index("block") < kinds.index("store-tma")
    assert plan["order"][0]["lever"] is True and "expected" in plan["order"][0]["reason"]
    static = subprocess.run([sys.executable, "-m", "loop", "playbook", "plan", str(target), "--json"],
                            capture_output=True, text=True, cwd=tmp_path, check=True)
    assert json.loads(static.stdout)["plan"]["roofline"] is None


MATMUL = '''
import triton
import triton.language as tl


@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def run(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    mm_kernel[(triton.cdiv(M, 64), triton.cdiv(N, 64))](a, b, c, M, N, K, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    return c
'''


def test_a_dot_kernel_is_not_ordered_by_the_clone_bandwidth():
    # a matmul moves few bytes for its FLOPs: its fraction of the clone bandwidth (0.04 on an H100) is no
    # headroom, and ordering by it promised 14x from an autotune; the clone is the roofline of the others only
    assert levers.memory_bound(analyze(SMALL_TILES))
    assert not levers.memory_bound(analyze(MATMUL))


def _dot_record(fracs: dict[tuple, float], iteration: int = 0) -> Record:
    """A dot kernel's record: each shape's fraction of the device's matmul rate, as the judge writes it."""
    label = "baseline" if iteration == 0 else "candidate"
    rate = {"tflops": 700.0, "median_ms": 1.57, "n": 8192, "dtype": "bfloat16", "method": "cuda_graph"}
    shapes = [{"shape": list(s), "dtype": "bfloat16", "flops": 2.0 * s[0] * s[1] * s[2], "bytes": 2.0 * (s[0] * s[2] + s[2] * s[1] + s[0] * s[1]),
               "clone_gbps": 2900.0, "matmul": rate, label: {"median_ms": 1.0, "frac_clone_bw": 0.04, "frac_matmul": f}}
              for s, f in fracs.items()]
    res = BackendResult("ptx", True, "ok", "", 1.0, None, "PASS", "gpu", None, shapes)
    return Record(run="r", iteration=iteration, optimization="baseline", status="keep", correctness="PASS", latency_ms=1.0,
                  target_backend="ptx", backends={"ptx": res}, commit="c", parent="p", hypothesis="", env={},
                  source_hash="h", started="", finished="", wall_s=0.0)


def test_a_dot_kernel_reads_its_headroom_off_the_devices_matmul_rate():
    rec = _dot_record({(4096, 4096, 4096): 0.5, (8192, 8192, 8192): 0.27, (4095, 4097, 4096): 0.2})
    where = levers.roofline(rec, "ptx", compute=True)
    assert where.fraction == 0.27 and "[8192, 8192, 8192]" in where.basis  # the largest by flops, not by bytes
    assert "matmul rate (700 TFLOP/s, torch.matmul 8192^3 bfloat16, same run)" in where.basis
    assert levers.roofline(rec, "ptx").fraction == 0.04  # the clone, where the caller asks for it
    over = levers.roofline(_dot_record({(8192, 8192, 8192): 1.2}, iteration=2), "ptx", compute=True)
    assert over.fraction == 1.0 and "above 1" in over.basis
    rec.backends["ptx"].shapes[1].pop("matmul")  # no rate measured at the largest: the next one by flops
    assert "[4096, 4096, 4096]" in levers.roofline(rec, "ptx", compute=True).basis
    assert levers.roofline(_record({(8, 8): 0.5}), "cutile", compute=True) is None  # a record without a matmul rate


def test_far_from_the_matmul_rate_a_dot_kernels_order_is_by_expected_gain():
    where = levers.roofline(_dot_record({(8192, 8192, 8192): 0.27}), "ptx", compute=True)
    an = levers.with_levers(analyze(MATMUL), where, "ptx", None)
    payload = levers.order_payload(ranked_experiments(MATMUL, an, (), ()), an, where)
    assert payload["why"].startswith("by expected gain") and "matmul rate" in payload["why"]
    assert payload["roofline"]["fraction"] == 0.27 and payload["order"][0]["lever"] is True


# Gain per second: the order of the suite of 2026-11-28, where 13 of 16 runs spent their whole limit inside
# a first exhaustive autotune. Triton vector_add at 0.30 of its roofline printed: autotune (12 configs)
# 2.62x; BLOCK 128 -> 256 (a sweep of 4 values) 2.32x; NUM_WARPS 1 -> 2 1.62x; ...; the eviction hint.
VECTOR_ADD = "kernels/vector_add/vector_add_triton.py"


def _measured(path: str, headroom: float, skip=()):
    src = open(path).read()
    an = dataclasses.replace(analyze(src), headroom=headroom)
    return an, ranked(src, an, (), (), skip)


def test_a_cheap_sweep_of_the_bounding_lever_comes_before_the_exhaustive_autotune():
    an, pool = _measured(VECTOR_ADD, 0.3)
    kinds = [c.kind for c in pool]
    first, tune = pool[0], pool[kinds.index("autotune")]
    assert first.kind == "block" and first.sweep is not None  # the sweep of the bounding parameter
    assert an.expected_gain("autotune") > an.expected_gain("block")  # the autotune promises more ...
    assert an.expected_seconds("autotune", experiment(tune)) > an.expected_seconds("block", experiment(first))
    assert kinds.index("block") < kinds.index("autotune") < kinds.index("eviction")  # the hint after both
    assert experiment(first) == Experiment(len(first.sweep.values), swept=True)
    assert experiment(tune) == Experiment(tune.configs) and f"({tune.configs} configs" in tune.title


def test_the_order_names_the_expected_seconds_and_the_reason():
    an, pool = _measured(VECTOR_ADD, 0.3)
    costed = ranked_experiments(open(VECTOR_ADD).read(), an, (), ())
    assert [c for c, _ in costed] == pool and all(cost == experiment(c) for c, cost in costed)
    payload = levers.order_payload(costed, an, levers.Roofline(0.3, "0.30 of the same-run clone bandwidth"))
    assert payload["why"].startswith("by expected gain per expected second")
    for entry, cand in zip(payload["order"], pool):
        seconds = an.expected_seconds(cand.kind, experiment(cand))
        assert f"expected {an.expected_speedup(cand.kind):.2f}x in ~{seconds:.0f} s (" in entry["reason"]
    assert "a sweep of 4 values, then the best alone" in payload["order"][0]["reason"]
    assert any(line.startswith("  1. BLOCK") and "lever: expected to close 70% of the gap" in line
               for line in levers.order_text(payload))
    static = levers.order_payload(costed, analyze(open(VECTOR_ADD).read()), None)
    assert all(o["reason"].startswith("static order") and " s (" in o["reason"] for o in static["order"])


def test_the_order_costs_each_candidate_by_the_experiment_it_was_ranked_by():
    """`order_payload` reads each candidate's experiment from the pool it is given (the one `ranked`
    placed it by), not from a second reckoning of its own."""
    an, pool = _measured(VECTOR_ADD, 0.3)
    first = pool[0]
    given = Experiment(7, swept=True)
    assert given != experiment(first)
    [entry] = levers.order_payload([(first, given)], an, levers.Roofline(0.3, "0.30"))["order"]
    assert entry["reason"] == an.order_reason(first.kind, given) and "a sweep of 7 values" in entry["reason"]


def test_the_autotune_comes_first_when_it_is_the_only_lever():
    for headroom in (0.3, 0.05):  # at 0.05 it promises over 3x and is charged a second measurement
        an, pool = _measured(VECTOR_ADD, headroom, skip=("launch-param", "triton-persistent"))
        assert [c.kind for c in pool] == ["autotune", "eviction"]
    assert an.expected_speedup("autotune") > REMEASURE_OVER
    assert "twice" in an.order_reason("autotune", experiment(pool[0]))


def test_near_the_roofline_a_hint_comes_before_an_exhaustive_autotune():
    an, pool = _measured(VECTOR_ADD, 0.95)
    kinds = [c.kind for c in pool]
    assert kinds.index("eviction") < kinds.index("autotune")  # a few percent in seconds beats a few percent in minutes
    far = [c.kind for c in _measured(VECTOR_ADD, 0.3)[1]]
    assert far.index("eviction") > far.index("autotune")


def test_the_cost_model_reproduces_its_calibration():
    # 4x H200, suite of 2026-11-28: a one-line hint ~7-15 s, a 4-value sweep ~35-50 s (with the best measured
    # again alone), an exhaustive autotune of 9-30 configs 60-190 s
    assert 7 <= Experiment().seconds() <= 15
    assert 35 <= Experiment(4, swept=True).seconds() <= 50
    assert 55 <= Experiment(9).seconds() < Experiment(30).seconds() <= 190
    # a claim over the rules' suspicious threshold is measured again: the autotune twice, a sweep's best alone twice
    assert REMEASURE_OVER == Policy().suspicious
    assert Experiment(12).seconds(REMEASURE_OVER + 0.5) == 2 * Experiment(12).seconds(REMEASURE_OVER)
    assert Experiment(4, True).seconds(REMEASURE_OVER + 0.5) - Experiment(4, True).seconds() == Experiment().seconds()


def test_a_sweep_whose_values_were_tried_is_charged_as_one_version():
    an, pool = _measured(VECTOR_ADD, 0.3)
    block = pool[0]
    assert experiment(block, tried=[v.key for v in block.sweep.values[1:]]) == Experiment(1)
    left = experiment(block, tried=[block.sweep.values[-1].key])
    assert left == Experiment(len(block.sweep.values) - 1, swept=True)


def test_a_cutile_autotune_is_charged_the_configs_of_the_runs_architecture():
    src = open("kernels/vector_add/vector_add_cutile.py").read()
    sizes = {}
    for arch in ("sm_90", "sm_100", None):
        an = dataclasses.replace(analyze(src, arch=arch), headroom=0.3)
        sizes[arch] = next(c for c in ranked(src, an, (), ()) if c.kind == "autotune").configs
    assert sizes["sm_90"] != sizes["sm_100"] and sizes[None] == max(sizes["sm_90"], sizes["sm_100"])
    title = next(c for c in ranked(src, analyze(src), (), ()) if c.kind == "autotune").title
    assert f"{sizes['sm_90']} configs on sm_90" in title and f"{sizes['sm_100']} on sm_100" in title
