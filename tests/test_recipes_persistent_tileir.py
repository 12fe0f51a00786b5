"""Recipes `triton-persistent` and `triton-tileir-configs`.

Fast: golden rewrites of the reference kernels (which lines change and how), composition with
triton-autotune and grouped-ordering, every skip with its reason, the gating of the Tile IR
configs on the run's backend and architecture, and stock Triton 3.6 importing the gated source
(the prune hook hands the Tile IR configs to Tile IR only).
Slow (`-m slow`): the rewrites compile for sm_90 and sm_100 through `tileloop compile` and pass
their spec under the Triton interpreter through the loop's worker; without the prune hook the
same Tile IR source fails to compile under stock Triton.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

import playbook
from playbook.analysis import TRITON_PRIORITY, Analysis, analyze
from playbook.base import current_keys, next_candidate
from playbook.triton.persistent import programs_per_sm
from tests.conftest import materialise

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"
ROW_KERNELS = ("softmax", "layernorm", "rmsnorm", "row_sum", "silu_mul")
TRITON_OPS = sorted(p.name for p in KERNELS.iterdir() if (p / f"{p.name}_triton.py").is_file())
PRUNE_LINE = '    prune_configs_by={"early_config_prune": _configs_for_active_backend},'


def src(op: str, lang: str = "triton") -> str:
    return (KERNELS / op / f"{op}_{lang}.py").read_text()


def cands(recipe_id: str, source: str, backend: str | None = None, arch: str | None = None):
    return playbook.get(recipe_id).candidates(source, analyze(source, backend=backend, arch=arch))


def first(recipe_id: str, source: str, backend: str | None = None, arch: str | None = None):
    found = [c for c in cands(recipe_id, source, backend, arch) if c.tier == 0]
    assert len(found) == 1, [c.key for c in found]
    return found[0]


def reason(recipe_id: str, source: str, backend: str | None = None, arch: str | None = None) -> str | None:
    return playbook.get(recipe_id).skip_reason(source, analyze(source, backend=backend, arch=arch))


def changes(a: str, b: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of a unified diff without context."""
    removed, added = [], []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


def function_body(source: str, name: str) -> list[str]:
    """The lines of a module-level function, from its `def` to the next top-level statement."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace() and lines[i][0] != ")"),
               len(lines))
    body = lines[start:end]
    while body and not body[-1].strip():
        body.pop()
    return body


# --------------------------------------------------------------------------- triton-persistent: row kernels


@pytest.mark.parametrize("op", ROW_KERNELS)
def test_persistent_row_kernel_loops_over_rows_and_adds_the_row_count(op):
    source = src(op)
    c = first("triton-persistent", source)
    assert (c.recipe, c.kind, c.key, c.tier) == ("triton-persistent", "persistent", f"triton-persistent:{op}_kernel", 0)
    assert c.title == f"{op}_kernel: persistent, rows looped over min(rows, SMs x 32) programs"
    removed, added = changes(source, c.source)
    assert "    row = tl.program_id(0)" in removed
    assert "    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):" in added
    assert "PROGRAMS_PER_SM = 32  # persistent grid: programs per SM (~ what one SM holds at num_warps=1: warp slots)" in added
    assert "    grid = (min(rows, _num_sms(x.device) * PROGRAMS_PER_SM),)" in added
    signature = next(line for line in added if line.startswith(f"def {op}_kernel("))
    assert signature.endswith(", n_rows, BLOCK: tl.constexpr):")  # a runtime parameter, before the constexprs
    assert "n_rows=rows, BLOCK=BLOCK" in c.source  # passed by keyword, before the other keywords
    # every statement of the old body now sits one level deeper, inside the loop, in the same order
    old = [line for line in function_body(source, f"{op}_kernel")[1:] if line.strip() and "tl.program_id(0)" not in line]
    new = function_body(c.source, f"{op}_kernel")
    loop_at = next(i for i, line in enumerate(new) if line.startswith("    for row in tl.range("))
    assert [line for line in new[loop_at + 1:] if line.strip()] == ["    " + line for line in old]


def test_persistent_softmax_host_side_exact():
    c = first("triton-persistent", src("softmax"))
    assert c.source.startswith('"""softmax, first version: one row per program, three passes over the row in small chunks,\n'
                               'one warp, no autotune."""\n\nimport functools\n\nimport torch\nimport triton\n')
    assert function_body(c.source, "_num_sms") == [
        "def _num_sms(device: torch.device) -> int:",
        '    """Streaming multiprocessors of `device`, asked once per device; a CPU tensor (the Triton',
        '    interpreter) counts as one."""',
        '    if device.type != "cuda":',
        "        return 1",
        "    return torch.cuda.get_device_properties(device).multi_processor_count",
    ]
    assert "@functools.cache\ndef _num_sms(" in c.source
    assert function_body(c.source, "run") == [
        "def run(x, out):",
        "    rows, cols = x.shape",
        "    grid = (min(rows, _num_sms(x.device) * PROGRAMS_PER_SM),)",
        "    softmax_kernel[grid](x, out, cols, x.stride(0), out.stride(0), n_rows=rows, BLOCK=BLOCK, num_warps=NUM_WARPS)",
        "    return out",
    ]


