"""The cuTile chunked row loop recipe (cutile-row-chunks).

* Golden tests: reference kernel -> the exact rewrite, and the reasons the recipe gives where it
  proposes nothing (every variation of the whole-row form it cannot prove equivalent).
* Numeric replay (CPU, no GPU): cuTile kernels cannot run here, so each kernel is executed block
  by block as plain Python against a numeric stand-in for `cuda.tile` whose tiles are torch
  tensors: loads pad exactly as the padding mode says (and refuse a tile wholly outside the
  array, which cuTile leaves undefined), stores drop the part of a tile past the array, as
  `ct.store` does. The whole-row references and their chunked rewrites are checked against the
  spec's reference at odd widths (1000, 2053, 3000 columns with CHUNK 1024; many chunks with
  CHUNK 64), and a broken rewrite must fail.
* Ahead of time (slow): every rewrite compiles for sm_90 and sm_100 in every dtype of its spec
  through `tileloop compile`, and at the widest benchmark row it uses fewer registers per thread
  than the whole-row tile.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import types
from pathlib import Path

import pytest

import playbook
from loop.cli import main
from playbook.analysis import CUTILE_PRIORITY, analyze
from playbook.base import page_path
from playbook.cst.source import Skip
from playbook.cutile.row_chunks import rewrite
from playbook.cutile.row_forms import CHUNKED
from tests.conftest import materialise

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
RID = "cutile-row-chunks"


def src(op: str) -> str:
    return (KERNELS / op / f"{op}_cutile.py").read_text()


def cands(source: str):
    recipe, an = playbook.get(RID), analyze(source)
    return recipe.candidates(source, an) if an.language in recipe.languages and recipe.applies(an) else []


def one(source: str):
    found = cands(source)
    assert len(found) == 1, [c.key for c in found]
    return found[0]


def reason(source: str) -> str | None:
    return playbook.get(RID).skip_reason(source, analyze(source))


# A whole-row row_sum (the reference row_sum already loops over the row in small tiles).
ROW_SUM_WHOLE = '''\
"""row_sum, whole row as one tile."""

import cuda.tile as ct
import torch


def next_power_of_2(n):
    return 1 << (n - 1).bit_length()


@ct.kernel
def row_sum_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO)
    total = ct.sum(ct.astype(tile, ct.float32), axis=1)
    ct.store(out, index=(row,), tile=ct.astype(total, out.dtype))


def run(x, out):
    rows, cols = x.shape
    ct.launch(torch.cuda.current_stream(), (rows, 1, 1), row_sum_kernel, (x, out, next_power_of_2(cols)))
    return out
'''


# --------------------------------------------------------------------------- registry, page, priority


def test_registered_with_a_page_and_late_in_the_cutile_memory_bound_order():
    recipe = playbook.get(RID)
    assert recipe.languages == ("cutile",)
    text = page_path(recipe).read_text()
    assert text.startswith(f"# {RID}\n")
    for section in ("## What it changes", "## When", "## Expected effect", "## Hazards", "## Before / after"):
        assert section in text, section
    for cls in ("element-wise", "norm-like", "reduction"):
        order = CUTILE_PRIORITY[cls]
        # measured on an H200: the 1024-column chunk loop at default occupancy lost 25-54%, so it comes
        # after the autotune space, the store path, the tile steps and occupancy
        assert order[0] == "autotune" and order.index("row-chunks") > order.index("occupancy"), cls
    assert "row-chunks" not in CUTILE_PRIORITY["dot"]
    c = one(src("softmax"))
    assert c.source != src("softmax")
    first = playbook.next_candidate(src("softmax"), analyze(src("softmax")), [], [])
    assert first.kind == "autotune" and first.key != c.key  # the autotune space is offered first now


def test_applies_to_the_whole_row_reference_kernels_only():
    ops = sorted(p.parent.name for p in KERNELS.glob("*/*_cutile.py"))
    assert sorted(op for op in ops if cands(src(op))) == ["layernorm", "rmsnorm", "softmax"]
    assert reason(src("row_sum")).endswith("; it already loops over the row")
    assert reason(src("vector_add")).startswith("add_kernel is not one of the whole-row forms")
    assert reason((KERNELS / "softmax" / "softmax_triton.py").read_text()) == (
        "cutile-row-chunks does not apply to a triton norm-like kernel")


# --------------------------------------------------------------------------- golden

RMSNORM_CHUNKED = '''\
"""rmsnorm in cuTile, first version: one row per block, the whole row as one tile of
next_power_of_2(cols) columns, statistics in fp32, default occupancy, no autotune."""

import cuda.tile as ct
import torch

EPS = 1e-6  # part of the op (spec.EPS), not a tuning knob
CHUNK = 1024  # columns per chunk of the row loop


@ct.kernel
def rmsnorm_kernel(x, weight, out, n_cols: int, eps: float, CHUNK: ct.Constant[int]):
    row = ct.bid(0)
    num_chunks = ct.num_tiles(x, axis=1, shape=(1, CHUNK))
    # pass 1: sum of squares, column-wise across chunks, reduced once; columns past n_cols load as 0
    sum_sq = ct.zeros((1, CHUNK), dtype=ct.float32)
    for k in range(num_chunks):
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        sum_sq = sum_sq + tx * tx
    mean_sq = ct.sum(sum_sq, axis=1, keepdims=True) / n_cols  # divide by the true width, not the chunks'
    rstd = ct.rsqrt(mean_sq + eps)
    # pass 2: normalise chunk by chunk; columns past n_cols are not stored
    for k in range(num_chunks):
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        tw = ct.astype(ct.load(weight, index=(0, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        y = tx * rstd * tw
        ct.store(out, index=(row, k), tile=ct.astype(y, out.dtype))


def run(x, weight, out):
    rows, cols = x.shape
    ct.launch(torch.cuda.current_stream(), (rows, 1, 1), rmsnorm_kernel,
              (x, weight.view(1, cols), out, cols, EPS, CHUNK))
    return out
'''


def test_rmsnorm_exact():
    c = one(src("rmsnorm"))
    assert c.source == RMSNORM_CHUNKED
    assert (c.recipe, c.kind, c.key, c.tier) == (RID, "row-chunks", f"{RID}:rmsnorm_kernel:1024", 0)
    assert c.title == ("rmsnorm_kernel: loop over the row in chunks of CHUNK = 1024 columns "
                       "(was one tile of next_power_of_2(cols) columns)")
    assert "two passes" in c.hypothesis and "registers" in c.hypothesis


def test_softmax_imports_math_and_drops_next_power_of_2():
    c = one(src("softmax"))
    assert "import math\n\nimport cuda.tile as ct\nimport torch\n\nCHUNK = 1024  # columns per chunk" in c.source
    assert "next_power_of_2" not in c.source
    assert "def softmax_kernel(x, out, CHUNK: ct.Constant[int]):" in c.source
    assert "(rows, 1, 1), softmax_kernel, (x, out, CHUNK))" in c.source
    assert c.source.count("padding_mode=ct.PaddingMode.NEG_INF") == 2  # as the whole-row load, in both passes


def test_keeps_the_kernels_names_docstring_and_decorator_hints():
    source = (src("layernorm").replace("@ct.kernel\n", "@ct.kernel(occupancy=2)\n")
              .replace("tx", "xf").replace("centered", "xc")
              .replace("    row = ct.bid(0)\n", '    """one row per block"""\n    row = ct.bid(0)\n'))
    out = one(source).source
    assert '@ct.kernel(occupancy=2)\ndef layernorm_kernel(' in out
    assert '    """one row per block"""\n    row = ct.bid(0)\n' in out
    assert "        xc = ct.where(in_row, xf - mean_k, " in out and "tx" not in out


def test_row_sum_whole_row_form_becomes_a_chunked_accumulation():
    out = one(ROW_SUM_WHOLE).source
    assert "    acc = ct.zeros((1, CHUNK), dtype=ct.float32)\n" in out
    assert "    for k in range(ct.num_tiles(x, axis=1, shape=(1, CHUNK))):\n" in out
    assert "(rows, 1, 1), row_sum_kernel, (x, out, CHUNK))" in out


def _autotuned(op: str) -> str:
    found = playbook.get("cutile-autotune").candidates(src(op), analyze(src(op)))
    assert len(found) == 1
    return found[0].source


def test_composes_with_cutile_autotune_in_either_order():
    tuned = _autotuned("softmax")
    after = one(tuned).source
    assert "    return ((rows, 1, 1), softmax_kernel, (x, out, CHUNK),\n" in after
    assert "_TUNE_SPACES" in after and "def softmax_kernel(x, out, CHUNK: ct.Constant[int]):" in after
    # chunked first: CHUNK is a free tile constant, so the autotune space tunes it
    chunked = one(src("rmsnorm")).source
    space = playbook.get("cutile-autotune").candidates(chunked, analyze(chunked))[0].source
    assert '[{"CHUNK": chunk, "occupancy": occupancy}' in space
    assert "for chunk in (1024, 64, 128, 256, 512, 2048, 4096)" in space  # a row loop: chunks up to 4096


def test_composes_with_cutile_persistent_after_but_not_before():
    chunked = one(src("layernorm")).source
    persistent = playbook.get("cutile-persistent").candidates(chunked, analyze(chunked))
    assert len(persistent) == 1 and "for row in range(ct.bid(0), num_rows, ct.num_blocks(0)):" in persistent[0].source
    first = playbook.get("cutile-persistent").candidates(src("layernorm"), analyze(src("layernorm")))[0].source
    assert reason(first).startswith("layernorm_kernel is not one of the whole-row forms")


SOFTMAX = src("softmax")


@pytest.mark.parametrize("edit,why", [
    ((SOFTMAX, "padding_mode=ct.PaddingMode.NEG_INF", "padding_mode=ct.PaddingMode.ZERO"),
     "softmax_kernel is not one of the whole-row forms"),
    ((SOFTMAX, "axis=1, keepdims=True)\n    num", "axis=0, keepdims=True)\n    num"),
     "softmax_kernel is not one of the whole-row forms"),
    ((SOFTMAX, "index=(row, 0), tile=", "index=(row, 1), tile="), "softmax_kernel is not one of the whole-row forms"),
    ((SOFTMAX, "next_power_of_2(cols))", "4096)"), "the argument for TILE_N is not next_power_of_2(cols)"),
    ((SOFTMAX, "return 1 << (n - 1).bit_length()", "return 1 << n.bit_length()"),
     "next_power_of_2 is not a module function returning 1 << (n - 1).bit_length()"),
    ((SOFTMAX, "rows, cols = x.shape", "rows, cols = out.shape"),
     "run: the row width cols is not bound once by `rows, cols = <x>.shape`"),
    ((SOFTMAX, "    return out", "    ct.launch(torch.cuda.current_stream(), (rows, 1, 1), softmax_kernel, "
                                  "(x, out, next_power_of_2(cols)))\n    return out"),
     "softmax_kernel is not launched exactly once"),
    ((SOFTMAX, "def next_power_of_2", "CHUNK = 1\n\n\ndef next_power_of_2"),
     "CHUNK is already a module-level name (already chunked?)"),
    ((SOFTMAX, "row_max", "k"),
     "softmax_kernel: the chunked form needs the names k, which the kernel uses"),
    ((src("rmsnorm"), "out, cols, EPS,", "out, rows, EPS,"),
     "the argument for n_cols is not cols, the width the tile is sized from"),
])
def test_skips_what_it_cannot_prove_with_the_reason(edit, why):
    source, old, new = edit
    assert old in source
    changed = source.replace(old, new)
    assert cands(changed) == []
    assert reason(changed).startswith(why), reason(changed)


def test_skips_sources_it_cannot_parse_and_modules_with_several_kernels():
    with pytest.raises(Skip, match="^source does not parse"):
        rewrite("import cuda.tile as ct\ndef (:\n")
    two = SOFTMAX + "\n\n@ct.kernel\ndef other(x):\n    pass\n"
    assert reason(two) == "2 @ct.kernel functions: the recipe rewrites a module with one"
    with pytest.raises(Skip):
        rewrite(one(SOFTMAX).source)  # not twice


# --------------------------------------------------------------------------- numeric replay (CPU)


class _NumericCt:
    """cuda.tile on torch tensors, for one block at a time: just enough of it for row kernels."""

    def __init__(self, real, torch):
        self.torch, self.PaddingMode = torch, real.PaddingMode
        self.float32, self.int32 = torch.float32, torch.int32
        self.block = (0, 0, 0)
        self.pad = {real.PaddingMode.ZERO: 0.0, real.PaddingMode.NEG_INF: float("-inf")}

    def bid(self, axis):
        return self.block[axis]

    def cdiv(self, a, b):
        return -(-a // b)

    def num_tiles(self, array, axis, shape, order="C"):
        return -(-array.shape[axis] // shape[axis])

    def _box(self, array, index, shape):
        starts = [i * s for i, s in zip(index, shape)]
        if any(st >= n for st, n in zip(starts, array.shape)):
            raise AssertionError(f"tile {index} of shape {shape} lies wholly outside {tuple(array.shape)}")
        return [slice(st, min(st + s, n)) for st, s, n in zip(starts, shape, array.shape)]

    def load(self, array, index, shape, padding_mode=None, **kwargs):
        assert padding_mode in self.pad, padding_mode  # every load of these kernels states its padding
        tile = self.torch.full(tuple(shape), self.pad[padding_mode], dtype=array.dtype)
        box = self._box(array, index, shape)
        tile[tuple(slice(0, b.stop - b.start) for b in box)] = array[tuple(box)]
        return tile

    def store(self, array, index, tile, **kwargs):
        assert tile.dtype == array.dtype and tile.dim() == array.dim()
        box = self._box(array, index, tuple(tile.shape))
        array[tuple(box)] = tile[tuple(slice(0, b.stop - b.start) for b in box)]

    def astype(self, x, dtype):
        return x.to(dtype)

    def sum(self, x, axis=None, keepdims=False):
        return x.sum(dim=axis, keepdim=keepdims)

    def max(self, x, axis=None, keepdims=False):
        return x.amax(dim=axis, keepdim=keepdims)

    def maximum(self, a, b):
        return self.torch.maximum(a, b)

    def where(self, cond, a, b):
        return self.torch.where(cond, a, b)

    def exp(self, x):
        return self.torch.exp(x)

    def rsqrt(self, x):
        return self.torch.rsqrt(x)

    def full(self, shape, value, dtype):
        return self.torch.full(tuple(shape), value, dtype=dtype)

    def zeros(self, shape, dtype):
        return self.torch.zeros(tuple(shape), dtype=dtype)

    def arange(self, n, dtype):
        return self.torch.arange(n, dtype=dtype)

    def reshape(self, x, shape):
        return x.reshape(tuple(shape))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def execute(source: str, inputs: dict, tmp_path: Path, monkeypatch) -> None:
    """Run `source`'s `run(**inputs)` on the CPU: its one launch, block by block, on `_NumericCt`."""
    import cuda.tile as ct
    import torch

    path = tmp_path / f"numeric_{abs(hash(source))}.py"
    path.write_text(source)
    module = _load(path, path.stem)
    launches = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launches.append((grid, kernel, args)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv("DISABLE_CUTILE_TUNE", "1")  # an autotuned wrapper launches its first config
    module.run(**inputs)
    (grid, kernel, args), = launches
    pyfunc = kernel._annotated_function.pyfunc
    fake = _NumericCt(ct, torch)
    fn = types.FunctionType(pyfunc.__code__, {**pyfunc.__globals__, "ct": fake}, pyfunc.__name__)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        fake.block = (x, y, z)
        fn(*args)


SPECS = {op: _load(KERNELS / op / "spec.py", f"chunks_spec_{op}") for op in ("softmax", "rmsnorm", "layernorm", "row_sum")}
WIDTHS = [(3, 1), (5, 17), (4, 1000), (3, 1024), (4, 2053), (3, 3000)]


def check(source: str, op: str, shape, dtype: str, tmp_path, monkeypatch, seed: int = 0) -> None:
    import torch

    spec = SPECS[op]
    inputs = spec.make_inputs(shape, getattr(torch, dtype), seed, device="cpu")
    inputs["out"].fill_(float("nan"))  # every output element must be written
    wide = torch.float64 if dtype == "float32" else torch.float32
    expected = spec.reference(**{k: v.to(wide) if v.is_floating_point() else v for k, v in inputs.items()})
    execute(source, inputs, tmp_path, monkeypatch)
    atol, rtol = spec.TOLERANCES[dtype]
    torch.testing.assert_close(inputs["out"].to(wide), expected.to(wide), atol=atol, rtol=rtol)


def _whole(op: str) -> str:
    return ROW_SUM_WHOLE if op == "row_sum" else src(op)


@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "layernorm", "row_sum"])
def test_chunked_rewrite_matches_the_reference_at_odd_widths(op, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    chunked = one(_whole(op)).source
    many = rewrite(_whole(op), chunk=64)[0]  # up to 47 chunks: the carried statistics really carry
    for (shape, dtype) in itertools.product(WIDTHS, SPECS[op].DTYPES):
        check(_whole(op), op, shape, dtype, tmp_path, monkeypatch)  # the stand-in agrees with the spec
        check(chunked, op, shape, dtype, tmp_path, monkeypatch)
        check(many, op, shape, dtype, tmp_path, monkeypatch)


def test_chunked_softmax_survives_rows_that_start_with_minus_infinity(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 3000)
    x[:, :2048] = float("-inf")  # the first two chunks add nothing
    x[1, :] = float("-inf")  # a row of -inf: NaN, as in the whole-row kernel
    outs = []
    for source in (src("softmax"), one(src("softmax")).source):
        out = torch.empty_like(x)
        execute(source, {"x": x, "out": out}, tmp_path, monkeypatch)
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], equal_nan=True)
    assert outs[0][0].isfinite().all() and outs[0][1].isnan().all()


