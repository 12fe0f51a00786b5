"""`cutile-autotune`: the rewrite (golden), its search spaces, what it refuses, the tuned wrapper's
behaviour on the CPU (cuda.tile's launch and exhaustive_search replaced by recorders that run a
torch model of the kernel), its coordination with cutile-hint, and (slow) ahead-of-time compilation
of every config of the space for sm_90 and sm_100 through `tileloop compile`.

cuTile kernels cannot run without a GPU, so what the tuned kernels compute is checked on a GPU by
the loop itself; here the host logic around them is: keys, caching, scratch buffers, the launch of
the chosen config, ties, CUDA-graph capture.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import cuda.tile as ct
import pytest
import torch

import playbook
from playbook.cutile import autotune as ca
from playbook.analysis import analyze
from tests.conftest import materialise

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
CUTILE_OPS = sorted(p.parent.name for p in KERNELS.glob("*/*_cutile.py"))


def src(op: str) -> str:
    return (KERNELS / op / f"{op}_cutile.py").read_text()


def cands(source: str):
    return playbook.get("cutile-autotune").candidates(source, analyze(source))


def tuned_source(op: str) -> str:
    (c,) = cands(src(op))
    return c.source


def load(tmp_path: Path, source: str, name: str = "tuned_target"):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- golden

SOFTMAX_TUNED = '''\
"""softmax in cuTile, first version: one row per block, the whole row as one tile, default
occupancy, no autotune."""

import os

import cuda.tile as ct
import torch


def next_power_of_2(n):
    return 1 << (n - 1).bit_length()


@ct.kernel
def softmax_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF)
    tile = ct.astype(tile, ct.float32)
    row_max = ct.max(tile, axis=1, keepdims=True)
    num = ct.exp(tile - row_max)
    den = ct.sum(num, axis=1, keepdims=True)
    ct.store(out, index=(row, 0), tile=ct.astype(num / den, out.dtype))


# cutile-autotune: run() launches softmax_kernel with the best config of _TUNE_SPACES for its input
# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The
# first config of each space is the kernel as it was. "sm_100": sm_100/sm_103; "sm_90": other GPUs.
_TUNE_SPACES = {
    "sm_90": [{"occupancy": occupancy}
              for occupancy in (None, 1, 2, 3, 4, 5, 6, 7, 8)],
    "sm_100": [{"occupancy": occupancy}
               for occupancy in (None, 1, 2, 3, 4, 6, 8, 12, 16)],
}
_TUNE_WRITES = (1,)  # run() arguments the kernel writes (out): tuned on scratch copies
_TUNED = {}  # input key -> (config, kernel with the config's hints)


def _tune_space():
    major, _ = torch.cuda.get_device_capability()
    return _TUNE_SPACES["sm_100" if major == 10 else "sm_90"]


def _scratch(value):
    """A copy of a tensor in new memory with the same layout (anything else as it is)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _tuned(*args):
    """(config, kernel with its hints) for run(*args): tuned on the first call with a new input key
    (shapes, dtypes, strides and devices of the tensors, values of the scalars), cached after."""
    key = tuple((tuple(a.shape), a.dtype, a.stride(), a.device) if isinstance(a, torch.Tensor)
                else a if isinstance(a, (bool, int, float, str, type(None))) else type(a).__name__ for a in args)
    if key not in _TUNED:
        _TUNED[key] = _autotune(args)
    return _TUNED[key]


def _autotune(args):
    space = _tune_space()
    if os.environ.get("DISABLE_CUTILE_TUNE") == "1":  # TileGym convention: the first config, no tuning trials
        cfg = space[0]
    else:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("run() met a new input key during CUDA-graph capture, where it cannot tune: "
                               "call it once with inputs of these shapes before capturing")
        tune_args = tuple(_scratch(a) if i in _TUNE_WRITES else a for i, a in enumerate(args))

        def part(i):
            return lambda cfg: _launch_plan(cfg, *tune_args)[i]

        result = ct.tune.exhaustive_search(space, torch.cuda.current_stream(), part(0), part(1), part(2),
                                           hints_fn=part(3), quiet=True)
        best = result.best
        # within the timing noise (the two 95% margins, or 2%) a config ties with the best; the
        # earliest tie wins (the kernel as it was first), so the pick does not flip between runs
        ties = [m for m in result.successes
                if m.mean_us - best.mean_us <= max(m.error_margin_us + best.error_margin_us, 0.02 * best.mean_us)]
        cfg = min(ties, key=lambda m: space.index(m.config)).config
    _, kernel, _, hints = _launch_plan(cfg, *args)
    return cfg, kernel.replace_hints(**hints)