def test_persistent_keeps_continuation_lines_aligned_with_the_launch():
    c = first("triton-persistent", src("layernorm"))
    assert ("    layernorm_kernel[grid](x, weight, bias, out, cols, x.stride(0), out.stride(0), EPS,\n"
            "                           n_rows=rows, BLOCK=BLOCK, num_warps=NUM_WARPS)\n") in c.source


def test_persistent_recognises_a_row_count_the_kernel_already_takes():
    source = src("row_sum").replace("def row_sum_kernel(x_ptr, out_ptr, n_cols, stride_x,",
                                    "def row_sum_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_x,")
    source = source.replace("](x, out, cols, x.stride(0),", "](x, out, rows, cols, x.stride(0),")
    c = first("triton-persistent", source)
    assert "    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):" in c.source
    assert c.source.count("n_rows") == 2  # the existing parameter and the loop bound: nothing added
    assert "n_rows=" not in c.source


# --------------------------------------------------------------------------- triton-persistent: blocks and tiles


def test_persistent_vector_add_grid_stride_loop():
    source = src("vector_add")
    c = first("triton-persistent", source)
    assert c.title == "add_kernel: persistent, blocks looped over min(blocks, SMs x 32) programs"
    assert function_body(c.source, "add_kernel") == [
        "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):",
        "    # persistent: each program walks the blocks tl.num_programs(0) apart",
        "    for pid in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):",
        "        offs = pid * BLOCK + tl.arange(0, BLOCK)",
        "        mask = offs < n",
        "        x = tl.load(x_ptr + offs, mask=mask)",
        "        y = tl.load(y_ptr + offs, mask=mask)",
        "        tl.store(out_ptr + offs, x + y, mask=mask)",
    ]
    assert "    grid = (min(triton.cdiv(n, BLOCK), _num_sms(x.device) * PROGRAMS_PER_SM),)" in c.source
    assert "    add_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)" in c.source


def test_persistent_matmul_tile_loop_decodes_axis_0_fastest_and_hoists_invariants():
    c = first("triton-persistent", src("matmul"))
    assert "PROGRAMS_PER_SM = 4  # persistent grid: programs per SM (~ what one SM holds at num_warps=4: dot tiles, registers)" \
        in c.source
    body = function_body(c.source, "matmul_kernel")
    assert body[3:10] == [
        "    num_pid_m = tl.cdiv(M, BLOCK_M)",
        "    num_pid_n = tl.cdiv(N, BLOCK_N)",
        "    offs_k = tl.arange(0, BLOCK_K)",  # work-item invariant: computed once per program
        "    # persistent: each program walks the tiles tl.num_programs(0) apart",
        "    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):",
        "        pid_m = tile_id % num_pid_m  # axis 0 fastest, as the grid was dispatched",
        "        pid_n = tile_id // num_pid_m",
    ]
    assert "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" in body  # reset per tile, never hoisted
    assert "    grid = (min(triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), _num_sms(a.device) * PROGRAMS_PER_SM),)" \
        in c.source