def test_autotuned_then_chunked_matches_the_reference(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    source = one(_autotuned("layernorm")).source
    for dtype in SPECS["layernorm"].DTYPES:
        check(source, "layernorm", (3, 3000), dtype, tmp_path, monkeypatch)


@pytest.mark.parametrize("op,broken", [
    ("layernorm", ("delta * delta * seen * n_k / (seen + n_k)", "delta * 0.0")),  # drops the between-chunk term
    ("softmax", ("den * ct.exp(row_max - shift)", "den")),  # no rescale when the max grows
    ("rmsnorm", ("padding_mode=ct.PaddingMode.ZERO), ct.float32)\n        sum_sq",
                 "padding_mode=ct.PaddingMode.NEG_INF), ct.float32)\n        sum_sq")),  # padding enters the sum
])
def test_the_replay_catches_a_broken_chunked_form(op, broken, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    old, new = broken
    assert old in CHUNKED[op]
    source = rewrite(src(op))[0].replace(old, new, 1)
    assert source != rewrite(src(op))[0]
    with pytest.raises(AssertionError):
        check(source, op, (3, 3000), "float32", tmp_path, monkeypatch)


# --------------------------------------------------------------------------- ahead of time (slow)


def compile_json(target: Path, capsys, archs: str = "sm_90,sm_100") -> dict:
    rc = main(["compile", str(target), "--arch", archs, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "layernorm", "row_sum"])
def test_rewrite_compiles_ahead_of_time_for_hopper_and_blackwell_in_every_dtype(op, tmp_path, env, capsys):
    out = compile_json(materialise(tmp_path, op, "cutile", one(_whole(op)).source), capsys)
    assert {(r["arch"], r["dtype"]) for r in out["kernels"]} == {
        (a, d) for a in ("sm_90", "sm_100") for d in SPECS[op].DTYPES}
    assert not any(r["spills"] for r in out["kernels"])


@pytest.mark.slow
def test_chunks_use_fewer_registers_than_the_whole_row_at_16384_columns(tmp_path, env, capsys):
    def registers(source: str, where: str) -> int:
        target = materialise(tmp_path / where, "row_sum", "cutile", source, CORRECTNESS_SHAPES=[(4, 16384)])  # compile compiles the last one
        spec = target.parent / "spec.py"
        spec.write_text(re.sub(r"^DTYPES = .*$", 'DTYPES = ["float32"]', spec.read_text(), count=1, flags=re.M))
        (row,) = compile_json(target, capsys, "sm_90")["kernels"]
        return row["registers"]

    whole, chunked = registers(ROW_SUM_WHOLE, "whole"), registers(one(ROW_SUM_WHOLE).source, "chunked")
    assert chunked < whole, (chunked, whole)
