"""The `triton-tensor-descriptor` recipe (tiled pointer blocks -> TMA tensor descriptors).

Golden rewrites of the reference matmul (plain, autotuned, grouped, tutorial-style loop), the
patterns it refuses and why, the dispatch helper on real tensors, and its place in the priority
order. Marked slow: the rewritten matmul passes its spec in the Triton interpreter through the
worker (the twin on aligned shapes, the pointer kernel on odd ones), every autotune config of
the autotuned rewrite passes there too, and both compile for sm_90 and sm_100 through
`tileloop compile`, with TMA instructions in the SASS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import playbook
from playbook import next_candidate
from playbook.analysis import TRITON_PRIORITY, analyze
from tests.conftest import materialise, section

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
RID = "triton-tensor-descriptor"
MATMUL = (KERNELS / "matmul" / "matmul_triton.py").read_text()


def cands(source: str, recipe_id: str = RID):
    return playbook.get(recipe_id).candidates(source, analyze(source))


def rewrite(source: str) -> str:
    (c,) = cands(source)
    return c.source


def reason(source: str) -> str:
    return playbook.get(RID).skip_reason(source, analyze(source))


# --------------------------------------------------------------------------- golden rewrites

MATMUL_TWIN = '''\
# matmul_kernel through tensor descriptors (TMA): the same tiles; the descriptors handle the bounds
@triton.jit
def matmul_kernel_tma(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])
        b = b_desc.load([k0, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


'''

HELPERS = '''\
def _tma_ready(t, *strides):
    """Whether a tensor descriptor (TMA) can address `t` with these strides (the kernel's, in
    elements): a 16-byte aligned base, 16-byte aligned leading strides, a contiguous last one."""
    size = t.element_size()
    return (t.numel() > 0 and t.data_ptr() % 16 == 0 and strides[-1] == 1
            and all(s * size % 16 == 0 for s in strides[:-1]))


def _tma_scratch(size, alignment, stream):
    """Global memory for the descriptors the kernel builds on the device (Triton asks at launch)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