def _launch_plan(cfg, x, out):
    """grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""
    rows, cols = x.shape
    return ((rows, 1, 1), softmax_kernel, (x, out, next_power_of_2(cols)),
            {hint: cfg[hint] for hint in ("occupancy", "num_ctas") if hint in cfg})


def run(x, out):
    cfg, kernel = _tuned(x, out)
    grid, _, args, _ = _launch_plan(cfg, x, out)
    ct.launch(torch.cuda.current_stream(), grid, kernel, args)
    return out
'''


def test_softmax_exact():
    (c,) = cands(src("softmax"))
    assert c.source == SOFTMAX_TUNED
    assert (c.recipe, c.kind, c.key, c.tier) == ("cutile-autotune", "autotune", "cutile-autotune:softmax_kernel", 0)
    assert c.title == "softmax_kernel: ct.tune.exhaustive_search over occupancy (9 configs on sm_90, 9 on sm_100)"
    assert "occupancy only" in c.hypothesis and "ties" in c.hypothesis


def test_matmul_plan_reads_the_tiles_from_the_config_and_the_constants_go():
    source = tuned_source("matmul")
    plan = source[source.index("def _launch_plan"):source.index("def run")]
    assert plan.splitlines()[:7] == [
        "def _launch_plan(cfg, a, b, out):",
        '    """grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""',
        '    TILE_M, TILE_N, TILE_K = cfg["TILE_M"], cfg["TILE_N"], cfg["TILE_K"]',
        "    M, K = a.shape",
        "    N = b.shape[1]",
        "    grid = (ct.cdiv(M, TILE_M), ct.cdiv(N, TILE_N), 1)",
        "    return (grid, matmul_kernel, (a, b, out, TILE_M, TILE_N, TILE_K),",
    ]
    for name in ("TILE_M = 64", "TILE_N = 64", "TILE_K = 32"):
        assert name not in source.splitlines()  # nothing reads the module constants any more
    assert "_TUNE_WRITES = (2,)  # run() arguments the kernel writes (out)" in source


def spaces_of(tmp_path, op):
    return load(tmp_path, tuned_source(op), op)._TUNE_SPACES


def test_spaces_of_the_reference_kernels(tmp_path):
    va = spaces_of(tmp_path, "vector_add")
    assert va["sm_90"] == [{"TILE": t, "occupancy": o} for t in (128, 64, 256, 512) for o in (None, 1, 2, 4, 8)]
    assert va["sm_100"] == [{"TILE": t, "occupancy": o} for t in (128, 256, 512, 1024) for o in (None, 1, 2, 4, 8, 16)]
    mm = spaces_of(tmp_path, "matmul")
    # the current tile, the large GEMM tiles, then each dimension doubled and all doubled
    tiles = [(64, 64, 32), (128, 256, 64), (256, 128, 64), (128, 64, 32), (64, 128, 32), (64, 64, 64), (128, 128, 64)]
    assert mm["sm_90"] == [{"TILE_M": m, "TILE_N": n, "TILE_K": k, "occupancy": o}
                           for m, n, k in tiles for o in (None, 1, 2)]  # MMA: occupancy 1-2 (4 and 8 spill)
    assert mm["sm_100"] == [{"TILE_M": m, "TILE_N": n, "TILE_K": k, "occupancy": o, "num_ctas": c}
                            for m, n, k in tiles for o in (None, 1) for c in (None, 2)]  # 7 x 2 x 3 > 30: ctas trimmed
    for op in ("softmax", "layernorm", "rmsnorm"):  # whole-row tiles: occupancy only
        sp = spaces_of(tmp_path, op)
        assert sp["sm_90"] == [{"occupancy": o} for o in (None, *range(1, 9))]
        assert [c["occupancy"] for c in sp["sm_100"]] == [None, 1, 2, 3, 4, 6, 8, 12, 16]


