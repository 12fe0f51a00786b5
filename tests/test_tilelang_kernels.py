"""The suite's TileLang first versions at the shapes their specs use. The matmul's entry point hands its
kernel rows of 16-byte multiples at every shape (the odd benchmark shape 4095x4097x4096, the spec's odd
correctness shapes, a drawn-like odd shape), padding K and N only where they are not, with C unchanged
(checked on the CPU with a stand-in for the compiled kernel); the slow tier builds the kernel ahead of
time for sm_90a at those shapes and reads its CUDA source for cp.async copies narrower than 16 bytes.
The softmax asks for one kernel per dtype and row alignment across its spec's shapes, not one per
shape; the slow tier builds them and finds the 16-byte loads where the rows allow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from loop.common import tilelang_install
from loop.common.spec import load_module

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ROOT / "kernels" / "matmul" / "matmul_tilelang.py"
SPEC = load_module("matmul_spec_for_tilelang", ROOT / "kernels" / "matmul" / "spec.py")
ODD_BENCHMARK = (4095, 4097, 4096)
DRAWN_LIKE = (300, 301, 302)  # (M, N, K): N odd, K two elements past a multiple of 8 (4-byte rows apart)
ALIGNED = (256, 192, 320)
needs_tilelang = pytest.mark.skipif(not tilelang_install.status()["importable"],
                                    reason=f"tilelang: {tilelang_install.status()['reason']} (CI installs the extra)")


class StandIn:
    """The compiled kernel as the entry point meets it, on the CPU: records the shapes of its operands
    and, when asked, computes C = A @ B in fp32 (what the TileLang kernel does on the GPU)."""

    def __init__(self, compute: bool):
        self.compute, self.calls = compute, []

    def __call__(self, M, N, K, *config):
        def kernel(a, b, c):
            self.calls.append((tuple(a.shape), tuple(b.shape), tuple(c.shape)))
            assert (tuple(a.shape), tuple(b.shape), tuple(c.shape)) == ((M, K), (K, N), (M, N))
            if self.compute:
                c.copy_((a.float() @ b.float()).to(c.dtype))
        return kernel


@pytest.fixture(scope="module")
def matmul_module():
    return load_module("matmul_tilelang_entry", MATMUL)


@pytest.fixture
def entry(matmul_module, monkeypatch):
    """The matmul first version with its kernel replaced by a stand-in."""
    def with_kernel(stand_in: StandIn):
        monkeypatch.setattr(matmul_module, "matmul", stand_in)
        return matmul_module
    return with_kernel


@needs_tilelang
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [*SPEC.CORRECTNESS_SHAPES, DRAWN_LIKE, ALIGNED], ids=str)
def test_the_matmul_entry_point_is_right_at_odd_shapes_with_16_byte_rows(entry, shape, dtype):
    stand_in = StandIn(compute=True)
    module = entry(stand_in)
    inputs = SPEC.make_inputs(shape, getattr(torch, dtype), 0, "cpu")
    got = module.run(**inputs)
    (a_shape, b_shape, _), = stand_in.calls
    assert got is inputs["out"] and got.shape == (shape[0], shape[1])
    assert a_shape[1] * 2 % 16 == 0 and b_shape[1] * 2 % 16 == 0, stand_in.calls
    assert a_shape[1] - shape[2] < 8 and b_shape[1] - shape[1] < 8  # padded to the next multiple, no further
    want = (inputs["a"].float() @ inputs["b"].float()).to(got.dtype)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@needs_tilelang
def test_the_matmul_entry_point_pads_only_where_a_row_is_not_16_bytes(entry):
    stand_in = StandIn(compute=False)
    module = entry(stand_in)
    for m, n, k in (ODD_BENCHMARK, (4096, 4096, 4096)):
        a, b = torch.empty((m, k), dtype=torch.bfloat16), torch.empty((k, n), dtype=torch.bfloat16)
        module.run(a, b, torch.empty((m, n), dtype=torch.bfloat16))
    assert stand_in.calls == [((4095, 4096), (4096, 4104), (4095, 4104)),
                              ((4096, 4096), (4096, 4096), (4096, 4096))]


def narrow_cp_async(source: str) -> list[str]:
    """The cp.async copies in a kernel's CUDA source that move fewer than 16 bytes."""
    return [m.group(0) for m in re.finditer(r"cp_async_gs(?:_conditional)?<(\d+)>", source) if int(m.group(1)) < 16]


