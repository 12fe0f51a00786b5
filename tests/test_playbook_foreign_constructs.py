"""How the playbook reads the constructs of kernels written elsewhere, each on a small module of
its own: launch settings from a helper or a dict, pointers moved by `+=`, block pointers and
tensor descriptors, several outputs, libdevice and `@triton.jit` helpers, `@triton.heuristics`,
kernels launched through a `torch.autograd.Function`, and the entry point a spec names."""

from __future__ import annotations

import libcst as cst
import pytest

import playbook
from playbook.analysis import analyze
from playbook.cst.aliases import aliases
from playbook.cst.entry import spec_entry
from playbook.cst.kernels import triton_kernels
from playbook.cst.memory import accesses, loaded_at, outputs
from playbook.triton.repeated_values import dedupe

HEAD = "import torch\nimport triton\nimport triton.language as tl\n"


def cands(rid: str, source: str, **analysis):
    return playbook.get(rid).candidates(source, analyze(source, **analysis))


def reason(rid: str, source: str) -> str:
    return playbook.get(rid).skip_reason(source, analyze(source))


# --------------------------------------------------------------------------- device code


AUTOGRAD = HEAD + '''
from triton.language.extra.libdevice import rsqrt


@triton.jit
def _scale(x):
    return x * tl.exp(x)


@triton.jit
def _unused_helper(x):
    return tl.exp(x)


@triton.jit
def _fwd_kernel(X, Y, RSTD, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride
    Y += row * stride
    cols = tl.arange(0, BLOCK_SIZE)
    x = tl.load(X + cols, mask=cols < n_cols, other=0.0)
    r = rsqrt(tl.sum(x * x, axis=0) / n_cols)
    tl.store(RSTD + row, r)
    tl.store(Y + cols, _scale(x * r), mask=cols < n_cols)


@triton.jit
def _bwd_kernel(DY, DX, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    dy = tl.load(DY + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(DX + row * stride + cols, tl.exp(dy) + _unused_helper(dy), mask=cols < n_cols)


def settings(n):
    block = triton.next_power_of_2(n)
    return block, 8 if block >= 2048 else 4


def norm_forward(x):
    n_rows, n_cols = x.shape
    BLOCK_SIZE, num_warps = settings(n_cols)
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, device=x.device)
    _fwd_kernel[(n_rows,)](x, y, rstd, x.stride(0), n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return y, rstd


def norm_backward(dy):
    n_rows, n_cols = dy.shape
    dx = torch.empty_like(dy)
    _bwd_kernel[(n_rows,)](dy, dx, dy.stride(0), n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols), num_warps=4)
    return dx


class NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y, rstd = norm_forward(x)
        ctx.save_for_backward(rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        return norm_backward(dy)


norm = NormFunction.apply
'''


def test_helpers_are_not_kernels_and_the_forward_path_follows_the_autograd_function():
    module = cst.parse_module(AUTOGRAD)
    assert set(triton_kernels(module, aliases(module))) == {"_fwd_kernel", "_bwd_kernel"}  # not _scale
    an = analyze(AUTOGRAD)
    assert an.entry == ("NormFunction.forward",) and an.forward == {"_fwd_kernel"}
    # an alias of the Function's apply stands for its forward too
    assert analyze(AUTOGRAD, entry=("norm",)).forward == {"_fwd_kernel"}
    assert analyze(AUTOGRAD, entry=("norm_backward",)).forward == {"_bwd_kernel"}
    # the class: the forward kernel's sum and the libdevice rsqrt it calls (the backward has no reduction)
    assert an.kernel_class == "norm-like" and {"sum", "rsqrt", "exp"} <= an.calls


def test_fast_math_rewrites_the_forward_kernel_and_its_helper_not_the_backward_path():
    (c,) = [c for c in cands("fast-math", AUTOGRAD) if c.kind == "exp2"]
    assert "    return x * tl.exp2(x * 1.4426950408889634)\n" in c.source  # the helper the forward kernel calls
    assert c.title == "tl.exp(x) -> tl.exp2(x * log2(e)) (1 site(s))"
    backward = AUTOGRAD[AUTOGRAD.index("@triton.jit\ndef _unused_helper"):AUTOGRAD.index("def settings")]
    assert backward in c.source  # _unused_helper and _bwd_kernel unchanged


def test_memory_follows_pointer_moves_and_lists_every_output():
    module = cst.parse_module(AUTOGRAD)
    al = aliases(module)
    fwd = triton_kernels(module, al)["_fwd_kernel"]
    assert outputs(fwd, al) == ["RSTD", "Y"]
    assert loaded_at(fwd, al) == {"X": 1}
    assert [(a.kind, a.base) for a in accesses(fwd, al)] == [("load", "X"), ("store", "RSTD"), ("store", "Y")]