@pytest.mark.parametrize("op", CUTILE_OPS)
def test_every_space_is_a_bounded_list_starting_at_the_current_config(op, tmp_path):
    original = ca.module_int_constants(ca.parse(src(op)))
    for arch, configs in spaces_of(tmp_path, op).items():
        assert isinstance(configs, list) and 1 < len(configs) <= ca.MAX_CONFIGS, (arch, len(configs))
        assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)  # no config twice
        first = configs[0]
        assert first["occupancy"] is None and first.get("num_ctas") is None  # the decorator leaves both unset
        assert all(first[k] == original[k] for k in first if k not in ca.HINTS)
        assert ("num_ctas" in first) == (arch == "sm_100" and op in ("matmul", "attention"))
        for c in configs:
            tiles = [v for k, v in c.items() if k not in ca.HINTS]
            hi = ca.ROW_LOOP_TILE_MAX if op == "row_sum" else ca.ARCHS[arch].tiles[1]  # row_sum walks its row in tiles
            assert all(v & (v - 1) == 0 and 16 <= v <= hi for v in tiles)
        if op == "row_sum":
            assert {c["TILE"] for c in configs} >= {128, 1024, 4096}


def test_a_row_loop_widens_the_tile_range_only_for_one_tile_without_mma():
    hopper = ca.ARCHS["sm_90"]
    assert ca.arch_for(hopper, False) is hopper
    wide = ca.arch_for(hopper, True)
    assert wide.tiles == (hopper.tiles[0], ca.ROW_LOOP_TILE_MAX) and wide.occupancy == hopper.occupancy
    s = ca.space(wide, {"TILE": 128}, None, None, mma=False)
    assert s.tiles[0] == (128,) and max(t[0] for t in s.tiles) == ca.ROW_LOOP_TILE_MAX and len(s) <= ca.MAX_CONFIGS


def test_space_budget_trims_occupancy_first_then_ctas_then_tiles():
    bw = ca.ARCHS["sm_100"]
    s = ca.space(bw, {"A": 64, "B": 64, "C": 32}, None, None, mma=True)
    assert len(s) == 30 and s.occupancy == (None, 1) and s.num_ctas == (None, 2, 4) and len(s.tiles) == 5
    s = ca.space(bw, {"A": 64, "B": 64, "C": 32, "D": 16, "E": 16}, 2, None, mma=True)  # 7 tiles
    assert s.occupancy == (2, 1) and s.num_ctas == (None, 2) and len(s) <= 30 and s.tiles[0] == (64, 64, 32, 16, 16)
    s = ca.space(ca.ARCHS["sm_90"], {"TILE": 128}, 4, 2, mma=True)  # the current value stays first, no ctas on Hopper
    assert s.occupancy == (4, 1, 2) and s.num_ctas == () and s.tiles[0] == (128,)
    s = ca.space(ca.ARCHS["sm_90"], {"TILE": 128}, 4, 2, mma=False)
    assert s.occupancy == (4, 1, 2, 8) and s.num_ctas == ()
    s = ca.space(ca.ARCHS["sm_90"], {"BLOCK_K": 32, "BLOCK_M": 64, "BLOCK_N": 64}, None, None, mma=True)
    assert s.tiles[:3] == ((32, 64, 64), (64, 128, 256), (64, 256, 128))  # GEMM tiles placed by name, after the current
    assert ca.space(ca.ARCHS["sm_90"], {"A": 64, "B": 64, "C": 32}, None, None, mma=True).tiles == \
        ((64, 64, 32), (128, 64, 32), (64, 128, 32), (64, 64, 64), (128, 128, 64))  # no M/N/K names: no GEMM tiles


# --------------------------------------------------------------------------- what is (not) a knob

ROWS_KERNEL = '''\
import cuda.tile as ct
import torch

ROWS = 4
TILE_N = 1024


@ct.kernel
def scale_kernel(x, out, ROWS: ct.Constant[int], TILE_N: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0), 0), shape=(ROWS, TILE_N), padding_mode=ct.PaddingMode.ZERO)
    ct.store(out, index=(ct.bid(0), 0), tile=t * 2)


def run(x, out):
    rows, cols = x.shape
    assert cols <= TILE_N
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(rows, ROWS), 1, 1), scale_kernel, (x, out, ROWS, TILE_N))
    return out
'''