def test_persistent_attention_passes_the_size_the_kernel_cannot_compute():
    c = first("triton-persistent", src("attention"))
    assert "                     stride_ob, stride_oh, stride_os, stride_od, num_pid_bh,\n" in c.source
    assert "                           num_pid_bh=batch * heads, HEAD_DIM=head_dim," in c.source
    body = function_body(c.source, "attention_kernel")
    assert "    num_pid_m = tl.cdiv(seq, BLOCK_M)" in body  # seq and BLOCK_M are kernel arguments
    assert "    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_bh, tl.num_programs(0)):" in body
    assert "    grid = (min(triton.cdiv(seq, BLOCK_M) * (batch * heads), _num_sms(q.device) * PROGRAMS_PER_SM),)" in c.source
    assert "import functools\nimport math\n\nimport torch\nimport triton\n" in c.source  # functools with the stdlib


def test_persistent_applies_to_every_reference_triton_kernel_and_no_cutile_one():
    assert TRITON_OPS == ["attention", "layernorm", "matmul", "rmsnorm", "row_sum", "silu_mul", "softmax", "vector_add"]
    recipe = playbook.get("triton-persistent")
    for op in TRITON_OPS:
        assert reason("triton-persistent", src(op)) is None, op
        assert not recipe.applies(analyze(src(op, "cutile"))), op


# --------------------------------------------------------------------------- triton-persistent: composition


def chain(op: str, *recipe_ids: str) -> str:
    source = src(op)
    for rid in recipe_ids:
        source = first(rid, source).source
    return source


def test_persistent_after_autotune_keeps_the_meta_grid():
    c = chain("vector_add", "triton-autotune", "triton-persistent")
    assert "    for pid in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):" in c
    assert ('    grid = lambda meta: (min(triton.cdiv(n, meta["BLOCK"]), _num_sms(x.device) * PROGRAMS_PER_SM),)\n'
            "    add_kernel[grid](x, y, out, n)\n") in c
    assert "PROGRAMS_PER_SM = 16" in c  # the launch no longer sets num_warps: Triton's default 4


def test_persistent_after_autotune_and_grouped_ordering_loops_over_the_launch_order_index():
    c = chain("matmul", "triton-autotune", "grouped-ordering", "triton-persistent")
    body = function_body(c, "matmul_kernel")
    start = body.index("    # grouped ordering: GROUP_SIZE_M tile rows at a time share their A and B panels in L2")
    assert body[start + 1:start + 12] == [
        "    num_pid_m = tl.cdiv(M, BLOCK_M)",
        "    num_pid_n = tl.cdiv(N, BLOCK_N)",
        "    num_pid_in_group = GROUP_SIZE_M * num_pid_n",
        "    offs_k = tl.arange(0, BLOCK_K)",
        "    # persistent: each program walks the tiles tl.num_programs(0) apart",
        "    for pid in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):",
        "        group_id = pid // num_pid_in_group",
        "        first_pid_m = group_id * GROUP_SIZE_M",
        "        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)",
        "        pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m",
        "        pid_n = (pid % num_pid_in_group) // group_size_m",
    ]
    assert "tl.num_programs(1)" not in c and "tl.program_id(1)" not in c
    assert ('    grid = lambda meta: (min(triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),\n'
            "                             _num_sms(a.device) * PROGRAMS_PER_SM),)\n") in c


def test_autotune_after_persistent_tunes_the_persistent_kernel():
    c = chain("vector_add", "triton-persistent", "triton-autotune")
    assert "@triton.autotune(" in c and "for pid in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):" in c
    assert '    grid = lambda meta: (min(triton.cdiv(n, meta["BLOCK"]), _num_sms(x.device) * PROGRAMS_PER_SM),)' in c