BLOCK_PTRS = HEAD + '''

@triton.jit
def tile_kernel(x_ptr, w_ptr, out_ptr, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    xb = tl.make_block_ptr(base=x_ptr, shape=(M, N), strides=(stride_m, 1), offsets=(pid * BLOCK_M, 0),
                           block_shape=(BLOCK_M, BLOCK_N), order=(1, 0))
    x = tl.load(xb, boundary_check=(0, 1))
    xb = tl.advance(xb, (0, BLOCK_N))
    w = tl.load(w_ptr + tl.arange(0, BLOCK_N))
    desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_m, 1], block_shape=[BLOCK_M, BLOCK_N])
    desc.store([pid * BLOCK_M, 0], x * w[None, :])


def run(x, w, out):
    M, N = x.shape
    tile_kernel[(triton.cdiv(M, 64),)](x, w, out, M, N, x.stride(0), BLOCK_M=64, BLOCK_N=64)
    return out
'''


def test_block_pointers_and_descriptors_resolve_to_their_parameter():
    module = cst.parse_module(BLOCK_PTRS)
    al = aliases(module)
    fn = triton_kernels(module, al)["tile_kernel"]
    assert [(a.kind, a.base, a.descriptor) for a in accesses(fn, al)] == [
        ("load", "x_ptr", False), ("load", "w_ptr", False), ("store", "out_ptr", True)]
    # a norm of rows read once: the block-pointer load of x streams; w is read by every program
    source = BLOCK_PTRS.replace("x * w[None, :]", "x * w[None, :] / tl.sum(x, axis=1)[:, None]")
    (c,) = cands("eviction-policy", source)
    assert 'x = tl.load(xb, boundary_check=(0, 1), eviction_policy="evict_first")' in c.source
    assert "w = tl.load(w_ptr + tl.arange(0, BLOCK_N))\n" in c.source


# --------------------------------------------------------------------------- launch settings


def test_autotune_tunes_the_warps_a_helper_computes_and_keeps_its_block():
    (c,) = cands("triton-autotune", AUTOGRAD)
    assert c.key == "triton-autotune:_fwd_kernel"
    assert c.title == "_fwd_kernel: @triton.autotune over num_warps (4 configs, key n_cols, BLOCK_SIZE)"
    assert "for warps in (4, 8, 16, 32)" in c.source and '"BLOCK_SIZE": ' not in c.source
    assert ("    _fwd_kernel[(n_rows,)](x, y, rstd, x.stride(0), n_cols, BLOCK_SIZE=BLOCK_SIZE)\n" in c.source)
    assert "settings(n_cols)" in c.hypothesis and "BLOCK_SIZE stays as the wrapper computes it" in c.hypothesis


def test_launch_param_scales_a_computed_num_warps_at_the_launch():
    by_key = {c.key: c for c in cands("launch-param", AUTOGRAD)}
    assert set(by_key) == {"launch-param:_fwd_kernel:num_warps=x2", "launch-param:_fwd_kernel:num_warps=x1/2"}
    assert "BLOCK_SIZE=BLOCK_SIZE, num_warps=min(num_warps * 2, 32))" in by_key[
        "launch-param:_fwd_kernel:num_warps=x2"].source
    assert "the wrapper computes (settings(n_cols))" in by_key["launch-param:_fwd_kernel:num_warps=x2"].title


DICT_OPTIONS = HEAD + '''

@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def run(x, out):
    n = x.numel()
    opts = {"num_warps": 4}
    opts["BLOCK"] = 256
    k[(triton.cdiv(n, 256),)](x, out, n, **opts)
    return out
'''


def test_options_unpacked_from_a_dict_are_read_and_stepped_where_they_are_written():
    by_key = {c.key: c for c in cands("launch-param", DICT_OPTIONS)}
    assert '    opts = {"num_warps": 8}\n' in by_key["launch-param:num_warps=8"].source
    assert '    opts["BLOCK"] = 512\n' in by_key["launch-param:BLOCK=512"].source
    assert "passes num_warps through **opts" in reason("triton-autotune", DICT_OPTIONS)


HEURISTICS = HEAD + '''

@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def run(x, out):
    n = x.numel()
    k[(1,)](x, out, n)
    return out
'''


def test_heuristics_kernels_are_autotuned_above_the_heuristics():
    (c,) = cands("triton-autotune", HEURISTICS)
    deco = c.source[c.source.index("@triton.autotune"):c.source.index("def k(")]
    assert deco.index("@triton.autotune") < deco.index("@triton.heuristics") < deco.index("@triton.jit")
    assert "BLOCK stays as the wrapper computes it" in c.hypothesis  # the heuristics' constexpr is not tuned


# --------------------------------------------------------------------------- rewrites of foreign kernels


def test_persistent_gives_each_work_item_a_copy_of_the_pointers_it_moves():
    (c,) = [c for c in cands("triton-persistent", AUTOGRAD) if c.key == "triton-persistent:_fwd_kernel"]
    loop = c.source[c.source.index("    for pid in tl.range("):c.source.index("def _bwd_kernel")]
    assert "        X_item = X\n        Y_item = Y\n" in loop
    assert "        X_item += row * stride\n" in loop and "tl.load(X_item + cols" in loop and "X +=" not in loop
    # the hypothesis names what moved before the loop, and it did
    assert "1 setup statement(s) (cols) now run once per program" in c.hypothesis
    kernel = c.source[c.source.index("def _fwd_kernel"):c.source.index("    for pid in tl.range(")]
    assert "    cols = tl.arange(0, BLOCK_SIZE)\n" in kernel