def test_a_tile_covering_the_whole_row_stays_fixed_and_rows_per_block_is_tuned(tmp_path):
    pat = ca.recognise(ca.parse(ROWS_KERNEL.replace("ROWS = 4", "ROWS = 16")))
    assert pat.knobs == {"ROWS": 16} and "TILE_N" in pat.fixed and "whole axis" in pat.fixed["TILE_N"]
    (c,) = cands(ROWS_KERNEL.replace("ROWS = 4", "ROWS = 16"))
    assert "fixed: TILE_N" in c.hypothesis
    module = load(tmp_path, c.source)
    assert module.TILE_N == 1024  # still read by the wrapper (and left alone)
    assert {cfg["ROWS"] for cfg in module._TUNE_SPACES["sm_90"]} == {16, 64, 128, 256, 512}
    # ROWS = 4 is below 16: not a tile-size constant at all
    assert ca.recognise(ca.parse(ROWS_KERNEL)).knobs == {}


def test_constants_read_outside_the_wrapper_or_not_constant_params_are_fixed():
    other = ROWS_KERNEL.replace("ROWS = 4", "ROWS = 16") + "\n\ndef rows_per_block():\n    return ROWS\n"
    assert ca.recognise(ca.parse(other)).fixed["ROWS"].startswith("read outside run")
    plain = ROWS_KERNEL.replace("ROWS = 4", "ROWS = 16").replace("ROWS: ct.Constant[int]", "ROWS: int")
    assert "not a ct.Constant" in ca.recognise(ca.parse(plain)).fixed["ROWS"]


SKIPS = [
    ("    ct.launch(", "    out.zero_()\n    ct.launch(", "does more than compute launch arguments"),
    ("    assert cols <= TILE_N\n", "    assert cols <= TILE_N\n    y = out.fill_(0)\n", "in place (fill_)"),
    ("    return out\n", "    ct.launch(torch.cuda.current_stream(), (1, 1, 1), scale_kernel, (x, out, ROWS, TILE_N))\n"
     "    return out\n", "2 ct.launch calls"),
    ("    return out\n", "    return rows\n", "does more after the launch"),
    ("import torch\n", "import torch as th\n", "needs `import torch`"),
    ("def run(x, out):", "def run(x, *, out):", "keyword-only"),
    ("def run(x, out):", "def run(x, grid):", "named grid"),
    ("(x, out, ROWS, TILE_N))", "(x, out, ROWS))", "3 launch arguments for 4 kernel parameters"),
    ("    ct.launch(", "    if rows:\n        ct.launch(", "not a statement of its own"),
]


@pytest.mark.parametrize("old,new,why", SKIPS, ids=[s[2] for s in SKIPS])
def test_skips_what_it_cannot_rewrite_safely(old, new, why):
    source = ROWS_KERNEL.replace(old, new)
    assert source != ROWS_KERNEL
    assert cands(source) == []
    assert why in playbook.get("cutile-autotune").skip_reason(source, analyze(source))


def test_an_autotuned_target_is_not_tuned_again():
    tuned = tuned_source("vector_add")
    assert cands(tuned) == []
    assert playbook.get("cutile-autotune").skip_reason(tuned, analyze(tuned)).startswith("already autotuned")


def test_applies_to_every_reference_cutile_kernel_and_no_triton_one():
    for op in CUTILE_OPS:
        assert len(cands(src(op))) == 1, op
    for path in KERNELS.glob("*/*_triton.py"):
        source = path.read_text()
        assert playbook.get("cutile-autotune").candidates(source, analyze(source)) == []


# --------------------------------------------------------------------------- the tuned wrapper on the CPU