def test_persistent_source_is_not_converted_twice_and_steps_programs_per_sm():
    once = first("triton-persistent", src("matmul")).source
    again = cands("triton-persistent", once)
    assert [(c.key, c.tier, c.kind) for c in again] == [("triton-persistent:PROGRAMS_PER_SM=8", 1, "persistent"),
                                                        ("triton-persistent:PROGRAMS_PER_SM=2", 1, "persistent")]
    assert changes(once, again[0].source)[1][0].startswith("PROGRAMS_PER_SM = 8  #")
    assert again[0].title == "PROGRAMS_PER_SM 4 -> 8"
    assert current_keys(once).count("triton-persistent:PROGRAMS_PER_SM=4") == 1
    rows = first("triton-persistent", src("row_sum")).source
    assert [c.key for c in cands("triton-persistent", rows)] == ["triton-persistent:PROGRAMS_PER_SM=16"]  # 64 > 32


def test_programs_per_sm_estimate():
    assert [programs_per_sm(w, dot=False) for w in (1, 2, 4, 8, 16, 32)] == [32, 32, 16, 8, 4, 2]
    assert [programs_per_sm(w, dot=True) for w in (1, 4, 8, 16, 32)] == [16, 4, 2, 1, 1]


# --------------------------------------------------------------------------- triton-persistent: skips

TEMPLATE = '''\
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def run(x, out):
    n = x.numel()
    k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out
'''


def test_template_is_rewritten():
    assert reason("triton-persistent", TEMPLATE) is None


@pytest.mark.parametrize("old,new,why", [
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    if pid > n:\n        return\n", "returns early"),
    ("    tl.store(", "    tl.atomic_cas(out_ptr, 0, 1)\n    tl.store(", "tl.atomic_cas / tl.atomic_xchg"),
    # a reassigned parameter gets a copy per work item (it was a reason to skip before)
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    x_ptr += 1\n", None),
    ("    pid = tl.program_id(0)\n", "    pid = tl.program_id(0) + tl.program_id(1)\n", "reads program axis 1 of a 1-D grid"),
    ("    offs = pid", "    offs = tl.num_programs(0) * 0 + pid", None),  # num_programs is fine
    ("k[(triton.cdiv(n, BLOCK),)]", "k[grid_of(n)]", "is not a tuple of 1 to 3 sizes"),
    ("    k[(triton.cdiv(n, BLOCK),)]", "    grid = (1,)\n    grid = (triton.cdiv(n, BLOCK),)\n    k[grid]",
     "grid `grid` is not assigned exactly once"),
    ("    n = x.numel()\n", "    n = x.numel()\n    n = n + 0\n", "the wrapper assigns n more than once"),
    ("k[(triton.cdiv(n, BLOCK),)]", "k[lambda meta, extra: (n,)]", "exactly one argument"),
    ("k[(triton.cdiv(n, BLOCK),)]", "k[[triton.cdiv(n, BLOCK)]]", "not a tuple of 1 to 3 sizes"),
    ("    return out\n", "    k[(1,)](x, out, n, BLOCK=BLOCK)\n    return out\n", "launched 2 times"),
    ("def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    pid = tl.program_id(0)\n",
     "def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    pid = tl.program_id(0)\n    for i in range(0, n, tl.num_programs(0)):\n"
     "        pass\n", "already persistent"),
    ("def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    pid = tl.program_id(0)\n",
     "def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    pid = my_pid()\n", "does not read its program id"),
])
def test_persistent_skips_with_a_reason(old, new, why):
    assert old in TEMPLATE
    source = TEMPLATE.replace(old, new)
    if why is None:
        assert reason("triton-persistent", source) is None
    else:
        assert why in (reason("triton-persistent", source) or ""), reason("triton-persistent", source)
        assert cands("triton-persistent", source) == []


def test_persistent_skips_program_ids_read_in_a_helper():
    source = TEMPLATE.replace("@triton.jit\ndef k(", "@triton.jit\ndef helper():\n    return tl.program_id(0)\n\n\n"
                              "@triton.jit\ndef k(").replace("    offs = pid * BLOCK", "    offs = helper() * BLOCK")
    assert "calls helper, which reads the program id itself" in reason("triton-persistent", source)


