"""The CUDA C recipes (playbook/cuda/) on the three first versions in CUDA C (kernels/*/cuda/): the
exact change each proposes (a golden diff of its first candidate, or its reason for proposing
nothing), each change confined to its one variable with every other byte of the file kept, the
sweep of threads per block, what makes each recipe say no, the kernel classes, and `playbook plan`
on a `.cu` target; where nvcc is found, rewritten kernels compiled for sm_90 (slow).

Skipped where tree-sitter's CUDA grammar cannot be imported (`pip install -e '.[cuda]'`)."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("tree_sitter_cuda", reason="the CUDA C recipes read sources with tree-sitter-cuda: "
                                               "pip install -e '.[cuda]'")

import playbook  # noqa: E402
from loop import cli  # noqa: E402
from loop.common import nvcc  # noqa: E402
from playbook.analysis import analyze  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = ("vector_add", "softmax", "rmsnorm")
RECIPES = ("cuda-threads-per-block", "cuda-vectorize", "cuda-warp-shuffle", "cuda-restrict", "cuda-grid-stride",
           "cuda-launch-bounds", "cuda-unroll")


def first_version(op: str) -> Path:
    return REPO_ROOT / "kernels" / op / "cuda" / f"{op}_cuda.cu"


@dataclass(frozen=True)
class Skipped:
    reason: str


def diff(a: str, b: str) -> str:
    """The changed lines of b against a, without context (a unified diff's hunks)."""
    return "".join(line for line in difflib.unified_diff(a.splitlines(True), b.splitlines(True), n=0)
                   if not line.startswith(("---", "+++")))


def attempt(recipe_id: str, source: str):
    return playbook.get(recipe_id).attempt(source, analyze(source, language="cuda"))


GOLDEN = {
    ("vector_add", "cuda-threads-per-block"): """\
@@ -12 +12 @@
-    int threads = 256;
+    int threads = 512;
""",
    ("vector_add", "cuda-vectorize"): """\
@@ -6,2 +6,15 @@
-    if (i < n) {
-        out[i] = x[i] + y[i];
+    if (i < (n + 3) / 4) {
+        if (4 * i + 3 < n && (reinterpret_cast<size_t>(out) | reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(y)) % 16 == 0) {
+            float4 out_v;
+            const float4 x_v = reinterpret_cast<const float4*>(x)[i];
+            const float4 y_v = reinterpret_cast<const float4*>(y)[i];
+            { out_v.x = x_v.x + y_v.x; }
+            { out_v.y = x_v.y + y_v.y; }
+            { out_v.z = x_v.z + y_v.z; }
+            { out_v.w = x_v.w + y_v.w; }
+            reinterpret_cast<float4*>(out)[i] = out_v;
+        } else {
+            for (int i_e = 4 * i; i_e < n && i_e < 4 * i + 4; ++i_e) {
+                out[i_e] = x[i_e] + y[i_e];
+            }
+        }
@@ -14 +27 @@
-    vector_add_kernel<<<blocks, threads>>>(x, y, out, n);
+    vector_add_kernel<<<(blocks + 3) / 4, threads>>>(x, y, out, n);
""",
    ("vector_add", "cuda-warp-shuffle"): Skipped('vector_add_kernel has no shared-memory tree reduction (partial[tid] = v; __syncthreads(); a loop halving s with partial[tid] += partial[tid + s])'),
    ("vector_add", "cuda-restrict"): """\
@@ -4 +4 @@
-__global__ void vector_add_kernel(const float* x, const float* y, float* out, int n) {
+__global__ void vector_add_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int n) {
""",
    ("vector_add", "cuda-grid-stride"): """\
@@ -6 +6 @@
-    if (i < n) {
+    for (; i < n; i += blockDim.x * gridDim.x) {
@@ -14 +14 @@
-    vector_add_kernel<<<blocks, threads>>>(x, y, out, n);
+    vector_add_kernel<<<(blocks + 3) / 4, threads>>>(x, y, out, n);
""",
    ("vector_add", "cuda-launch-bounds"): """\
@@ -4 +4 @@
-__global__ void vector_add_kernel(const float* x, const float* y, float* out, int n) {
+__global__ void __launch_bounds__(256) vector_add_kernel(const float* x, const float* y, float* out, int n) {
""",
    ("vector_add", "cuda-unroll"): Skipped('vector_add_kernel has no loop'),
    ("softmax", "cuda-threads-per-block"): """\
@@ -5 +5 @@
-#define THREADS 256
+#define THREADS 512
""",
    ("softmax", "cuda-vectorize"): Skipped('softmax_kernel has no element loop (int i = blockIdx.x * blockDim.x + threadIdx.x; then if (i < n) or a grid-stride for): not an element-wise kernel'),
    ("softmax", "cuda-warp-shuffle"): """\
@@ -16,5 +16,17 @@
-    partial[threadIdx.x] = m;
-    __syncthreads();
-    for (int s = blockDim.x / 2; s > 0; s /= 2) {
-        if (threadIdx.x < s) {
-            partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
+    {
+        float warp_v = m;
+        for (int offset = 16; offset > 0; offset /= 2) {
+            warp_v = fmaxf(warp_v, __shfl_down_sync(0xffffffff, warp_v, offset));
+        }
+        if (threadIdx.x % 32 == 0) {
+            partial[threadIdx.x / 32] = warp_v;
+        }
+        __syncthreads();
+        if (threadIdx.x < 32) {
+            warp_v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : -INFINITY;
+            for (int offset = 16; offset > 0; offset /= 2) {
+                warp_v = fmaxf(warp_v, __shfl_down_sync(0xffffffff, warp_v, offset));
+            }
+            if (threadIdx.x == 0) {
+                partial[0] = warp_v;
+            }
@@ -31,5 +43,17 @@
-    partial[threadIdx.x] = sum;
-    __syncthreads();
-    for (int s = blockDim.x / 2; s > 0; s /= 2) {
-        if (threadIdx.x < s) {
-            partial[threadIdx.x] += partial[threadIdx.x + s];
+    {
+        float warp_v = sum;
+        for (int offset = 16; offset > 0; offset /= 2) {
+            warp_v += __shfl_down_sync(0xffffffff, warp_v, offset);
+        }
+        if (threadIdx.x % 32 == 0) {
+            partial[threadIdx.x / 32] = warp_v;
+        }
+        __syncthreads();
+        if (threadIdx.x < 32) {
+            warp_v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
+            for (int offset = 16; offset > 0; offset /= 2) {
+                warp_v += __shfl_down_sync(0xffffffff, warp_v, offset);
+            }
+            if (threadIdx.x == 0) {
+                partial[0] = warp_v;
+            }
""",
    ("softmax", "cuda-restrict"): """\
@@ -7 +7 @@
-__global__ void softmax_kernel(const float* x, float* out, int rows, int cols) {
+__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
""",
    ("softmax", "cuda-grid-stride"): Skipped('softmax_kernel has no element loop (int i = blockIdx.x * blockDim.x + threadIdx.x; then if (i < n) or a grid-stride for): not an element-wise kernel'),
    ("softmax", "cuda-launch-bounds"): """\
@@ -7 +7 @@
-__global__ void softmax_kernel(const float* x, float* out, int rows, int cols) {
+__global__ void __launch_bounds__(THREADS) softmax_kernel(const float* x, float* out, int rows, int cols) {
""",
    ("softmax", "cuda-unroll"): Skipped('softmax_kernel has no loop without a pragma whose trip count is fixed at compile time (its loops run to a kernel argument or blockDim.x)'),
    ("rmsnorm", "cuda-threads-per-block"): """\
@@ -6 +6 @@
-#define THREADS 256
+#define THREADS 512
""",
    ("rmsnorm", "cuda-vectorize"): Skipped('rmsnorm_kernel has no element loop (int i = blockIdx.x * blockDim.x + threadIdx.x; then if (i < n) or a grid-stride for): not an element-wise kernel'),
    ("rmsnorm", "cuda-warp-shuffle"): """\
@@ -17,5 +17,17 @@
-    partial[threadIdx.x] = sum;
-    __syncthreads();
-    for (int s = blockDim.x / 2; s > 0; s /= 2) {
-        if (threadIdx.x < s) {
-            partial[threadIdx.x] += partial[threadIdx.x + s];
+    {
+        float warp_v = sum;
+        for (int offset = 16; offset > 0; offset /= 2) {
+            warp_v += __shfl_down_sync(0xffffffff, warp_v, offset);
+        }
+        if (threadIdx.x % 32 == 0) {
+            partial[threadIdx.x / 32] = warp_v;
+        }
+        __syncthreads();
+        if (threadIdx.x < 32) {
+            warp_v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
+            for (int offset = 16; offset > 0; offset /= 2) {
+                warp_v += __shfl_down_sync(0xffffffff, warp_v, offset);
+            }
+            if (threadIdx.x == 0) {
+                partial[0] = warp_v;
+            }
""",
    ("rmsnorm", "cuda-restrict"): """\
@@ -8 +8 @@
-__global__ void rmsnorm_kernel(const float* x, const float* weight, float* out, int rows, int cols, float eps) {
+__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out, int rows, int cols, float eps) {
""",
    ("rmsnorm", "cuda-grid-stride"): Skipped('rmsnorm_kernel has no element loop (int i = blockIdx.x * blockDim.x + threadIdx.x; then if (i < n) or a grid-stride for): not an element-wise kernel'),
    ("rmsnorm", "cuda-launch-bounds"): """\
@@ -8 +8 @@
-__global__ void rmsnorm_kernel(const float* x, const float* weight, float* out, int rows, int cols, float eps) {
+__global__ void __launch_bounds__(THREADS) rmsnorm_kernel(const float* x, const float* weight, float* out, int rows, int cols, float eps) {
""",
    ("rmsnorm", "cuda-unroll"): Skipped('rmsnorm_kernel has no loop without a pragma whose trip count is fixed at compile time (its loops run to a kernel argument or blockDim.x)'),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("recipe_id", RECIPES)
def test_each_recipe_on_each_first_version_is_its_golden(op, recipe_id):
    source = first_version(op).read_text()
    cands, why = attempt(recipe_id, source)
    expected = GOLDEN[(op, recipe_id)]
    if isinstance(expected, Skipped):
        assert cands == [] and why == expected.reason
    else:
        assert why is None and cands and diff(source, cands[0].source) == expected
        assert all(c.recipe == recipe_id and c.source != source for c in cands)


def test_every_cuda_recipe_is_registered_with_its_page():
    ids = [r.id for r in playbook.recipes() if r.languages == ("cuda",)]
    assert ids == list(RECIPES)
    assert {key[1] for key in GOLDEN} == set(RECIPES) and {key[0] for key in GOLDEN} == set(OPS)


def without(text: str, *inserted: str) -> str:
    for piece in inserted:
        text = re.sub(piece, "", text)
    return text


@pytest.mark.parametrize("op", OPS)
def test_each_change_is_its_one_variable(op):
    """Undo the one variable's text and the original comes back, byte for byte."""
    source = first_version(op).read_text()
    restrict, = attempt("cuda-restrict", source)[0]
    assert without(restrict.source, r" __restrict__") == source
    bounds, = attempt("cuda-launch-bounds", source)[0]
    assert without(bounds.source, r"__launch_bounds__\(\w+\) ") == source
    for cand in attempt("cuda-threads-per-block", source)[0]:
        (old, new), = [(a, b) for a, b in zip(source.splitlines(), cand.source.splitlines()) if a != b]
        assert new == old.replace("256", cand.key.rpartition("=")[2])
    if op != "vector_add":
        shuffled, = attempt("cuda-warp-shuffle", source)[0]
        assert "__shfl_down_sync" in shuffled.source and "s /= 2" not in shuffled.source
        head, tail = source.split("    partial[threadIdx.x] =", 1)[0], source.rsplit("__syncthreads();\n    }\n", 1)[1]
        assert shuffled.source.startswith(head) and shuffled.source.endswith(tail)


def test_threads_per_block_sweeps_128_to_1024_the_step_up_first():
    source = first_version("softmax").read_text()
    cands = attempt("cuda-threads-per-block", source)[0]
    first = cands[0]
    assert (first.kind, first.tier, first.title) == ("block", 0, "THREADS 256 -> 512")
    assert [v.value for v in first.sweep.values] == [512, 1024, 128]
    assert first.sweep.title == "THREADS sweep 256 -> {512,1024,128}"
    for v in first.sweep.values:
        assert diff(source, v.source) == f"@@ -5 +5 @@\n-#define THREADS 256\n+#define THREADS {v.value}\n"
    assert [(c.key, c.tier) for c in cands[1:]] == [("cuda-threads-per-block:THREADS=1024", 1),
                                                    ("cuda-threads-per-block:THREADS=128", 1)]
    kept = first.sweep.values[1].source
    assert playbook.get("cuda-threads-per-block").current_keys(kept) == ["cuda-threads-per-block:THREADS=1024"]
    assert "cuda-threads-per-block:THREADS=1024" not in [c.key for c in attempt("cuda-threads-per-block", kept)[0]]


ODD = """\
// a kernel written in its own style: tabs, comments, a constexpr block size and a bound
#include <cuda_runtime.h>
constexpr int BLOCK = 128;

__global__ void __launch_bounds__(256) scale(float *out,   const float *in, float a, int n)
{
\tint i = blockIdx.x * blockDim.x + threadIdx.x;   // one element each
\tif (i < n) { out[i] = a * in[i]; }
}

extern "C" void solve(float *out, const float *in, float a, int n)
{
\tscale<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(out, in, a, n);
}
"""


def test_rewrites_keep_the_users_formatting_and_respect_launch_bounds():
    cands = attempt("cuda-threads-per-block", ODD)[0]
    assert [c.key for c in cands] == ["cuda-threads-per-block:BLOCK=256"]  # 512 and 1024 exceed the bound
    assert cands[0].source == ODD.replace("constexpr int BLOCK = 128;", "constexpr int BLOCK = 256;")
    restrict, = attempt("cuda-restrict", ODD)[0]
    assert restrict.source == ODD.replace("scale(float *out,   const float *in",
                                          "scale(float *__restrict__ out,   const float *__restrict__ in")
    stride, = attempt("cuda-grid-stride", ODD)[0]
    assert stride.source == ODD.replace("\tif (i < n) {", "\tfor (; i < n; i += blockDim.x * gridDim.x) {").replace(
        "<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>", "<<<(((n + BLOCK - 1) / BLOCK) + 3) / 4, BLOCK>>>")
    commented = ODD.replace("{ out[i] = a * in[i]; }", "{ out[i] = a * in[i];  // scaled\n\t}")
    assert attempt("cuda-vectorize", commented) == ([], "scale: a comment in the loop body (the per-lane copies "
                                                        "would lose it)")
    bounds = attempt("cuda-launch-bounds", ODD)[0]
    assert [c.source for c in bounds] == [ODD.replace("__launch_bounds__(256)", "__launch_bounds__(256, 8)")]
    assert bounds[0].tier == 1


def test_what_makes_each_recipe_say_no():
    computed = first_version("vector_add").read_text().replace("int threads = 256;", "int threads = n < 4096 ? 128 : 256;")
    assert "computed block size" in attempt("cuda-threads-per-block", computed)[1]
    assert "is computed" in attempt("cuda-launch-bounds", computed)[1]
    aliased = first_version("vector_add").read_text().replace("(x, y, out, n)", "(x, x, out, n)")
    assert attempt("cuda-restrict", aliased)[1] == ("vector_add_kernel is launched with x in two arguments: "
                                                    "__restrict__ would be false")
    mixed = first_version("vector_add").read_text().replace("const float* y", "const double* y")
    assert attempt("cuda-vectorize", mixed)[1] == "vector_add_kernel: the loop body mixes element types (double, float)"
    table = first_version("vector_add").read_text().replace("out[i] = x[i] + y[i];", "out[i] = x[i] + y[i] * w[i];")
    table = table.replace("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n__constant__ float w[4096];\n")
    assert attempt("cuda-vectorize", table)[1] == ("vector_add_kernel: w[i] indexes w, no pointer parameter, with the "
                                                   "loop's index")
    alias = first_version("vector_add").read_text().replace("out[i] = x[i] + y[i];", "const float* z = x; out[i] = z[i];")
    assert attempt("cuda-vectorize", alias)[1] == "vector_add_kernel: the loop body uses the pointer x other than as x[i]"
    late = first_version("vector_add").read_text().replace("        out[i] = x[i] + y[i];\n    }\n",
                                                           "        out[i] = x[i] + y[i];\n    }\n    out[0] = i;\n")
    assert attempt("cuda-grid-stride", late)[1] == "vector_add_kernel: its index i is read after the guard"
    odd_block = first_version("rmsnorm").read_text().replace("#define THREADS 256", "#define THREADS 48")
    assert "not a multiple of 32" in attempt("cuda-warp-shuffle", odd_block)[1]
    assert attempt("cuda-restrict", 'extern "C" void solve(int n) { }')[1] == \
        "solve() launches no __global__ kernel defined in the file"


def test_unroll_applies_to_the_fixed_trip_loops_a_warp_shuffle_brings():
    source = first_version("rmsnorm").read_text()
    shuffled = attempt("cuda-warp-shuffle", source)[0][0].source
    unrolled, = attempt("cuda-unroll", shuffled)[0]
    changed = diff(shuffled, unrolled.source)
    assert changed.count("+        #pragma unroll\n") == 1 and changed.count("+            #pragma unroll\n") == 1
    assert without(unrolled.source, r"[ \t]*#pragma unroll\n") == shuffled
    assert attempt("cuda-unroll", unrolled.source)[0] == []  # a loop with a pragma is left alone


def test_vectorize_reads_a_grid_stride_loop_and_half_pairs():
    source = first_version("vector_add").read_text()
    stride = attempt("cuda-grid-stride", source)[0][0].source
    vec, = attempt("cuda-vectorize", stride)[0]
    assert "<<<(blocks + 3) / 4, threads>>>" in vec.source and "<<<((blocks" not in vec.source  # the grid kept
    assert "for (; i < (n + 3) / 4; i += blockDim.x * gridDim.x)" in vec.source
    half = "#include <cuda_fp16.h>\n" + source.replace("float", "__half").replace("__half* out", "__half* out")
    cand, = attempt("cuda-vectorize", half)[0]
    assert cand.key == "cuda-vectorize:vector_add_kernel=__half2" and "% 4 == 0" in cand.source
    assert "{ out_v.y = x_v.y + y_v.y; }" in cand.source and "out_v.z" not in cand.source


def test_the_kernel_classes_of_cuda_c():
    classes = {op: analyze(first_version(op).read_text()).kernel_class for op in OPS}
    assert classes == {"vector_add": "element-wise", "softmax": "norm-like", "rmsnorm": "norm-like"}
    an = analyze(first_version("rmsnorm").read_text())
    assert an.language == "cuda" and an.forward == {"rmsnorm_kernel"} and an.entry == ("solve",)
    assert an.reasons()[1] == "reduction: shared-memory tree"
    atomics = first_version("vector_add").read_text().replace("out[i] = x[i] + y[i];", "atomicAdd(out, x[i] * y[i]);")
    assert analyze(atomics).kernel_class == "reduction"
    assert analyze(atomics).priority()[0] == "block"
    triton = (REPO_ROOT / "kernels" / "softmax" / "softmax_triton.py").read_text()
    assert analyze(triton).language == "triton"
    assert playbook.get("cuda-threads-per-block").current_keys(triton) == []


@pytest.mark.parametrize("op", OPS)
def test_playbook_plan_says_why_each_recipe_applies_or_not(op, capsys):
    assert cli.main(["playbook", "plan", str(first_version(op)), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["language"], payload["entry"]) == ("cuda", ["solve"])
    said = {a["id"]: a["candidates"] for a in payload["applicable"]}
    said.update({n["id"]: n["reason"] for n in payload["not_applicable"]})
    assert set(said) == set(RECIPES)
    for recipe_id in RECIPES:
        expected = GOLDEN[(op, recipe_id)]
        assert said[recipe_id] == expected.reason if isinstance(expected, Skipped) else said[recipe_id] >= 1
    assert payload["plan"]["order"][0]["recipe"] == "cuda-threads-per-block"


@pytest.mark.slow
@pytest.mark.skipif(nvcc.toolchain() is None, reason=f"{nvcc.why_none()}")
def test_rewritten_kernels_compile_for_sm_90(tmp_path):
    chain = nvcc.toolchain()
    sources = {"vector_add": attempt("cuda-vectorize", first_version("vector_add").read_text())[0][0].source}
    shuffled = attempt("cuda-warp-shuffle", first_version("softmax").read_text())[0][0].source
    sources["softmax"] = attempt("cuda-unroll", shuffled)[0][0].source
    for name, text in sources.items():
        path = tmp_path / f"{name}.cu"
        path.write_text(text)
        done = subprocess.run([chain.path, "-cubin", "-arch=sm_90", "-o", str(path.with_suffix(".cubin")), str(path)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert path.with_suffix(".cubin").stat().st_size > 0


def every_candidate(op: str) -> list[tuple[str, str]]:
    """(label, source) of every value each recipe proposes for the first version (a sweep's values
    included), and of the chains where one recipe's output is another's input."""
    source = first_version(op).read_text()
    out = []
    for recipe_id in RECIPES:
        for cand in attempt(recipe_id, source)[0]:
            out.append((cand.key, cand.source))
            out += [(v.key, v.source) for v in (cand.sweep.values if cand.sweep else ())]
            follow = {"cuda-warp-shuffle": "cuda-unroll", "cuda-grid-stride": "cuda-vectorize"}.get(recipe_id)
            out += [(f"{cand.key} then {c.key}", c.source) for c in attempt(follow, cand.source)[0]] if follow else []
    return list({text: (label, text) for label, text in reversed(out)}.values())[::-1]  # each source once


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_every_candidate_computes_what_the_first_version_does_on_the_gpu(op, tmp_path):
    """Each rewritten kernel built for this GPU and run through solve on the spec's correctness shapes,
    compared with the spec's reference at its tolerances; a vector_add on inputs one element off
    their allocation (not 16-byte aligned) takes the vector recipe's scalar path."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from loop.common.spec import load_module
    from loop.worker.cuda_build import load_target

    spec = load_module(f"spec_cuda_{op}", first_version(op).parent / "spec.py")
    atol, rtol = spec.TOLERANCES["float32"]
    shapes = list(spec.CORRECTNESS_SHAPES) + [spec.BENCHMARK_SHAPES[0]]
    cands = every_candidate(op)
    assert len(cands) >= 7 and len({text for _, text in cands}) == len(cands)
    for i, (label, source) in enumerate(cands):
        path = tmp_path / f"{op}_{i}_cuda.cu"
        path.write_text(source)
        solve = load_target(f"candidate_{op}_{i}", path).solve
        for shape in shapes:
            inputs = spec.make_inputs(shape, torch.float32, 7, "cuda")
            if op == "vector_add":  # off by one element: pointers 4 bytes past a 16-byte boundary
                bigger = spec.make_inputs((shape[0] + 1,), torch.float32, 7, "cuda")
                inputs = {**{k: bigger[k][1:] for k in ("x", "y", "out")}, "n": shape[0]}
                assert inputs["x"].data_ptr() % 16 != 0
            expected = spec.reference(**inputs)
            solve(**inputs)
            torch.cuda.synchronize()
            torch.testing.assert_close(inputs["out"], expected, atol=atol, rtol=rtol,
                                       msg=lambda m: f"{label} {shape}: {m}")
        for shape in shapes[-1:]:
            inputs = spec.make_inputs(shape, torch.float32, 11, "cuda")
            solve(**inputs)
            torch.cuda.synchronize()
            torch.testing.assert_close(inputs["out"], spec.reference(**inputs), atol=atol, rtol=rtol,
                                       msg=lambda m: f"{label} {shape} aligned: {m}")