class Recorder:
    """cuda.tile's launch and exhaustive_search, replaced: every kernel run (tuning trial or launch)
    runs `model(grid, args)` on the CPU; `cost(cfg)` is a config's mean time."""

    def __init__(self, model, cost=lambda cfg: 10.0, margin=0.1):
        self.model, self.cost, self.margin = model, cost, margin
        self.searches: list[list] = []
        self.trial_args: list[tuple] = []
        self.launches: list[tuple] = []

    def search(self, search_space, stream, grid_fn, kernel, args_fn, hints_fn=None, **options):
        from cuda.tile.tune import Measurement, TuningResult

        assert isinstance(search_space, list) and options == {"quiet": True}
        self.searches.append(search_space)
        measured = []
        for cfg in search_space:
            grid, args = grid_fn(cfg), args_fn(cfg)
            base = kernel if isinstance(kernel, ct.kernel) else kernel(cfg)
            base.replace_hints(**hints_fn(cfg))  # the hints are valid compiler options
            self.trial_args.append(args)
            for _ in range(3):  # exhaustive_search runs each config several times
                self.model(grid, args)
            measured.append(Measurement(config=cfg, mean_us=self.cost(cfg), num_samples=5, error_margin_us=self.margin))
        return TuningResult(best=min(measured, key=lambda m: m.mean_us), successes=tuple(measured), failures=())

    def launch(self, stream, grid, kernel, args):
        self.launches.append((grid, kernel, args))
        self.model(grid, args)


def vector_add_model(grid, args):
    x, y, out, tile = args
    n = out.numel()
    assert grid[0] * tile >= n > (grid[0] - 1) * tile, "the grid does not match the tile"
    out.copy_(x + y)


@pytest.fixture
def gpu(monkeypatch):
    """torch.cuda as a Hopper GPU would answer the wrapper; the recorder installs launch and search."""
    import cuda.tile.tune as tune

    state = {"capability": (9, 0), "capturing": False}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: state["capability"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: "stream")
    monkeypatch.delenv("DISABLE_CUTILE_TUNE", raising=False)

    def install(recorder: Recorder):
        monkeypatch.setattr(ct, "launch", recorder.launch)
        monkeypatch.setattr(tune, "exhaustive_search", recorder.search)
        return recorder

    state["install"] = install
    return state


def test_tunes_once_per_key_on_scratch_and_launches_the_best_config(tmp_path, gpu):
    mod = load(tmp_path, tuned_source("vector_add"))
    best = {"TILE": 512, "occupancy": 4}
    rec = gpu["install"](Recorder(vector_add_model, cost=lambda cfg: 5.0 if cfg == best else 10.0))
    x, y = torch.randn(1000), torch.randn(1000)
    out = torch.full((1000,), float("nan"))
    assert mod.run(x, y, out) is out
    assert torch.equal(out, x + y)
    assert len(rec.searches) == 1 and rec.searches[0] is mod._TUNE_SPACES["sm_90"]
    assert all(a[2].data_ptr() != out.data_ptr() and a[0] is x and a[1] is y for a in rec.trial_args)
    (grid, kernel, args), = rec.launches
    assert grid == (2, 1, 1) and args[2] is out and args[3] == 512
    assert kernel._compiler_options.occupancy == 4

    mod.run(x, y, out)  # same key: no tuning, the same kernel object (no recompilation)
    assert len(rec.searches) == 1 and rec.launches[1][1] is kernel
    mod.run(torch.randn(3000), torch.randn(3000), torch.empty(3000))  # new shape
    mod.run(x.half(), y.half(), out.half())  # new dtype
    mod.run(x[::2], y[::2], torch.empty(1000)[::2])  # new strides
    assert len(rec.searches) == 4 and len(mod._TUNED) == 4


def test_tuning_never_writes_the_callers_buffers_even_in_place(tmp_path, gpu):
    mod = load(tmp_path, tuned_source("vector_add"))
    gpu["install"](Recorder(vector_add_model))
    x, y = torch.randn(777), torch.randn(777)
    x0 = x.clone()
    mod.run(x, y, x)  # out is x: 60 tuning trials on scratch, then one launch into x
    assert torch.equal(x, x0 + y)


INPLACE = '''\
import cuda.tile as ct
import torch

TILE = 256


@ct.kernel
def double_kernel(x, TILE: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0),), shape=(TILE,))
    ct.store(x, index=(ct.bid(0),), tile=t * 2)


def run(x):
    flat = x.view(-1)
    ct.launch(torch.cuda.current_stream(), (ct.cdiv(flat.numel(), TILE), 1, 1), double_kernel, (flat, TILE))
    return x
'''


def test_an_in_place_kernel_is_tuned_on_a_copy_of_its_argument(tmp_path, gpu):
    (c,) = cands(INPLACE)
    mod = load(tmp_path, c.source)
    assert mod._TUNE_WRITES == (0,)

    def model(grid, args):
        args[0].mul_(2)

    rec = gpu["install"](Recorder(model))
    x = torch.randn(4, 100)
    x0 = x.clone()
    mod.run(x)
    assert torch.equal(x, x0 * 2)  # doubled once, by the launch
    assert all(a[0].data_ptr() != x.data_ptr() for a in rec.trial_args)