def test_persistent_adds_a_bound_the_kernel_cannot_compute():
    source = TEMPLATE.replace("k[(triton.cdiv(n, BLOCK),)]", "k[(triton.cdiv(x.numel(), BLOCK),)]")
    c = first("triton-persistent", source)  # x.numel() is not a kernel argument: it becomes one
    assert "def k(x_ptr, out_ptr, n, num_pid, BLOCK: tl.constexpr):" in c.source
    assert "    for pid in tl.range(tl.program_id(0), num_pid, tl.num_programs(0)):" in c.source
    assert "    k[grid](x, out, n, num_pid=triton.cdiv(x.numel(), BLOCK), BLOCK=BLOCK)" in c.source


def test_persistent_keeps_the_grid_inline_when_the_launch_sits_in_a_block():
    source = TEMPLATE.replace("    k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)\n",
                              "    for _ in range(2):\n        k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)\n")
    c = first("triton-persistent", source)
    assert "        k[(min(triton.cdiv(n, BLOCK), _num_sms(x.device) * PROGRAMS_PER_SM),)](x, out, n, BLOCK=BLOCK)\n" in c.source


def test_persistent_does_not_guess_parameter_positions_behind_star_args():
    source = (TEMPLATE.replace("def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):", "def k(x_ptr, out_ptr, n, s0, BLOCK: tl.constexpr):")
              .replace("k[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)", "k[(x.numel(),)](x, out, n, *x.stride(), BLOCK)"))
    assert "passes *args: cannot tell where a new parameter may go" in reason("triton-persistent", source)
    keyword = source.replace("*x.stride(), BLOCK)", "*x.stride(), BLOCK=BLOCK)")
    assert "def k(x_ptr, out_ptr, n, s0, num_pid, BLOCK: tl.constexpr):" in first("triton-persistent", keyword).source


# --------------------------------------------------------------------------- triton-tileir-configs: gating

def autotuned(op: str) -> str:
    return first("triton-autotune", src(op)).source


@pytest.mark.parametrize("backend,arch,why", [
    (None, "sm_100", "target backend is tileir (this one: not known)"),
    ("ptx", "sm_100", "target backend is tileir (this one: ptx)"),
    ("interpreter", None, "(this one: interpreter)"),
    ("tileir", None, "GPU architecture is not known"),
    ("tileir", "cpu", "GPU architecture is not known"),
])
def test_tileir_configs_are_gated_on_backend_and_architecture(backend, arch, why):
    for source in (src("vector_add"), autotuned("vector_add")):
        assert cands("triton-tileir-configs", source, backend, arch) == []
        assert why in reason("triton-tileir-configs", source, backend, arch)


def test_analysis_carries_backend_and_architecture():
    plain = analyze(src("vector_add"))
    assert (plain.backend, plain.arch, plain.capability) == (None, None, None)
    an = analyze(src("vector_add"), backend="tileir", arch="sm_100a")
    assert (an.backend, an.arch, an.capability, an.kernel_class) == ("tileir", "sm_100a", 100, "element-wise")
    assert Analysis("triton", "dot", frozenset(), arch="sm_90").capability == 90
    assert Analysis("triton", "dot", frozenset(), arch="cpu").capability is None


# --------------------------------------------------------------------------- triton-tileir-configs: rewrites


def test_tileir_configs_wrap_an_existing_autotune_list():
    source = autotuned("vector_add")
    c = first("triton-tileir-configs", source, "tileir", "sm_100")
    assert (c.recipe, c.kind, c.key) == ("triton-tileir-configs", "tileir-configs", "triton-tileir-configs:add_kernel")
    assert c.title == "add_kernel: Tile IR configs, occupancy 1/2/4/8"
    removed, added = changes(source, c.source)
    assert removed == ["    configs=[", "    ],"]
    assert "    configs=_with_tileir_configs([" in added and "    ])," in added
    assert PRUNE_LINE in added
    assert "TILEIR_OCCUPANCY = (1, 2, 4, 8)" in added and "TILEIR_NUM_CTAS = (1,)" in added
    assert c.source.index(PRUNE_LINE) > c.source.index('    key=["n"],')  # its own line, after the key