def test_whole_row_treats_libdevice_and_store_free_helpers_as_recomputable():
    body = ("r = rsqrt(v)\n"
            "y = _scale(x)\n"
            "r = rsqrt(v)\n"  # libdevice: same value, dropped
            "y = _scale(x)\n"  # a helper without a store: same value, dropped
            "z = _writes(x)\n"
            "z = _writes(x)\n")  # a helper that stores: kept
    stmts = list(cst.parse_module(body).body)
    out, dropped = dedupe(stmts, "tl", frozenset({"rsqrt", "_scale"}))
    assert dropped == 2 and cst.Module(out).code == "r = rsqrt(v)\ny = _scale(x)\nz = _writes(x)\nz = _writes(x)\n"


TL_RANGE = HEAD + '''

@triton.jit
def k(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
        acc += x
    total = tl.sum(acc, axis=0)
    for start in tl.range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + row * stride + cols, x / total, mask=cols < n_cols)


def run(x, out):
    rows, cols = x.shape
    k[(rows,)](x, out, cols, x.stride(0), BLOCK=1024, num_warps=4)
    return out
'''


def test_whole_row_reads_tl_range_loops():
    (c,) = cands("triton-whole-row", TL_RANGE)
    twin = c.source[c.source.index("def k_row("):c.source.index("def run(")]
    assert "for start" not in twin and twin.count("tl.load(") == 1
    assert "each row is loaded once" in c.hypothesis


# --------------------------------------------------------------------------- the spec's entry point


@pytest.mark.parametrize("spec,entry", [
    ("ENTRY = 'norm_forward'\n", ("norm_forward",)),
    ("import torch\n", ("run",)),
    ("def entry(target, x):\n    y = target.norm(x)\n    return target.NormFunction.apply(y)\n",
     ("NormFunction", "norm")),
    ("def entry(mod, **inputs):\n    return mod.norm_forward(**inputs)[0]\n", ("norm_forward",)),
    ("def entry(target, x):\n    return x\n", ()),
    ("this is not python(\n", ()),
])
def test_the_entry_point_a_spec_names(spec, entry):
    assert spec_entry(spec) == entry


def test_kernels_picked_from_a_module_level_table_are_reached():
    source = AUTOGRAD.replace("def norm_forward(x):", "KERNELS = {\"fwd\": _fwd_kernel}\n\n\ndef norm_forward(x):")
    source = source.replace("    _fwd_kernel[(n_rows,)](", "    KERNELS[\"fwd\"][(n_rows,)](")
    assert analyze(source).forward == {"_fwd_kernel"}


def test_an_entry_point_the_module_does_not_have_falls_back_to_the_default_reading():
    an = analyze(AUTOGRAD, entry=("run",))  # the default name; this module has no run
    assert an.entry == ("NormFunction.forward",) and an.forward == {"_fwd_kernel"}


def test_without_a_launch_every_kernel_counts():
    source = HEAD + "\n\n@triton.jit\ndef k(x_ptr):\n    tl.store(x_ptr, tl.exp(tl.load(x_ptr)))\n"
    an = analyze(source)
    assert an.forward is None and an.on_path("k")
    assert cands("fast-math", source)


def test_host_builtins_do_not_make_an_element_wise_kernel_a_reduction():
    source = HEAD + '''

@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.sigmoid(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def run(x, out):
    n = x.numel()
    block = min(1024, max(16, triton.next_power_of_2(n)))
    k[(triton.cdiv(n, block),)](x, out, n, BLOCK=block)
    return out
'''
    assert analyze(source).kernel_class == "element-wise"


MOVED = HEAD + '''

@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x_ptr += pid * BLOCK
    out_ptr += pid * BLOCK
    offs = tl.arange(0, BLOCK)
    mask = pid * BLOCK + offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def run(x, out):
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 16),)](x, out, n, BLOCK=16, num_warps=4)
    return out
'''

CHECK = '''
import sys, torch
sys.path.insert(0, {folder!r})
import moved
x = torch.randn(16 * 100 + 5)
out = torch.zeros_like(x)
moved.run(x, out)
assert moved.PROGRAMS_PER_SM < 101, moved.PROGRAMS_PER_SM  # fewer programs than blocks: each does several
assert torch.equal(out, x * 2), (out - x * 2).abs().max()
print("ok")
'''


@pytest.mark.slow
def test_persistent_copies_of_moved_pointers_compute_every_item_in_the_interpreter(tmp_path):
    """Each program walks several blocks; without a fresh copy of x_ptr per block, the second
    block would start where the first one's pointer was left."""
    import os
    import subprocess
    import sys

    (c,) = cands("triton-persistent", MOVED)
    assert "        x_ptr_item = x_ptr\n" in c.source
    (tmp_path / "moved.py").write_text(c.source)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", CHECK.format(folder=str(tmp_path))], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