'''

MATMUL_RUN = '''\
def run(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    # tensor descriptors need 16-byte aligned bases and leading strides and a contiguous last
    # dimension; other layouts (odd sizes, transposed views) take the pointer kernel
    if (_tma_ready(a, a.stride(0), a.stride(1))
            and _tma_ready(b, b.stride(0), b.stride(1))
            and _tma_ready(out, out.stride(0), out.stride(1))):
        triton.set_allocator(_tma_scratch)  # global memory for the descriptors
        matmul_kernel_tma[grid](a, b, out, M, N, K,
                                a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    else:
        matmul_kernel[grid](a, b, out, M, N, K,
                            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
'''


def test_matmul_rewrite_is_exact():
    (c,) = cands(MATMUL)
    assert (c.recipe, c.kind, c.key) == (RID, "tma", f"{RID}:matmul_kernel")
    assert c.title == "matmul_kernel: tensor descriptors (TMA) for a_ptr, b_ptr, c_ptr"
    assert c.hypothesis.startswith("matmul_kernel: loads of a_ptr, b_ptr; stores to c_ptr through tensor descriptors")
    new = c.source
    twin = section(new, "# matmul_kernel through", "def _tma_ready")
    helpers = section(new, "def _tma_ready", "def run(")
    assert twin == MATMUL_TWIN
    assert helpers == HELPERS
    assert new[new.index("def run("):] == MATMUL_RUN
    # everything else is the original file, plus `import torch` for the scratch allocator
    rest = new.replace(twin, "").replace(helpers, "").replace(MATMUL_RUN, "").replace("import torch\n", "", 1)
    assert rest == MATMUL[:MATMUL.index("def run(")]
    assert new.index("import torch\n") < new.index("import triton\n")


def test_autotuned_matmul_gets_a_twin_with_the_same_autotune_space():
    tuned = cands(MATMUL, "triton-autotune")[0].source
    new = rewrite(tuned)
    decorator = section(tuned, "@triton.autotune(", "@triton.jit")
    twin = section(new, "# matmul_kernel through", "def _tma_ready")
    assert twin.count(decorator) == 1 and new.count(decorator) == 2
    # the same kernel body as the rewrite of the plain kernel: block shapes come from the config
    assert twin.replace(decorator, "") == MATMUL_TWIN
    run = new[new.index("def run("):]
    assert 'grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))' in run
    assert "        matmul_kernel_tma[grid](a, b, out, M, N, K,\n" in run
    assert "        matmul_kernel[grid](a, b, out, M, N, K,\n" in run
    assert "BLOCK_M=" not in run and "num_warps" not in run
    # the tuned matmul is the usual input in a run (autotune comes first): TMA is proposed next
    c = next_candidate(tuned, analyze(tuned), tried=[], demoted=[])
    assert c.key == f"{RID}:matmul_kernel"


TUTORIAL = MATMUL.replace("""\
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
""", """\
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0)
""").replace("""\
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
""", """\
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + stride_cm * offs_m[:, None] + offs_n[None, :] * stride_cn, acc, mask=c_mask)
""")


def test_tile_counting_loop_and_an_inline_store_with_a_named_mask():
    assert TUTORIAL != MATMUL
    twin = section(rewrite(TUTORIAL), "# matmul_kernel through", "def _tma_ready")
    assert twin.endswith("""\
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)


""")
    for gone in ("c_mask", "offs_m", "offs_k", "tl.load", "tl.store", "+="):
        assert gone not in twin


def test_grouped_matmul_keeps_its_program_order_in_the_twin():
    grouped = cands(MATMUL, "grouped-ordering")[0].source
    new = rewrite(grouped)
    twin = section(new, "# matmul_kernel through", "def _tma_ready")
    order = section(grouped, "    # grouped ordering", "    offs_m = ")
    assert order in twin and "GROUP_SIZE_M: tl.constexpr" in twin
    assert "a = a_desc.load([pid_m * BLOCK_M, k0])" in twin
    assert new.count("GROUP_SIZE_M=GROUP_SIZE_M") == 2  # both launches


BIAS = MATMUL.replace("def matmul_kernel(a_ptr, b_ptr, c_ptr,", "def matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr,").replace(
    "    c_ptrs = c_ptr", "    acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]\n    c_ptrs = c_ptr").replace(
    "def run(a, b, out):", "def run(a, b, bias, out):").replace("matmul_kernel[grid](a, b, out,", "matmul_kernel[grid](a, b, out, bias,")


def test_accesses_it_does_not_recognise_stay_pointer_accesses():
    new = rewrite(BIAS)
    twin = section(new, "# matmul_kernel through", "def _tma_ready")
    assert "    acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]\n" in twin
    assert "    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)\n" in twin  # still read by the bias load
    assert "offs_m" not in twin and twin.count("make_tensor_descriptor") == 3
    assert "_tma_ready(bias" not in new  # only the tensors that become descriptors are checked


def replaced(old: str, new: str, source: str = MATMUL) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


LOAD_A = "        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)\n"
STORE_C = "    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))\n"


def test_partly_recognised_kernels_rewrite_the_rest():
    source = replaced(LOAD_A, LOAD_A.replace("other=0.0", "other=float('-inf')"))
    twin = section(rewrite(source), "# matmul_kernel through", "def _tma_ready")
    assert "        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=float('-inf'))\n" in twin
    assert "        a_ptrs += BLOCK_K * stride_ak\n" in twin and "k_ok = (k0 + offs_k) < K" in twin
    assert "        b = b_desc.load([k0, pid_n * BLOCK_N])\n" in twin and "c_desc.store(" in twin


# A 2-D tile reduction: one tile load, and a 1-D store that stays a pointer store.
TILE_SUM = """\
import triton
import triton.language as tl


@triton.jit
def tile_sum_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        n_ok = (n0 + offs_n) < N
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & n_ok[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32), 1)
        x_ptrs += BLOCK_N * stride_xn
    tl.store(out_ptr + offs_m, acc, mask=offs_m < M)


def run(x, out):
    M, N = x.shape
    tile_sum_kernel[(triton.cdiv(M, 64),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=64, BLOCK_N=64)
    return out
"""
LOAD_X = "        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & n_ok[None, :], other=0.0)\n"


def test_tile_reduction_rewrite_is_exact():
    new = rewrite(TILE_SUM)
    assert section(new, "# tile_sum_kernel through", "def _tma_ready") == """\
# tile_sum_kernel through tensor descriptors (TMA): the same tiles; the descriptors handle the bounds
@triton.jit
def tile_sum_kernel_tma(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_N])
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        x = x_desc.load([pid * BLOCK_M, n0])
        acc += tl.sum(x.to(tl.float32), 1)
    tl.store(out_ptr + offs_m, acc, mask=offs_m < M)


"""
    assert new[new.index("def run("):] == """\
def run(x, out):
    M, N = x.shape
    # tensor descriptors need 16-byte aligned bases and leading strides and a contiguous last
    # dimension; other layouts (odd sizes, transposed views) take the pointer kernel
    if _tma_ready(x, x.stride(0), x.stride(1)):
        triton.set_allocator(_tma_scratch)  # global memory for the descriptors
        tile_sum_kernel_tma[(triton.cdiv(M, 64),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=64, BLOCK_N=64)
    else:
        tile_sum_kernel[(triton.cdiv(M, 64),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=64, BLOCK_N=64)
    return out
"""
    assert new.startswith("import torch\nimport triton\n")


@pytest.mark.parametrize("old,new,why", [
    (LOAD_X, LOAD_X.replace("other=0.0", "other=float('-inf')"),
     "a load of `x_ptrs` fills masked elements with `float('-inf')`; a descriptor fills zeros"),
    (LOAD_X, LOAD_X.replace("other=0.0", "other=0.0, eviction_policy='evict_first'"),
     "an access to `x_ptrs` sets eviction_policy, which descriptor accesses (Triton 3.6) do not take"),
    (LOAD_X, LOAD_X.replace(" & n_ok[None, :]", ""),
     "an access to `x_ptrs` does not bound `offs_n` by its mask: the extent is unknown"),
    (LOAD_X, LOAD_X.replace("n_ok[None, :]", "n_ok[None, :] & (offs_m[:, None] >= 0)"),
     "mask term `(offs_m[:, None] >= 0)` of `x_ptrs` is not a bound `offsets < size`"),
    (LOAD_X, LOAD_X.replace("offs_m[:, None] < M", "offs_m[:, None] < pid"),
     "the bound `pid` of `x_ptrs` is not a kernel argument or constant"),
    ("        n_ok = (n0 + offs_n) < N\n", "        n_ok = (n0 + offs_n) < N\n        x_ptrs += BLOCK_N * stride_xn\n",
     "`x_ptrs` is moved more than once"),
    ("        x_ptrs += BLOCK_N * stride_xn\n", "        x_ptrs += 8 * stride_xn\n",
     "`x_ptrs` moves along its last dimension by `8`, not a multiple of `BLOCK_N`"),
    ("    offs_n = tl.arange(0, BLOCK_N)\n", "    offs_n = 4 + tl.arange(0, BLOCK_N)\n",
     "`x_ptrs`: the column start `4` is not a multiple of `BLOCK_N`"),
    ("range(0, N, BLOCK_N)", "range(0, N, 2 * BLOCK_N)",
     "the loop steps by `2 * BLOCK_N` while `x_ptrs` moves by `BLOCK_N`"),
    ("        acc += tl.sum(x.to(tl.float32), 1)\n",
     "        acc += tl.sum(x.to(tl.float32), 1)\n        if n0 > N:\n            break\n",
     "the loop advancing `x_ptrs` has `continue` or `break`"),
    ("    tl.store(out_ptr", "    acc += tl.sum(tl.load(x_ptrs, mask=offs_m[:, None] < M, other=0.0), 1)\n    tl.store(out_ptr",
     "`x_ptrs` is accessed after the loop that advances it"),
    ("    acc = tl.zeros", "    tl.static_print(x_ptrs)\n    acc = tl.zeros",
     "`x_ptrs` is used other than by loads, stores and `+=`"),
    ("x_ptrs = x_ptr + offs_m[:, None] * stride_xm", "x_ptrs = x_ptr + 64 + offs_m[:, None] * stride_xm",
     "`x_ptrs` is not a 2-D pointer block"),
])
def test_refuses_accesses_it_cannot_rewrite_exactly(old, new, why):
    source = replaced(old, new, TILE_SUM)
    assert cands(source) == []
    text = reason(source)
    assert text.startswith("tile_sum_kernel: no load or store it can rewrite: ") and why in text, text
    assert "`out_ptr + offs_m` is a 1-D access (the recipe rewrites 2-D tiles)" in text


@pytest.mark.parametrize("source,why", [
    (replaced(STORE_C, STORE_C + "    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty) + tl.load(c_ptrs))\n"),
     "matmul_kernel loads and stores the same buffer"),
    (replaced("    return out\n", "    matmul_kernel[grid](a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),\n"
              "                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)\n    return out\n"),
     "matmul_kernel is launched 2 times (one launch expected)"),
    (replaced("import triton.language as tl\n", "from triton import language as tl\n"),
     "needs `import triton` and `import triton.language as tl`"),
])
def test_refuses_kernels_it_cannot_rewrite_safely(source, why):
    assert cands(source) == []
    assert why in reason(source)


def test_launch_arguments_it_cannot_see_stop_the_rewrite():
    source = replaced("a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),",
                      "*a.stride(), *b.stride(), *out.stride(),")
    assert cands(source) == []
    assert reason(source) == "the launch of matmul_kernel does not show the arguments for stride_am, stride_ak"


def test_on_the_reference_suite_only_matmul_is_rewritten():
    proposed, reasons = {}, {}
    for target in sorted(KERNELS.glob("*/*_triton.py")):
        source = target.read_text()
        proposed[target.stem] = [c.key for c in cands(source)]
        reasons[target.stem] = reason(source)
    assert proposed.pop("matmul_triton") == [f"{RID}:matmul_kernel"]
    assert all(v == [] for v in proposed.values()), proposed
    # attention: per-(batch, head) bases the launch cannot check; the row kernels: 1-D accesses
    assert "starts from `q_base`, not from a pointer argument" in reasons["attention_triton"]
    for op in ("vector_add", "softmax", "layernorm", "rmsnorm", "row_sum", "silu_mul"):
        assert "is a 1-D access" in reasons[f"{op}_triton"], reasons[f"{op}_triton"]
    assert playbook.get(RID).candidates((KERNELS / "matmul" / "matmul_cutile.py").read_text(),
                                         analyze((KERNELS / "matmul" / "matmul_cutile.py").read_text())) == []


def test_a_rewritten_kernel_is_not_rewritten_again():
    new = rewrite(MATMUL)
    assert cands(new) == []
    assert reason(new) == ("matmul_kernel already has a tensor-descriptor twin; "
                           "matmul_kernel_tma already builds tensor descriptors")


def test_dispatch_helper_on_real_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    from loop.worker.failures import load_module

    path = tmp_path / "matmul_triton.py"
    path.write_text(rewrite(MATMUL))
    ready = load_module("tma_candidate", path)._tma_ready

    def ok(t):
        return ready(t, *t.stride())

    half = torch.zeros((256, 320), dtype=torch.float16)
    assert ok(half)
    assert not ok(torch.zeros((17, 65), dtype=torch.float16))  # row stride 130 bytes
    assert ok(torch.zeros((17, 68), dtype=torch.float32))  # 272 bytes
    assert not ok(half.t())  # transposed: the last stride is not 1
    assert not ok(half[:, 1:])  # base 2 bytes off
    assert ok(half[:, 8:])  # base 16 bytes off, same strides
    assert not ok(torch.zeros((0, 64), dtype=torch.float16))
    # the kernel's strides decide, not the tensor's: passing a transposed view's strides is refused
    assert not ready(half, half.stride(1), half.stride(0))


def test_priority_puts_tma_right_after_autotune_for_dot_kernels():
    order = TRITON_PRIORITY["dot"]
    # only Tile IR configs (proposed on tileir runs only) may sit between the autotune space and TMA
    assert set(order[order.index("autotune") + 1:order.index("tma")]) <= {"tileir-configs"}
    assert order.index("tma") < order.index("grouped-ordering")
    an = analyze(MATMUL)
    tried, kinds = [], []
    while len(kinds) < 2 and (c := next_candidate(MATMUL, an, tried, [])) is not None:
        tried.append(c.key)
        kinds.append(c.kind)
    assert kinds == ["autotune", "tma"]


# --------------------------------------------------------------------------- slow: interpreter and AOT


@pytest.mark.slow
def test_rewritten_matmul_passes_its_spec_in_the_interpreter(tmp_path, env):
    from loop import backends
    from loop.measure.launch import run_worker
    from loop.common.settings import Settings

    target = materialise(tmp_path / "k", "matmul", "triton", rewrite(MATMUL))
    job = {"spec": str(target.parent / "spec.py"), "target_dir": str(target.parent), "device": "cpu",
           "backend": "interpreter", "impls": [{"label": "candidate", "path": str(target)}], "check": ["candidate"],
           "seed": 13, "bench": False}
    res = run_worker(tmp_path / "w", job, backends.get("interpreter"), Settings(worker_timeout_s=900), tmp_path / "cache")
    assert res["status"] == "ok", (res.get("message"), res.get("log_tail", "")[-1500:])
    checks = res["correctness"]["checks"]
    assert len(checks) >= 4 and all(c["ok"] for c in checks)
    assert res["proof"]["ran"] == "interpreter"


DISPATCH = r'''
import json, sys
from pathlib import Path
import torch
from loop.worker.failures import load_module
spec = load_module("spec_under_test", Path(sys.argv[1]))
mod = load_module("target_under_test", Path(sys.argv[2]))
ran = []

class Spy:  # records which kernel a launch used, then launches it
    def __init__(self, name, kernel):
        self.name, self.kernel = name, kernel
    def __getitem__(self, grid):
        ran.append(self.name)
        return self.kernel[grid]

mod.matmul_kernel = Spy("pointer", mod.matmul_kernel)
mod.matmul_kernel_tma = Spy("tma", mod.matmul_kernel_tma)
rows = []
for shape, layout in [((256, 192, 320), "contiguous"), ((72, 200, 104), "contiguous"), ((17, 33, 65), "contiguous"),
                      ((64, 64, 64), "b transposed")]:
    inputs = spec.make_inputs(shape, torch.float16, 5, "cpu")
    if layout == "b transposed":
        inputs["b"] = inputs["b"].t().contiguous().t()
    inputs["out"].fill_(float("nan"))
    out = mod.run(**inputs)
    ref = inputs["a"].float() @ inputs["b"].float()
    rows.append({"shape": shape, "layout": layout, "kernel": ran[-1],
                 "max_err": (out.float() - ref).abs().max().item()})
print("RESULT " + json.dumps(rows))
'''


def run_script(script: str, *args: str, cwd: Path, timeout: int = 900) -> object:
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(cwd / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_aligned_layouts_run_the_twin_and_the_others_the_pointer_kernel(tmp_path):
    target = materialise(tmp_path, "matmul", "triton", rewrite(MATMUL))
    rows = run_script(DISPATCH, str(target.parent / "spec.py"), str(target), cwd=tmp_path)
    assert [(r["shape"], r["kernel"]) for r in rows] == [
        ([256, 192, 320], "tma"), ([72, 200, 104], "tma"),  # partial tiles on every edge: descriptor bounds
        ([17, 33, 65], "pointer"), ([64, 64, 64], "pointer")]
    assert all(r["max_err"] < 2e-3 for r in rows), rows


PER_CONFIG = r'''
import json, sys
from pathlib import Path
import torch
from triton.runtime.autotuner import Autotuner
from loop.worker.correctness import Harness
from loop.common.spec import Spec
from loop.worker.failures import load_module
spec = load_module("spec_under_test", Path(sys.argv[1]))
target = load_module("target_under_test", Path(sys.argv[2]))
tuner = target.matmul_kernel_tma
assert isinstance(tuner, Autotuner)
harness = Harness(torch, Spec(torch, spec), "cpu")
checks = []
for i, cfg in enumerate(list(tuner.configs)):
    tuner.configs = [cfg]  # one config: the autotuner runs it without benchmarking (none is possible here)
    tuner.cache.clear()
    rec = harness.check_one(target, "candidate", (256, 192, 320), "float16", 100 + i)
    checks.append({"config": str(cfg), "ok": rec["ok"], "reason": rec.get("reason")})
print("RESULT " + json.dumps(checks))
'''


@pytest.mark.slow
def test_every_config_of_the_autotuned_twin_passes_the_spec_in_the_interpreter(tmp_path):
    tuned = cands(MATMUL, "triton-autotune")[0].source
    target = materialise(tmp_path, "matmul", "triton", rewrite(tuned))
    checks = run_script(PER_CONFIG, str(target.parent / "spec.py"), str(target), cwd=tmp_path)
    assert len(checks) == 24 and len({c["config"] for c in checks}) == 24
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]][:3]


@pytest.mark.slow
@pytest.mark.parametrize("autotuned", [False, True], ids=["plain", "autotuned"])
def test_rewrite_compiles_ahead_of_time_for_hopper_and_blackwell(autotuned, tmp_path, env, capsys):
    """The twin builds for sm_90 and sm_100: the plain rewrite in both dtypes of the spec, the autotuned one
    (24 configs) in float16 only: bfloat16 has the same width, so the same tiles, descriptors, shared memory
    and configs, and its 48 more builds were half of this test's time."""
    from loop.cli import main

    source = cands(MATMUL, "triton-autotune")[0].source if autotuned else MATMUL
    dtypes = ["float16"] if autotuned else ["bfloat16", "float16"]
    target = materialise(tmp_path, "matmul", "triton", rewrite(source), DTYPES=dtypes)
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    rows = out["kernels"]
    assert {r["arch"] for r in rows} == {"sm_90", "sm_100"}
    # the gate compiles at the spec's last correctness shape (aligned): the twin is what it built
    assert {r["kernel"] for r in rows} == {"matmul_kernel_tma"}
    assert {r["dtype"] for r in rows} == set(dtypes)
    assert len(rows) == 2 * len(dtypes) * (24 if autotuned else 1)  # arch x dtype x config


@pytest.mark.slow
def test_the_twin_uses_tma_instructions_on_hopper_and_blackwell(tmp_path):
    torch = pytest.importorskip("torch")
    from loop.worker import aot
    from loop.worker.failures import load_module

    if aot.cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    target = materialise(tmp_path, "matmul", "triton", rewrite(MATMUL))
    spec = load_module("tma_spec", target.parent / "spec.py")
    inputs = spec.make_inputs((256, 192, 320), torch.float16, 0, "cpu")
    cubins: list[bytes] = []
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        for cap in (90, 100):
            real = aot.resource_usage
            aot.resource_usage = lambda cubin: cubins.append(cubin) or []
            try:
                aot._triton_compile(torch, lambda: load_module(f"tma_target_{cap}", target),
                                    lambda m: m.run(**inputs), cap)
            finally:
                aot.resource_usage = real
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    assert len(cubins) == 2
    for cubin in cubins:
        path = tmp_path / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([aot.cuobjdump(), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        ops = set(re.findall(r"\b(UTMALDG|UTMASTG)\b", sass))
        assert ops == {"UTMALDG", "UTMASTG"}, "no TMA load/store in the SASS"