@pytest.mark.parametrize("arch,ctas", [("sm_100", "(1, 2)"), ("sm_120", "(1, 2)"), ("sm_90", "(1,)")])
def test_tileir_configs_two_ctas_only_for_dot_kernels_on_blackwell(arch, ctas):
    c = first("triton-tileir-configs", autotuned("matmul"), "tileir", arch)
    assert f"TILEIR_NUM_CTAS = {ctas}" in c.source
    assert ("x num_ctas 1/2" in c.title) == (ctas == "(1, 2)")
    assert "TILEIR_NUM_CTAS = (1,)" in first("triton-tileir-configs", autotuned("softmax"), "tileir", arch).source


def test_tileir_configs_create_an_autotuner_around_the_launch():
    source = src("matmul")
    c = first("triton-tileir-configs", source, "tileir", "sm_100")
    assert c.title.endswith("(new @triton.autotune around the current launch)")
    assert ("@triton.autotune(\n"
            "    configs=_with_tileir_configs([triton.Config({}, num_warps=4, num_stages=2)]),\n"
            '    key=["M", "N", "K"],\n'
            f"{PRUNE_LINE}\n"
            ")\n@triton.jit\ndef matmul_kernel(") in c.source
    removed, added = changes(source, c.source)
    assert {"NUM_WARPS = 4", "NUM_STAGES = 2"} <= set(removed)  # constants nothing reads any more
    assert "                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)" in added


@pytest.mark.parametrize("old,new,why", [
    ('    key=["n"],\n', '    key=["n"],\n    prune_configs_by={"perf_model": None},\n', "already has prune_configs_by"),
])
def test_tileir_configs_skips_an_existing_pruner(old, new, why):
    source = autotuned("vector_add").replace(old, new)
    assert why in reason("triton-tileir-configs", source, "tileir", "sm_100")


def test_tileir_configs_skip_launch_options_a_config_would_override_and_their_own_output():
    source = src("vector_add").replace("num_warps=NUM_WARPS)", "num_warps=NUM_WARPS, maxnreg=128)")
    assert "sets maxnreg" in reason("triton-tileir-configs", source, "tileir", "sm_100")
    done = first("triton-tileir-configs", src("vector_add"), "tileir", "sm_100").source
    assert reason("triton-tileir-configs", done, "tileir", "sm_100") == "the Tile IR configs are already in place"


# --------------------------------------------------------------------------- stock Triton 3.6


class _Target:
    def __init__(self, backend: str):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget(backend, 100, 32)

    def get_current_target(self):
        return self.target


def load_candidate(tmp_path: Path, op: str, source: str):
    from loop.worker.failures import load_module

    return load_module(f"tileir_candidate_{op}", materialise(tmp_path, op, "triton", source))


def test_stock_triton_has_no_occupancy_config_parameter():
    import triton

    with pytest.raises(TypeError):
        triton.Config({}, occupancy=2)  # why the configs carry occupancy in their meta-parameter dict


def test_stock_triton_imports_the_gated_source_and_the_hook_splits_configs_by_backend(tmp_path):
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner

    source = first("triton-tileir-configs", autotuned("vector_add"), "tileir", "sm_100").source
    module = load_candidate(tmp_path, "vector_add", source)
    tuner = module.add_kernel
    assert isinstance(tuner, Autotuner)
    plain = [c for c in tuner.configs if "occupancy" not in c.kwargs]
    tile = [c for c in tuner.configs if "occupancy" in c.kwargs]
    assert len(plain) == 12  # the autotune list as it was
    assert len(tile) == 4 * 4  # 4 block sizes (num_warps collapsed) x occupancy 1/2/4/8
    assert sorted({c.kwargs["occupancy"] for c in tile}) == [1, 2, 4, 8]
    assert {c.kwargs["BLOCK"] for c in tile} == {c.kwargs["BLOCK"] for c in plain}
    assert tuner.configs[0] is plain[0]  # the interpreter (first config only) never sees a Tile IR config
    previous = driver._active
    tuner.nargs = {}  # set by Autotuner.run before it prunes
    try:
        for backend, expected in (("cuda", plain), ("tileir", tile), ("hip", plain)):
            driver.set_active(_Target(backend))
            assert tuner.prune_configs({}) == expected, backend
    finally:
        driver._active = previous


