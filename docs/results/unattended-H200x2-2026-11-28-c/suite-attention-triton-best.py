"""attention forward, first version: flash-style, one program per (query block, batch * head),
a loop over key/value blocks with the online softmax in fp32 (exp2, scale folded in), masks on
every key block (ragged seq and causal) rather than only where needed, small fixed tiles,
no autotune."""

import math

import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4
NUM_STAGES = 2


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq, heads, qk_scale,
                     stride_qb, stride_qh, stride_qs, stride_qd,
                     stride_kb, stride_kh, stride_ks, stride_kd,
                     stride_vb, stride_vh, stride_vs, stride_vd,
                     stride_ob, stride_oh, stride_os, stride_od,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    h = pid_bh % heads
    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    o_base = o_ptr + b * stride_ob + h * stride_oh

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nb = tl.arange(0, BLOCK_N)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < seq, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    if CAUSAL:
        hi = tl.minimum(seq, (pid_m + 1) * BLOCK_M)  # keys past the last query of this block are all masked
    else:
        hi = seq
    # The first block holds key 0, which every query row sees, so m_i is finite from then on and
    # exp2(-inf - m_i) is 0 for masked keys (no -inf - -inf = NaN).
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_nb
        k = tl.load(k_base + offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                    mask=offs_n[None, :] < seq, other=0.0)  # (HEAD_DIM, BLOCK_N): k transposed
        s = tl.dot(q, k)  # fp32
        valid = offs_n[None, :] < seq
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(valid, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=offs_n[:, None] < seq, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < seq)


def run(q, k, v, causal, out):
    batch, heads, seq, head_dim = q.shape
    qk_scale = 1.0 / math.sqrt(head_dim) * 1.4426950408889634  # sm_scale * log2(e), for exp2
    grid = (triton.cdiv(seq, BLOCK_M), batch * heads)
    attention_kernel[grid](q, k, v, out, seq, heads, qk_scale,
                           *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                           HEAD_DIM=head_dim, CAUSAL=bool(causal), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                           num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