def test_ties_within_noise_keep_the_earliest_config(tmp_path, gpu):
    mod = load(tmp_path, tuned_source("vector_add"))
    # every config within 1% (under the 2% floor): the kernel as it was wins
    rec = gpu["install"](Recorder(vector_add_model, cost=lambda cfg: 10.0 - 0.1 * cfg["TILE"] / 512))
    mod.run(torch.randn(64), torch.randn(64), torch.empty(64))
    assert mod._TUNED[next(iter(mod._TUNED))][0] == {"TILE": 128, "occupancy": None}
    # one config 30% faster, beyond both margins: it wins
    mod._TUNED.clear()
    rec.cost = lambda cfg: 7.0 if cfg == {"TILE": 256, "occupancy": 8} else 10.0
    mod.run(torch.randn(64), torch.randn(64), torch.empty(64))
    assert mod._TUNED[next(iter(mod._TUNED))][0] == {"TILE": 256, "occupancy": 8}


def test_no_tuning_inside_cuda_graph_capture(tmp_path, gpu):
    mod = load(tmp_path, tuned_source("vector_add"))
    rec = gpu["install"](Recorder(vector_add_model))
    x = torch.randn(64)
    mod.run(x, x, torch.empty(64))  # warm-up outside capture: tuned
    gpu["capturing"] = True
    mod.run(x, x, torch.empty(64))  # known key: a plain launch, fine under capture
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        mod.run(torch.randn(65), torch.randn(65), torch.empty(65))
    assert len(rec.searches) == 1