def test_tileir_configs_are_capped(tmp_path):
    source = first("triton-tileir-configs", autotuned("matmul"), "tileir", "sm_100").source
    module = load_candidate(tmp_path, "matmul", source)
    tile = [c for c in module.matmul_kernel.configs if "occupancy" in c.kwargs]
    assert len(tile) == 32  # 4 tile shapes x 4 occupancies x 2 num_ctas
    assert {c.num_ctas for c in tile} == {1, 2}


# --------------------------------------------------------------------------- priority


def test_priority_places_the_new_kinds():
    for cls in ("element-wise", "norm-like", "reduction"):
        order = TRITON_PRIORITY[cls]
        assert order.index("autotune") + 1 == order.index("tileir-configs") < order.index("persistent") < order.index("num_warps")
    dot = TRITON_PRIORITY["dot"]
    assert dot.index("autotune") + 1 == dot.index("tileir-configs")
    assert dot.index("grouped-ordering") < dot.index("persistent") < dot.index("num_stages")


@pytest.mark.slow
def test_next_candidate_offers_tileir_configs_only_on_tileir_runs():
    source = autotuned("softmax")
    keys = lambda an: [c.kind for c in _drain(source, an)]  # noqa: E731
    assert "tileir-configs" not in keys(analyze(source, backend="ptx", arch="sm_90"))
    on_tileir = keys(analyze(source, backend="tileir", arch="sm_100"))
    assert on_tileir[0] == "tileir-configs" and "persistent" in on_tileir


@pytest.mark.parametrize("backend,arch,offered", [("tileir", "sm_100", True), ("ptx", "sm_100", False),
                                                  ("interpreter", "cpu", False)])
def test_the_loop_passes_its_target_backend_and_architecture_to_the_playbook(backend, arch, offered, monkeypatch):
    from loop.common import settings as settings_mod
    from loop.run import core, suggest
    from loop.run.state import RunState

    source = autotuned("softmax")
    monkeypatch.setattr(suggest.gitops, "show_file", lambda root, commit, path: source)
    state = RunState(run_id="no-such-run", branch="b", origin_branch=None, target="kernels/softmax/softmax_triton.py",
                     spec="kernels/softmax/spec.py", language="triton", op="softmax", device="cuda", target_backend=backend,
                     backends=[backend], availability={}, base_commit="0" * 40, seed=0,
                     env={"capability": [10, 0]} if arch == "sm_100" else {}, untracked_at_start=[], policy={},
                     best_commit="0" * 40)
    run = core.Run(REPO_ROOT, state, settings_mod.load())
    assert run.arch == arch
    kinds = [s["kind"] for s in suggest.suggestions(run, limit=9)]
    assert ("tileir-configs" in kinds) == offered, kinds
    assert "persistent" in kinds


def _drain(source: str, an, limit: int = 40) -> list:
    tried, out = [], []
    while len(out) < limit and (c := next_candidate(source, an, tried, [])) is not None:
        tried.append(c.key)
        out.append(c)
    return out


# --------------------------------------------------------------------------- slow: AOT and interpreter

AOT_CASES = [  # (op, source maker)
    ("softmax", lambda: first("triton-persistent", src("softmax")).source),
    ("vector_add", lambda: first("triton-persistent", src("vector_add")).source),
    ("attention", lambda: first("triton-persistent", src("attention")).source),
    ("matmul", lambda: chain("matmul", "triton-autotune", "grouped-ordering", "triton-persistent")),
    ("vector_add", lambda: first("triton-tileir-configs", src("vector_add"), "tileir", "sm_100").source),
    ("matmul", lambda: first("triton-tileir-configs", autotuned("matmul"), "tileir", "sm_100").source),
]


