"""torch.compile as a baseline (`loop.worker.compiled`): compiled code at every shape and dtype of a
spec with more than eight shape x dtype pairs (dynamo's default recompile limit), or a failure with
the reason, never a silent eager run; `report --measure` and `compare` turn that failure into
`unavailable: <why>` for torch.compile (`loop.tools.final.without_failed_compile`).

The fast tests compile with dynamo's "eager" backend (dynamo's recompile limit is dynamo's, whatever
the backend); the slow one runs inductor through a real judged measurement on the CPU."""

from __future__ import annotations

import shutil
import textwrap
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO_ROOT
from loop.suite import summary
from loop.tools import final
from loop.worker.bench import tuned_configs
from loop.worker.compiled import CompiledReference, recompile_limit, spec_pairs
from loop.worker.failures import KernelFailure
from loop.worker.serve import torch_provider

SHAPES = [(n, 7) for n in range(1, 7)]  # six shapes, two dtypes: twelve pairs, over dynamo's eight (the slow test: twenty)
DTYPES = [torch.float32, torch.float16]


@pytest.fixture(autouse=True)
def dynamo_config():
    cfg = torch._dynamo.config
    saved = (cfg.recompile_limit, cfg.accumulated_recompile_limit, cfg.fail_on_recompile_limit_hit)
    torch._dynamo.reset()
    yield cfg
    cfg.recompile_limit, cfg.accumulated_recompile_limit, cfg.fail_on_recompile_limit_hit = saved
    torch._dynamo.reset()


def _pairs():
    for dtype in DTYPES:
        for shape in SHAPES:
            yield {"x": torch.randn(shape, dtype=dtype), "w": torch.randn(shape[-1], dtype=dtype)}


def test_plain_torch_compile_runs_eagerly_past_eight_pairs():
    """What the baseline did before: the same function compiled with dynamic=False, its graphs
    counted, runs eagerly without a word from the ninth pair on."""
    graphs = []

    def counting(gm, example_inputs):
        def run(*args):
            graphs.append(1)
            return gm(*args)
        return run

    def reference(x, w):
        return (x.float() * w.float()).sum(-1)

    fn = torch.compile(reference, dynamic=False, backend=counting)
    ran = []
    for inputs in _pairs():
        before = len(graphs)
        torch.testing.assert_close(fn(**inputs), reference(**inputs))
        ran.append(len(graphs) > before)
    assert ran[:8] == [True] * 8 and not any(ran[8:])


def test_every_pair_of_a_spec_beyond_eight_runs_compiled_code():
    def reference(x, w):
        return (x.float() * w.float()).sum(-1)

    compiled = CompiledReference(torch, reference, pairs=len(SHAPES) * len(DTYPES), backend="eager")
    for i, inputs in enumerate(_pairs(), 1):
        torch.testing.assert_close(compiled.run(**inputs), reference(**inputs))
        assert compiled.graph_runs == i  # one compiled graph ran at every call
    assert len(compiled.seen) == 12 and set(compiled.seen.values()) == {"compiled: 1 graph per call"}
    assert torch._dynamo.config.recompile_limit >= 12 and torch._dynamo.config.fail_on_recompile_limit_hit
    again = next(_pairs())  # a signature seen before: its cached graph, still counted
    compiled.run(**again)
    assert compiled.graph_runs == 13 and compiled.graphs_compiled == 12


def test_the_recompile_limit_hit_is_a_failure_with_the_reason(dynamo_config):
    def reference(x, w):
        return x * w

    compiled = CompiledReference(torch, reference, pairs=2, backend="eager")
    dynamo_config.recompile_limit = 3  # as if the spec had more pairs than the limit was raised for
    with pytest.raises(KernelFailure) as info:
        for inputs in _pairs():
            compiled.run(**inputs)
    assert info.value.status == "compile_error" and info.value.label == "torch_compile"
    assert "recompile limit (3)" in info.value.message and "x=(4, 7) float32" in info.value.message
    assert len(compiled.seen) == 3