@pytest.mark.slow
@needs_tilelang
def test_the_matmul_compiles_for_sm_90a_at_odd_shapes_with_16_byte_copies():
    """The compile gate's build (`tilelang_compile`, sm_90a, no GPU) of the entry point at the odd
    benchmark shape, a drawn-like odd shape and an aligned one: each kernel built, its operands' rows
    16-byte multiples, no cp.async narrower than 16 bytes in its source."""
    from loop.worker.tilelang_build import tilelang_compile

    for m, n, k in (ODD_BENCHMARK, DRAWN_LIKE, ALIGNED):
        held = {}

        def call(module):
            a, b = torch.empty((m, k), dtype=torch.bfloat16), torch.empty((k, n), dtype=torch.bfloat16)
            module.run(a, b, torch.empty((m, n), dtype=torch.bfloat16))
            held.update(module.matmul._kernel_cache)

        rows = tilelang_compile(torch, lambda: load_module(f"matmul_{m}_{n}_{k}", MATMUL), call, 90)
        assert [(r["kernel"], r["target"]) for r in rows] == [("matmul", "sm_90a")] and rows[0]["cubin_bytes"] > 0
        (compiled,) = held.values()
        shapes = [tuple(int(d) for d in p.shape) for p in compiled.kernel.params]
        assert all(s[1] * 2 % 16 == 0 for s in shapes), shapes
        assert narrow_cp_async(compiled.kernel.get_kernel_source()) == [], (m, n, k)


SOFTMAX = ROOT / "kernels" / "softmax" / "softmax_tilelang.py"
ELEMENTWISE = {  # op -> (its kernel's name, what the stand-in computes, two drawn-like shapes)
    "softmax": ("softmax", lambda x, out: out.copy_(torch.softmax(x.float(), dim=-1)), [(3, 1001), (7, 3000)]),
    "vector_add": ("vector_add", lambda x, y, out: out.copy_(x + y), [(1001,), (3000,)]),
}


@needs_tilelang
@pytest.mark.parametrize("op", ELEMENTWISE)
def test_a_memory_bound_first_version_compiles_two_kernels_per_dtype_across_the_spec_shapes(op, monkeypatch):
    """Its sizes are dynamic: over every shape the spec lists (and two drawn-like ones), the entry point
    asks TileLang for one kernel per dtype and alignment, not one per shape (as it did with its sizes as
    constants), and the vector width it states divides the row length at every call."""
    name, compute, drawn_like = ELEMENTWISE[op]
    module = load_module(f"{op}_tilelang_entry", ROOT / "kernels" / op / f"{op}_tilelang.py")
    spec = load_module(f"{op}_spec_for_tilelang", ROOT / "kernels" / op / "spec.py")
    asked = []

    def compile_call(*config):
        asked.append(config)
        return compute

    monkeypatch.setattr(module, name, compile_call)
    shapes = spec.CORRECTNESS_SHAPES + spec.BENCHMARK_SHAPES[:1] + drawn_like
    for dtype in spec.DTYPES:
        for shape in shapes:
            inputs = spec.make_inputs(shape, getattr(torch, dtype), 0, "cpu")
            out = module.run(**inputs)
            torch.testing.assert_close(out, spec.reference(**inputs).to(out.dtype))
            *_, vector = asked[-1]
            assert shape[-1] % vector == 0 and vector * out.element_size() <= 16, asked[-1]
    kernels = set(asked)
    assert len(kernels) <= 2 * len(spec.DTYPES) < len(shapes) * len(spec.DTYPES), kernels
    assert {k[-1] for k in kernels} == {1, 8, 4}  # the 16-byte width where the rows allow, 1 elsewhere


@pytest.mark.slow
@needs_tilelang
def test_the_softmax_builds_one_kernel_per_row_alignment_for_sm_90a(monkeypatch):
    """The compile gate's build at three bf16 shapes, two of them with rows of 16-byte multiples: two
    kernels, the aligned one loading 16 bytes at a time (at a block of 8 elements per thread)."""
    from loop.worker.tilelang_build import tilelang_compile

    held = {}

    def call(module):
        module.BLOCK = 1024
        for shape in ((33, 1000), (8192, 1024), (64, 2053)):
            x = torch.empty(shape, dtype=torch.bfloat16)
            module.run(x, torch.empty_like(x))
        held.update(module.softmax._kernel_cache)

    rows = tilelang_compile(torch, lambda: load_module("softmax_aot", SOFTMAX), call, 90)
    assert [r["kernel"] for r in rows] == ["softmax", "softmax"] and all(r["cubin_bytes"] > 0 for r in rows)
    wide = {key[0][3]: "uint4" in compiled.kernel.get_kernel_source() for key, compiled in held.items()}
    assert wide == {8: True, 1: False}