def test_blackwell_space_and_num_ctas_hint(tmp_path, gpu):
    mod = load(tmp_path, tuned_source("matmul"))

    def model(grid, args):
        a, b, c, tm, tn, _ = args
        assert grid == (-(-a.shape[0] // tm), -(-b.shape[1] // tn), 1)
        c.copy_(a @ b)

    want = {"TILE_M": 128, "TILE_N": 128, "TILE_K": 64, "occupancy": 1, "num_ctas": 2}
    rec = gpu["install"](Recorder(model, cost=lambda cfg: 1.0 if cfg == want else 3.0))
    gpu["capability"] = (10, 0)
    a, b = torch.randn(100, 70), torch.randn(70, 90)
    out = torch.empty(100, 90)
    mod.run(a, b, out)
    assert rec.searches[-1] is mod._TUNE_SPACES["sm_100"]
    grid, kernel, args = rec.launches[-1]
    assert grid == (1, 1, 1) and args[3:] == (128, 128, 64)
    assert (kernel._compiler_options.num_ctas, kernel._compiler_options.occupancy) == (2, 1)
    torch.testing.assert_close(out, a @ b)
    gpu["capability"] = (12, 0)  # sm_120: no 2-CTA clusters, the other space
    mod.run(torch.randn(8, 8), torch.randn(8, 8), torch.empty(8, 8))
    assert rec.searches[-1] is mod._TUNE_SPACES["sm_90"]


def test_disable_cutile_tune_launches_the_first_config_without_trials(tmp_path, gpu, monkeypatch):
    mod = load(tmp_path, tuned_source("vector_add"))
    rec = gpu["install"](Recorder(vector_add_model))
    monkeypatch.setenv("DISABLE_CUTILE_TUNE", "1")
    x = torch.randn(300)
    out = torch.empty(300)
    mod.run(x, x, out)
    assert rec.searches == [] and torch.equal(out, x + x)
    assert rec.launches[0][2][3] == 128 and rec.launches[0][1]._compiler_options.occupancy is None


# --------------------------------------------------------------------------- coordination, priority


def test_cutile_hint_leaves_the_knobs_of_the_space_alone():
    for op in ("vector_add", "softmax", "matmul"):
        assert playbook.get("cutile-hint").candidates(src(op), analyze(src(op)))  # before: it steps them
        tuned = tuned_source(op)
        assert "occupancy" in ca.owned_knobs(ca.parse(tuned))
        assert playbook.get("cutile-hint").candidates(tuned, analyze(tuned)) == []
    assert ca.owned_knobs(ca.parse(tuned_source("matmul"))) == {"TILE_M", "TILE_N", "TILE_K", "occupancy", "num_ctas"}
    assert ca.owned_knobs(ca.parse(src("matmul"))) == frozenset()


def test_autotune_comes_before_the_single_steps_it_subsumes():
    for op in CUTILE_OPS:
        order = analyze(src(op)).priority()
        assert order.index("autotune") < min(order.index("occupancy"), order.index("block")), op


def test_next_candidate_tries_the_autotune_first_then_nothing_on_its_knobs(monkeypatch):
    from playbook import base, next_candidate, recipe

    base.recipes()
    monkeypatch.setattr(recipe, "_REGISTRY", {rid: recipe._REGISTRY[rid] for rid in ("cutile-autotune", "cutile-hint")})
    source = src("vector_add")
    first = next_candidate(source, analyze(source), tried=[], demoted=[])
    assert first.key == "cutile-autotune:add_kernel"
    assert next_candidate(first.source, analyze(first.source), tried=[first.key], demoted=[]) is None


# --------------------------------------------------------------------------- ahead of time


def test_the_aot_stand_in_records_every_config_with_its_hints():
    from loop.worker.aot import _capture_search

    @ct.kernel
    def k(x, T: ct.Constant[int]):
        ct.store(x, index=(ct.bid(0),), tile=ct.load(x, index=(ct.bid(0),), shape=(T,)))

    launches = []
    space = [{"T": 64, "occupancy": None}, {"T": 128, "occupancy": 2}, {"T": 64, "occupancy": 8}]
    result = _capture_search(launches)(space, None, lambda c: (1,), lambda c: k, lambda c: ("x", c["T"]),
                                       hints_fn=lambda c: {"occupancy": c["occupancy"]}, quiet=True)
    assert result.best.config is space[0] and len(result.successes) == 3
    assert [(kern._compiler_options.occupancy, args) for kern, args in launches] == [
        (None, ("x", 64)), (2, ("x", 128)), (8, ("x", 64))]


AOT_OPS = ["vector_add", "softmax", "matmul"]  # one tile, occupancy only, 3 tiles x occupancy (x num_ctas)
# The dtypes each op's configs are compiled in: every dtype of the spec, except matmul's bfloat16, a
# second 2-byte type whose tiles, shared memory and MMA shapes are fp16's, so that every config that
# compiles (or fails to) in float16 does the same in bfloat16; its 45 more compiles were half the
# slow tier's longest ahead-of-time test. (test_aot.py builds the matmul first version in both.)
AOT_DTYPES = {"matmul": ["float16"]}


@pytest.mark.slow
@pytest.mark.parametrize("op", AOT_OPS)
def test_every_config_compiles_ahead_of_time_for_hopper_and_blackwell(op, tmp_path, monkeypatch, capsys):
    """Every config of the op's tune space compiles for sm_90 and sm_100, one compiled kernel per config
    and dtype (in AOT_DTYPES' dtypes where it names the op, else every dtype of the spec)."""
    from loop.cli import main
    from loop.target.contract import spec_dtypes

    for name in ("TILELOOP_PYTHON", "TRITON_INTERPRET", "DISABLE_CUTILE_TUNE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TILELOOP_WORKER_TIMEOUT", "1800")  # matmul: 45 compiles in one worker
    monkeypatch.chdir(tmp_path)
    narrowed = {"DTYPES": AOT_DTYPES[op]} if op in AOT_DTYPES else {}
    target = materialise(tmp_path, op, "cutile", tuned_source(op), **narrowed)
    spaces = load(tmp_path, target.read_text(), f"{op}_spaces")._TUNE_SPACES
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], out.get("message")
    rows = out["kernels"]
    assert all(r["ok"] for r in rows)
    dtypes = {r["dtype"] for r in rows}
    assert dtypes == set(spec_dtypes(target.parent / "spec.py")) == set(AOT_DTYPES.get(op, dtypes)), dtypes
    for arch in ("sm_90", "sm_100"):
        for dtype in dtypes:  # one compiled kernel per config: every config, no more
            assert sum(r["arch"] == arch and r["dtype"] == dtype for r in rows) == len(spaces[arch]), (arch, dtype)