def test_a_call_that_ran_no_compiled_graph_is_a_failure(dynamo_config):
    """Whatever made dynamo run the function eagerly (here the limit with the hard failure turned
    off again), the counted graphs tell."""
    def reference(x, w):
        return x + w

    compiled = CompiledReference(torch, reference, pairs=2, backend="eager")
    dynamo_config.recompile_limit, dynamo_config.fail_on_recompile_limit_hit = 2, False
    with pytest.raises(KernelFailure, match=r"ran no compiled graph at x=\(3, 7\) float32"):
        for inputs in _pairs():
            compiled.run(**inputs)


def test_a_reference_dynamo_makes_no_graph_of_is_a_failure():
    def reference(x, w):
        return x

    with pytest.raises(KernelFailure, match="ran no compiled graph"):
        CompiledReference(torch, reference, pairs=1, backend="eager").run(x=torch.ones(3), w=torch.ones(3))


def test_graph_breaks_are_recorded_per_shape_where_the_judge_reads_picks():
    def reference(x, w):
        y = x * w
        torch._dynamo.graph_break()
        return y + 1

    compiled = CompiledReference(torch, reference, pairs=1, backend="eager")
    inputs = next(_pairs())
    torch.testing.assert_close(compiled.run(**inputs), inputs["x"] * inputs["w"] + 1)
    (what,) = compiled.seen.values()
    assert what.startswith("compiled: 2 graphs per call (graph breaks: ")
    picks = tuned_configs(compiled)  # what the kernel process answers the judge's `tuned` request with
    assert list(picks.values()) == [repr(what)]
    assert final.compile_notes({"tuned": picks}) == what


def test_inductor_compiles_in_the_kernel_process_with_no_pool_of_workers(monkeypatch):
    """A pool of inductor's compile workers would use CPU while the judge holds the kernel process
    stopped, and the judge refuses that (torch.compile `unavailable: uncorroborated` on an H200)."""
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config, "compile_threads", 8)
    CompiledReference(torch, lambda x: x + 1, 4, backend="eager")
    assert inductor_config.compile_threads == 8  # another backend: inductor's settings are not ours to change
    CompiledReference(torch, lambda x: x + 1, 4)
    assert inductor_config.compile_threads == 1


def test_the_provider_raises_the_limit_for_the_specs_pairs():
    spec = SimpleNamespace(module=SimpleNamespace(reference=lambda x: x * 2), correctness_shapes=[(n,) for n in range(1, 41)],
                           benchmark_shapes=[(4096,), (8192,)], interpreter_shapes=[(40,)], dtypes=["float16", "float32"])
    assert spec_pairs(spec) == 84  # (40 + 2) shapes, (40,) counted once, times two dtypes
    provider = torch_provider(torch, spec, "torch_compile")
    assert isinstance(provider, CompiledReference) and provider.limit == recompile_limit(84) == 200
    assert torch._dynamo.config.recompile_limit == 200
    eager = torch_provider(torch, spec, "torch_eager")
    assert not isinstance(eager, CompiledReference) and eager.run is spec.module.reference


def _timing(*labels, tuned=None):
    impls = {lab: {"median_ms": t} for lab, t in labels}
    if tuned:
        impls["torch_compile"]["tuned"] = tuned
    return {"status": "ok", "timing": {"shapes": [{"shape": [8, 8], "dtype": "float16", "method": "cuda_graph", "impls": impls}]}}


def test_a_failed_torch_compile_is_measured_again_without_it_and_unavailable():
    jobs = []

    def measure(job):
        jobs.append(job)
        if "torch_compile" in job["torch_providers"]:
            return {"status": "compile_error", "failed_impl": "torch_compile",
                    "message": "torch.compile hit dynamo's recompile limit (64) at x=(8, 8) float16"}
        return _timing(("best", 1.0), ("torch_eager", 2.0))

    job = {"torch_providers": ["torch_eager", "torch_compile"], "check": ["best", "torch_eager", "torch_compile"], "seed": 1}
    raw = final.without_failed_compile(measure, job)
    assert [j["torch_providers"] for j in jobs] == [["torch_eager", "torch_compile"], ["torch_eager"]]
    assert jobs[1]["check"] == ["best", "torch_eager"] and jobs[1]["seed"] == 1
    assert raw["torch_compile"] == {"status": "unavailable", "reason": "compile_error: " + measure(job)["message"]}
    table = final.final_rows(raw)
    (row,) = table["rows"]
    assert row["torch.compile (ms)"].startswith("unavailable: compile_error: torch.compile hit dynamo's recompile limit")
    assert row["vs torch.compile"] == "n/a" and row["vs eager"] == "2.00x" and table["torch_compile"] == raw["torch_compile"]
    entry = {"op": "softmax", "language": "triton", "final": table["rows"], "final_largest": row, "largest_shape": {}}
    (target,) = [r for r in summary.target_rows([entry]) if r["target"].startswith("torch.compile")]
    assert target["result"] == "not measured" and "unavailable: compile_error" in target["target"]


