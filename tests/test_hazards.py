"""Tile IR hazards (playbook.hazards.scan): each class from a tiny source that triggers exactly
it, with its severity, code and line; and the included reference kernels are free of error- and
warning-level hazards."""

from __future__ import annotations

from pathlib import Path

import pytest

from playbook.hazards import ATOMICS, UNSUPPORTED_TRITON, scan

REPO_ROOT = Path(__file__).resolve().parent.parent

TRITON = """\
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    src = tl.make_block_ptr(x_ptr, (n,), (1,), (tl.program_id(0) * BLOCK,), (BLOCK,), (0,))
    dst = out_ptr + offs
    x = tl.load(src, boundary_check=(0,))
    y = x * 2
    {EXTRA}
    tl.store(dst, y, mask=offs < n)


def run(x, out):
    n = out.numel()
    k[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out
"""
EXTRA_LINE = 13
DEF_LINE = 7


def line_of(source: str, needle: str) -> int:
    hits = [i for i, line in enumerate(source.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def summary(hazards) -> list[tuple[int, str, str]]:
    return [(h.line, h.severity, h.code) for h in hazards]


def triton_with(extra: str) -> str:
    return TRITON.replace("{EXTRA}", extra)


def test_template_line_numbers():
    src = triton_with("MARK = 0")
    assert line_of(src, "MARK") == EXTRA_LINE
    assert line_of(src, "def k(") == DEF_LINE


def test_clean_kernel_has_no_hazards():
    """The template itself is clean (it loads a block pointer, stores through a tensor of pointers),
    so each case below triggers exactly one hazard."""
    assert scan(triton_with("pass"), "triton") == []


# --------------------------------------------------------------------------- unsupported ops

UNSUPPORTED_CASES = {
    "inline_asm_elementwise": 'y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [y], dtype=tl.float32, is_pure=True, pack=1)',
    "gather": "y = tl.gather(y, offs % BLOCK, 0)",
    "extern_elementwise": 'y = tl.extern_elementwise("", "", [y], {(tl.float32,): ("__nv_expf", tl.float32)}, is_pure=True)',
    "dot_scaled": 'y = tl.dot_scaled(y, None, "e4m3", y, None, "e4m3")',
    "map_elementwise": "y = tl.map_elementwise(tl.abs, y)",
    "erf": "y = libdevice.erf(y)",
    "unsplat": "y = tl.unsplat(y)",
}


def test_every_unsupported_op_has_a_case():
    assert set(UNSUPPORTED_CASES) == set(UNSUPPORTED_TRITON)


@pytest.mark.parametrize("op", sorted(UNSUPPORTED_CASES))
def test_unsupported_triton_op_is_an_error_on_its_line(op):
    hz = scan(triton_with(UNSUPPORTED_CASES[op]), "triton")
    assert summary(hz) == [(EXTRA_LINE, "error", f"unsupported:{op}")]
    assert hz[0].message == UNSUPPORTED_TRITON[op]
    assert str(hz[0]).startswith(f"line {EXTRA_LINE}: error: unsupported:{op}: ")


def test_unsupported_ops_named_for_the_acceptance_criteria():
    for op in ("inline_asm_elementwise", "gather", "extern_elementwise"):
        assert summary(scan(triton_with(UNSUPPORTED_CASES[op]), "triton")) == [(EXTRA_LINE, "error", f"unsupported:{op}")]


def test_unsupported_triton_ops_do_not_apply_to_cutile():
    # ct.gather is a cuTile op, not tt.gather
    src = """\
import cuda.tile as ct


@ct.kernel
def k(x, idx, out, TILE: ct.Constant[int]):
    i = ct.load(idx, index=(0,), shape=(TILE,))
    ct.store(out, index=(0,), tile=ct.gather(x, i))
"""
    assert scan(src, "cutile") == []


def test_unsupported_ops_outside_kernels_are_ignored():
    src = triton_with("pass").replace("    return out\n", "    out.copy_(torch.gather(x, 0, x.long()))\n    return out\n")
    assert "torch.gather" in src
    assert scan(src, "triton") == []


def test_multiline_call_is_reported_at_its_first_line():
    src = triton_with("y = tl.gather(\n        y,\n        offs % BLOCK,\n        0)")
    assert summary(scan(src, "triton")) == [(EXTRA_LINE, "error", "unsupported:gather")]


# --------------------------------------------------------------------------- cross-block atomics

ATOMIC_NAMES = ["atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas"]


def test_every_atomic_is_covered():
    assert set(ATOMIC_NAMES) == ATOMICS


@pytest.mark.parametrize("name", ATOMIC_NAMES)
def test_cross_block_atomic_is_a_warning(name):
    hz = scan(triton_with(f"tl.{name}(dst, y)"), "triton")
    assert summary(hz) == [(EXTRA_LINE, "warning", "cross-block-atomic")]
    assert name in hz[0].message and "unordered" in hz[0].message


def test_cutile_atomic_is_a_warning():
    src = """\
import cuda.tile as ct


@ct.kernel
def k(x, out, TILE: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0),), shape=(TILE,))
    ct.atomic_add(out, (0,), ct.sum(t))
"""
    assert summary(scan(src, "cutile")) == [(7, "warning", "cross-block-atomic")]


# --------------------------------------------------------------------------- aliasing


def test_aliasing_through_a_local_pointer_variable():
    src = """\
import triton
import triton.language as tl


@triton.jit
def scale_inplace(x_ptr, n, stride, BLOCK: tl.constexpr):
    row = x_ptr + tl.program_id(0) * stride
    p = row + tl.arange(0, BLOCK)
    x = tl.load(p)
    tl.store(p, x * 2)
"""
    hz = scan(src, "triton")
    # p is pointer arithmetic: its load is a tensor-of-pointer one too
    assert summary(hz) == [(6, "info", "tensor-of-pointer"), (10, "warning", "aliasing")]
    assert "`x_ptr`" in hz[1].message
    assert "(line 9)" in hz[1].message


def test_aliasing_on_a_parameter_also_reports_tensor_of_pointer():
    src = """\
import triton
import triton.language as tl


@triton.jit
def relu_inplace(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, tl.maximum(x, 0), mask=offs < n)
"""
    assert summary(scan(src, "triton")) == [(6, "info", "tensor-of-pointer"), (9, "warning", "aliasing")]


def test_aliasing_through_a_block_pointer():
    src = """\
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    bp = tl.make_block_ptr(x_ptr, (n,), (1,), (0,), (BLOCK,), (0,))
    x = tl.load(bp)
    tl.store(tl.advance(bp, (BLOCK,)), x)
"""
    assert summary(scan(src, "triton")) == [(9, "warning", "aliasing")]


def test_aliasing_through_a_block_pointer_made_with_keywords():
    src = """\
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    bp = tl.make_block_ptr(base=x_ptr, shape=(n,), strides=(1,), offsets=(0,), block_shape=(BLOCK,), order=(0,))
    x = tl.load(bp)
    tl.store(bp, x)
"""
    assert summary(scan(src, "triton")) == [(9, "warning", "aliasing")]


def test_cutile_aliasing():
    src = """\
import cuda.tile as ct


@ct.kernel
def k(x, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    t = ct.load(x, index=(bid,), shape=(TILE,))
    ct.store(x, index=(bid,), tile=t * 2)
"""
    hz = scan(src, "cutile")
    assert summary(hz) == [(8, "warning", "aliasing")]
    assert "`x`" in hz[0].message and "(line 7)" in hz[0].message


def test_different_buffers_do_not_alias():
    src = """\
import cuda.tile as ct


@ct.kernel
def k(x, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    t = ct.load(x, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=t * 2)
"""
    assert scan(src, "cutile") == []


# --------------------------------------------------------------------------- barrier, tensor of pointers


def test_debug_barrier_is_a_warning():
    hz = scan(triton_with("tl.debug_barrier()"), "triton")
    assert summary(hz) == [(EXTRA_LINE, "warning", "barrier-ordering")]


def test_tensor_of_pointer_load_is_info_on_the_def_line():
    src = triton_with("z = tl.load(x_ptr + offs + 1, mask=offs < n)")
    hz = scan(src, "triton")
    assert summary(hz) == [(DEF_LINE, "info", "tensor-of-pointer")]
    assert hz[0].message.startswith("k: 1 tensor-of-pointer load(s)")


def test_tensor_of_pointer_counts_every_load():
    src = triton_with("z = tl.load(x_ptr + offs)\n    w = tl.load(out_ptr + offs)")
    hz = scan(src, "triton")
    # out_ptr is loaded (line 14) and stored through dst: that is aliasing too
    assert summary(hz) == [(DEF_LINE, "info", "tensor-of-pointer"), (15, "warning", "aliasing")]
    assert hz[0].message.startswith("k: 2 tensor-of-pointer load(s)")


def test_tensor_of_pointer_through_a_local_pointer_variable():
    src = triton_with("ptrs = x_ptr + offs\n    z = tl.load(ptrs, mask=offs < n)")
    hz = scan(src, "triton")
    assert summary(hz) == [(DEF_LINE, "info", "tensor-of-pointer")]
    assert hz[0].message.startswith("k: 1 tensor-of-pointer load(s)")


def test_tensor_of_pointer_through_several_assignments():
    src = triton_with("row = x_ptr + 1\n    ptrs = row + offs\n    same = ptrs\n    z = tl.load(same)")
    assert summary(scan(src, "triton")) == [(DEF_LINE, "info", "tensor-of-pointer")]


def test_tensor_of_pointer_advanced_by_augmented_assignment():
    """The matmul idiom: a pointer tensor loaded in a loop and advanced with `+=`; one load site."""
    loop = "ptrs = x_ptr + offs\n    for _ in range(4):\n        z = tl.load(ptrs)\n        ptrs += BLOCK"
    hz = scan(triton_with(loop), "triton")
    assert summary(hz) == [(DEF_LINE, "info", "tensor-of-pointer")]
    assert hz[0].message.startswith("k: 1 tensor-of-pointer load(s)")


def test_alias_of_a_parameter_offset_in_place_is_a_tensor_of_pointer():
    src = triton_with("p = x_ptr\n    p += offs\n    z = tl.load(p)")
    assert summary(scan(src, "triton")) == [(DEF_LINE, "info", "tensor-of-pointer")]


def test_tensor_of_pointer_through_tuple_unpacking():
    src = triton_with("p, q = x_ptr + offs, x_ptr\n    z = tl.load(p)")
    assert summary(scan(src, "triton")) == [(DEF_LINE, "info", "tensor-of-pointer")]


def test_binding_in_a_nested_block_read_before_it_in_walk_order():
    """`ast.walk` meets `p = row` (top level) before `row = ...` (in the branch)."""
    branch = ("if n > BLOCK:\n        row = x_ptr + BLOCK\n    else:\n        row = x_ptr + 0\n"
              "    p = row\n    z = tl.load(p)")
    assert summary(scan(triton_with(branch), "triton")) == [(DEF_LINE, "info", "tensor-of-pointer")]


def test_aliasing_through_a_binding_in_a_nested_block():
    branch = "if n > BLOCK:\n        row = out_ptr + 0\n    p = row\n    z = tl.load(p)"
    hz = scan(triton_with(branch), "triton")
    assert [h for h in summary(hz) if h[2] == "aliasing"] == [(EXTRA_LINE + 4, "warning", "aliasing")]
    assert "`out_ptr`" in hz[-1].message


@pytest.mark.parametrize("extra", [
    "z = tl.load(x_ptr)",
    "p = x_ptr\n    z = tl.load(p)",
    "z = tl.load(tl.advance(src, (BLOCK,)), boundary_check=(0,))",
    "bp = tl.advance(src, (BLOCK,))\n    bp = tl.advance(bp, (BLOCK,))\n    z = tl.load(bp, boundary_check=(0,))",
    "desc = tl.make_tensor_descriptor(x_ptr, shape=[n], strides=[1], block_shape=[BLOCK])\n    z = desc.load([0])",
    "desc = tl.make_tensor_descriptor(x_ptr, [n], [1], [BLOCK])\n    start = tl.program_id(0) * BLOCK\n"
    "    z = desc.load(start)",
], ids=["bare-parameter", "alias-of-a-parameter", "advance", "block-pointer-name", "descriptor", "descriptor-offsets"])
def test_loads_that_are_not_tensor_of_pointer(extra):
    assert scan(triton_with(extra), "triton") == []


def test_cutile_loads_are_not_tensor_of_pointer():
    src = """\
import cuda.tile as ct


@ct.kernel
def k(x, out, TILE: ct.Constant[int]):
    t = ct.load(x + 0, index=(ct.bid(0),), shape=(TILE,))
    ct.store(out, index=(ct.bid(0),), tile=t)
"""
    assert scan(src, "cutile") == []


def test_matmul_reference_reports_its_pointer_loads():
    """kernels/matmul/matmul_triton.py loads only through `a_ptrs`/`b_ptrs`, advanced with `+=`."""
    source = (REPO_ROOT / "kernels/matmul/matmul_triton.py").read_text()
    (hz,) = [h for h in scan(source, "triton") if h.code == "tensor-of-pointer"]
    assert hz.line == line_of(source, "def matmul_kernel(")
    assert hz.message.startswith(f"matmul_kernel: {source.count('tl.load(')} tensor-of-pointer load(s)")


def test_hazards_are_sorted_by_line():
    src = triton_with("y = tl.gather(y, offs % BLOCK, 0)\n    tl.debug_barrier()\n    tl.atomic_add(dst, y)")
    assert summary(scan(src, "triton")) == [(EXTRA_LINE, "error", "unsupported:gather"),
                                            (EXTRA_LINE + 1, "warning", "barrier-ordering"),
                                            (EXTRA_LINE + 2, "warning", "cross-block-atomic")]


def test_to_json():
    (h,) = scan(triton_with("tl.debug_barrier()"), "triton")
    assert h.to_json() == {"line": EXTRA_LINE, "severity": "warning", "code": "barrier-ordering", "message": h.message}


# --------------------------------------------------------------------------- reference kernels

REFERENCE = sorted(REPO_ROOT.glob("kernels/*/*_triton.py")) + sorted(REPO_ROOT.glob("kernels/*/*_cutile.py"))


def test_reference_kernels_exist():
    assert REFERENCE


@pytest.mark.parametrize("path", REFERENCE, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_reference_kernels_have_no_error_or_warning_hazards(path):
    language = "cutile" if path.name.endswith("_cutile.py") else "triton"
    bad = [str(h) for h in scan(path.read_text(), language) if h.severity in ("error", "warning")]
    assert bad == []