# matmul's autotuned rewrites are built in float16 only: bfloat16, its spec's other dtype, has the same
# width, so the same tiles, shared memory and configs; its builds (every autotune config again) were
# half of the two slowest cases here. test_aot.py builds the matmul first version in both dtypes.
AOT_DTYPES = {"matmul": ["float16"]}


def compile_for(tmp_path: Path, op: str, source: str, capsys, dtypes: list[str] | None = None) -> dict:
    from loop.cli import main

    target = materialise(tmp_path, op, "triton", source, **({"DTYPES": dtypes} if dtypes else {}))
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    return {"rc": rc, **out}


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(AOT_CASES)), ids=[f"{op}-{i}" for i, (op, _) in enumerate(AOT_CASES)])
def test_rewrites_compile_ahead_of_time_for_hopper_and_blackwell(case, tmp_path, env, capsys):
    """Each rewrite builds for sm_90 and sm_100 in every dtype of its spec (matmul: in AOT_DTYPES')."""
    from loop.target.contract import spec_dtypes

    op, make = AOT_CASES[case]
    out = compile_for(tmp_path, op, make(), capsys, AOT_DTYPES.get(op))
    assert out["rc"] == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    assert {r["arch"] for r in out["kernels"]} == {"sm_90", "sm_100"}
    assert {r["dtype"] for r in out["kernels"]} == set(AOT_DTYPES.get(op) or spec_dtypes(KERNELS / op / "spec.py"))


@pytest.mark.slow
def test_without_the_prune_hook_stock_triton_refuses_the_tileir_configs(tmp_path, env, capsys):
    gated = first("triton-tileir-configs", src("vector_add"), "tileir", "sm_100").source
    ungated = gated.replace(PRUNE_LINE + "\n", "")
    assert ungated != gated
    out = compile_for(tmp_path, "vector_add", ungated, capsys)
    assert out["rc"] != 0 and not out["ok"]
    assert all("Keyword argument occupancy was specified but unrecognised" in k["error"] for k in out["kernels"])


INTERPRETER_CASES = [
    ("row_sum", lambda: first("triton-persistent", src("row_sum")).source),
    ("softmax", lambda: first("triton-persistent", src("softmax")).source),
    ("vector_add", lambda: first("triton-persistent", src("vector_add")).source),
    ("matmul", lambda: first("triton-persistent", src("matmul")).source),
    ("attention", lambda: first("triton-persistent", src("attention")).source),
    ("matmul", lambda: chain("matmul", "triton-autotune", "grouped-ordering", "triton-persistent")),
    ("vector_add", lambda: first("triton-tileir-configs", autotuned("vector_add"), "tileir", "sm_100").source),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(INTERPRETER_CASES)),
                         ids=[f"{op}-{i}" for i, (op, _) in enumerate(INTERPRETER_CASES)])
def test_rewrites_pass_their_spec_in_the_interpreter(case, tmp_path, env):
    from loop import backends
    from loop.measure.launch import run_worker
    from loop.common.settings import Settings

    op, make = INTERPRETER_CASES[case]
    target = materialise(tmp_path / "k", op, "triton", make())
    folder = target.parent
    job = {"spec": str(folder / "spec.py"), "target_dir": str(folder), "device": "cpu", "backend": "interpreter",
           "impls": [{"label": "candidate", "path": str(target)}], "check": ["candidate"], "seed": 13, "bench": False}
    res = run_worker(tmp_path / "w", job, backends.get("interpreter"), Settings(worker_timeout_s=600), tmp_path / "cache")
    assert res["status"] == "ok", (res.get("message"), res.get("log_tail", "")[-1500:])
    checks = res["correctness"]["checks"]
    assert checks and all(c["ok"] for c in checks)
    assert res["proof"]["ran"] == "interpreter"