def test_other_failures_are_not_measured_again():
    calls = []

    def measure(job):
        calls.append(job)
        return {"status": "incorrect", "failed_impl": "best", "message": "wrong"}

    assert final.without_failed_compile(measure, {"torch_providers": ["torch_compile"], "check": ["best"]})["status"] == "incorrect"
    assert len(calls) == 1


def test_final_rows_carry_graph_breaks_and_times_when_compiled():
    breaks = {"'x=(8, 8) float16'": "'compiled: 2 graphs per call (graph breaks: print)'"}
    table = final.final_rows(_timing(("best", 1.0), ("torch_eager", 2.0), ("torch_compile", 1.5), tuned=breaks))
    (row,) = table["rows"]
    assert row["torch.compile (ms)"] == "1.500000" and row["vs torch.compile"] == "1.50x"
    assert row["torch.compile notes"] == "compiled: 2 graphs per call (graph breaks: print)" and "torch_compile" not in table
    plain = final.final_rows(_timing(("best", 1.0), ("torch_eager", 2.0), ("torch_compile", 1.5),
                                     tuned={"'x'": "'compiled: 1 graph per call'"}))
    assert "torch.compile notes" not in plain["rows"][0]


SPEC_PAIRS = '''
DTYPES = ["float32", "float16"]
CORRECTNESS_SHAPES = [(1, 1), (3, 17), (5, 64), (7, 100), (9, 129)]
INTERPRETER_SHAPES = [(12, 96)]
'''


@pytest.mark.slow
def test_a_judged_measurement_runs_compiled_code_past_eight_pairs(tmp_path, env):
    """The softmax spec with five correctness shapes and two dtypes, torch.compile (inductor on the
    CPU) checked at all ten pairs, then timed beside the kernel at an eleventh: correct everywhere,
    compiled code at every pair (the timed one's compiled graph in the result), no eager fallback."""
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    op = tmp_path / "softmax"
    op.mkdir()
    shutil.copyfile(REPO_ROOT / "kernels" / "softmax" / "softmax_triton.py", op / "softmax_triton.py")
    spec = (REPO_ROOT / "kernels" / "softmax" / "spec.py").read_text()
    (op / "spec.py").write_text(spec + textwrap.dedent(SPEC_PAIRS))
    job = {"spec": str(op / "spec.py"), "target_dir": str(op), "device": "cpu", "backend": "interpreter",
           "impls": [{"label": "best", "path": str(op / "softmax_triton.py")}], "torch_providers": ["torch_eager", "torch_compile"],
           "check": ["torch_compile"], "seed": 7, "bench": True, "timing": {"min_reps": 2, "max_reps": 3, "budget_s": 0.05}}
    raw = final.without_failed_compile(
        lambda j: run_worker(tmp_path, j, backends.get("interpreter"), Settings(), tmp_path / "cache", name="compiled"), job)
    assert raw["status"] == "ok", raw.get("message")
    assert "torch_compile" not in raw, raw.get("torch_compile")  # not measured again: it ran compiled code everywhere
    checks = [c for c in raw["correctness"]["checks"] if c["label"] == "torch_compile"]
    assert len(checks) == 10 and all(c["ok"] for c in checks)
    (timed,) = raw["timing"]["shapes"]
    assert timed["shape"] == [12, 96] and timed["impls"]["torch_compile"]["median_ms"] > 0
    assert list(timed["impls"]["torch_compile"]["tuned"].values()) == ["'compiled: 1 graph per call'"]
