"""Audited timed requests (`loop/judge/audit.py`): the timing loop runs in the kernel process, where
a candidate can rewrite it; a few timed requests per implementation, at rounds the judge picks at
random, run on fresh inputs with poisoned outputs, and what the timed calls wrote is judged. Under the
interpreter here (the adversaries that rewrite the sampler step through the loop in
tests/test_adversaries.py, on the GPU too); the verdict on audited timings is a pure function."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.judge.corroborate import (AUDIT_BAND, BEYOND_COPY, WAKE_MAX_MS, WAKE_SHARE, beyond_copy, judge_audits,
                                    wake_allowance)
from test_judge import judged

ADVERSARIES = Path(__file__).parent / "adversaries"


def _verdict() -> dict:
    return {"ok": True, "reason": "", "method": "cuda_graph", "labels": {}}


def _rows(sample_ms: float, calls: int, wall_ms: float, n: int = 4, wake_ms: float | None = None) -> list[dict]:
    row = {"sample_ms": sample_ms, "claim_ms": sample_ms * calls, "wall_ms": wall_ms, "ok": True, "reason": ""}
    return [row if wake_ms is None else {**row, "wake_ms": wake_ms}] * n


def test_samples_faster_than_the_audited_ones_are_refused():
    empties = {"candidate": [0.10] * 10}
    honest = judge_audits(_verdict(), {"candidate": _rows(0.020, 50, 1.12)}, empties, {"candidate": [0.0195] * 40})
    assert honest["ok"], honest
    assert honest["labels"]["candidate"]["audits"] == 4 and honest["labels"]["candidate"]["timed_over_audited"] == 0.975
    faster = 0.020 * (1 - AUDIT_BAND["cuda_graph"]) * 0.99
    refused = judge_audits(_verdict(), {"candidate": _rows(0.020, 50, 1.12)}, empties, {"candidate": [faster] * 40})
    assert not refused["ok"] and "the samples no one checked did less work" in refused["reason"]


def test_what_audits_add_to_every_implementation_alike_is_no_cheat():
    # eagerly on an H100: audited calls ~30 us slower than timed ones, for the incumbent as for the candidate
    v = {**_verdict(), "method": "cuda_events_l2_flush"}
    empties = {"incumbent": [0.10] * 10, "candidate": [0.10] * 10}
    audits = {"incumbent": _rows(0.204, 16, 16 * 0.204 + 0.12), "candidate": _rows(0.174, 16, 16 * 0.174 + 0.12)}
    samples = {"incumbent": [0.174] * 40, "candidate": [0.143] * 40}
    assert not judge_audits(dict(v, labels={}), {"candidate": audits["candidate"]}, empties, samples)["ok"]  # alone: refused
    both = judge_audits(dict(v, labels={}), audits, empties, samples)
    assert both["ok"], both
    assert both["labels"]["candidate"]["shared_audit_offset_ms"] == 0.03
    # a candidate that skips work when no one checks shows it on top of the shared offset: still refused
    cheat = {**samples, "candidate": [0.174 * 0.7 - 0.03] * 40}
    refused = judge_audits(dict(v, labels={}), audits, empties, cheat)
    assert not refused["ok"] and refused["label"] == "candidate" and "added to the other implementations" in refused["reason"]
    # an incumbent faster when audited adds nothing (the offset is never below zero)
    fast = {**audits, "incumbent": _rows(0.150, 16, 16 * 0.150 + 0.12)}
    assert not judge_audits(dict(v, labels={}), fast, empties, samples)["ok"]


def test_audited_claims_below_their_wall_time_are_refused():
    empties = {"candidate": [0.10] * 10}
    # audited requests that did the work (their outputs are right) but claim a third of it
    refused = judge_audits(_verdict(), {"candidate": _rows(0.020 / 3, 50, 1.12)}, empties, {"candidate": [0.0066] * 40})
    assert not refused["ok"] and "audited requests claimed" in refused["reason"]
    over = judge_audits(_verdict(), {"candidate": _rows(0.020, 50, 0.5)}, empties, {"candidate": [0.02] * 40})
    assert not over["ok"] and "claim more time than they took" in over["reason"]


# seen on a 4x H200: vector_add at 2^20 timed by CUDA graphs of 30 calls, 4 graph samples a request; the
# rounds' empty requests took ~1 ms, an audited request ~0.445 ms more than its claim and that overhead
OVERHEAD_MS, WAKE_MS = 1.0, 0.445
FAST, SLOW = 0.297 / 120, 2.4 / 120  # ms per call: the candidate's (autotuned) and the incumbent's


def _small_graphs(candidate_wake: float, incumbent_wake: float, candidate_probe: float, incumbent_probe: float,
                  work: float = 0.297) -> tuple[dict, dict, dict]:
    """Audited rows, empties and samples of such a measurement: each audited request's wall time is
    the overhead, the work and the wake-up its process paid; `*_probe`: what its wake-up probes took
    beyond the overhead. The candidate claims FAST per call however long its work took."""
    audits = {"incumbent": _rows(SLOW, 120, OVERHEAD_MS + 2.4 + incumbent_wake, wake_ms=OVERHEAD_MS + incumbent_probe),
              "candidate": _rows(FAST, 120, OVERHEAD_MS + work + candidate_wake, wake_ms=OVERHEAD_MS + candidate_probe)}
    empties = {"incumbent": [OVERHEAD_MS] * 10, "candidate": [OVERHEAD_MS] * 10}
    samples = {"incumbent": [SLOW] * 40, "candidate": [FAST] * 40}
    return audits, empties, samples


def test_the_wake_up_after_the_judges_writes_is_allowed_to_an_honest_fast_candidate():
    """An honest autotuned vector_add, 8x faster than its incumbent at 2^20, was refused: its audited
    requests claimed 0.297 ms and took 0.742 ms beyond the overhead, 0.45 ms of it the wake-up after
    the judge's writes that the rounds' empty requests never pay; the incumbent's 2.4 ms held it
    within the band. The probes of both processes show that wake-up, and it is allowed."""
    audits, empties, samples = _small_graphs(WAKE_MS, WAKE_MS, WAKE_MS, WAKE_MS * 1.1)
    before = judge_audits(_verdict(), {lab: [{k: v for k, v in r.items() if k != "wake_ms"} for r in rows]
                                       for lab, rows in audits.items()}, empties, samples)
    assert not before["ok"] and before["label"] == "candidate" and "audited requests claimed 0.2970 ms" in before["reason"]
    assert "took 0.7420 ms" in before["reason"] and before["audit_wake_allowed_ms"] == 0.0
    now = judge_audits(_verdict(), audits, empties, samples)
    assert now["ok"], now
    assert now["audit_wake_allowed_ms"] == WAKE_MS  # the smaller of the two processes' probes
    assert now["labels"]["candidate"]["audit_wake_ms"] == WAKE_MS
    assert now["labels"]["incumbent"]["audit_wake_ms"] == round(WAKE_MS * 1.1, 5)


def test_a_sampler_that_claims_less_than_its_audited_work_is_refused_whatever_its_own_probes_show():
    # its audited requests did 0.742 ms of work (the outputs are right) and claim 0.297 ms; its own
    # probes padded to look like a wake-up, the incumbent's process showing none
    audits, empties, samples = _small_graphs(0.0, 0.0, 0.45, 0.0, work=0.742)
    assert wake_allowance(audits, empties) == 0.0
    refused = judge_audits(_verdict(), audits, empties, samples)
    assert not refused["ok"] and refused["label"] == "candidate" and "audited requests claimed" in refused["reason"]
    # alone, its own probes allow nothing
    alone = {"candidate": audits["candidate"]}
    assert wake_allowance(alone, empties) == 0.0
    assert not judge_audits(_verdict(), alone, empties, samples)["ok"]
    # an implementation without probes: nothing allowed to any
    unprobed = {**audits, "incumbent": _rows(SLOW, 120, OVERHEAD_MS + 2.4)}
    assert wake_allowance({**unprobed, "candidate": _small_graphs(0.0, 0.0, 0.45, 0.45)[0]["candidate"]}, empties) == 0.0
    # both processes' probes far beyond a wake-up (a host's hiccup): no more than WAKE_MAX_MS allowed
    hiccup, _, _ = _small_graphs(0.0, 0.0, 5.0, 5.0, work=0.742 + 2.0)
    assert wake_allowance(hiccup, empties) == WAKE_MAX_MS
    refused = judge_audits(_verdict(), hiccup, empties, samples)
    assert not refused["ok"] and refused["label"] == "candidate" and "allowed as the wake-up" in refused["reason"]
    # the same under-claim with the wake-up both processes really pay: still refused
    paid = _small_graphs(WAKE_MS, WAKE_MS, WAKE_MS, WAKE_MS, work=0.742)
    refused = judge_audits(_verdict(), *paid)
    assert not refused["ok"] and refused["label"] == "candidate" and "audited requests claimed" in refused["reason"]


def test_requests_that_claim_far_less_than_a_wake_up_get_no_more_of_it_than_a_multiple_of_their_claim():
    """A candidate that makes its requests one short sample (its prepare claims a long call) would
    otherwise claim nearly nothing for work it did when audited, the wake-up allowed covering it."""
    v = {**_verdict(), "method": "cuda_events_l2_flush"}
    slow, work, claim = 0.40, 0.10, 0.01  # ms: the incumbent's eager call, the candidate's, a tenth of it claimed
    audits = {"incumbent": _rows(slow, 1, OVERHEAD_MS + slow + WAKE_MS, wake_ms=OVERHEAD_MS + WAKE_MS),
              "candidate": _rows(claim, 1, OVERHEAD_MS + work + WAKE_MS, wake_ms=OVERHEAD_MS + WAKE_MS)}
    empties = {"incumbent": [OVERHEAD_MS] * 10, "candidate": [OVERHEAD_MS] * 10}
    samples = {"incumbent": [slow] * 40, "candidate": [claim] * 40}
    assert wake_allowance(audits, empties) == pytest.approx(WAKE_MS)
    refused = judge_audits(dict(v, labels={}), audits, empties, samples)
    assert not refused["ok"] and refused["label"] == "candidate", refused
    assert f"{WAKE_SHARE * claim:.4f} ms of it allowed as the wake-up" in refused["reason"]
    # where the claims are a good share of the wake-up (the autotuned vector_add above), all of it is allowed
    audits, empties, samples = _small_graphs(WAKE_MS, WAKE_MS, WAKE_MS, WAKE_MS)
    assert WAKE_SHARE * 0.297 > WAKE_MS and judge_audits(_verdict(), audits, empties, samples)["ok"]


def test_judging_audits_leaves_the_verdict_it_was_given_as_it_was():
    audits, empties, samples = _small_graphs(WAKE_MS, WAKE_MS, WAKE_MS, WAKE_MS)
    given = {**_verdict(), "labels": {"candidate": {"claimed_ms": 0.297}}}
    judged_ = judge_audits(given, audits, empties, samples)
    assert given == {**_verdict(), "labels": {"candidate": {"claimed_ms": 0.297}}}
    assert judged_["labels"]["candidate"]["claimed_ms"] == 0.297 and judged_["labels"]["candidate"]["audits"] == 4


def test_a_claim_beyond_the_copy_bandwidth_is_refused():
    assert beyond_copy({"candidate": 2900.0}, 3000.0) is None  # an honest memory-bound kernel near the roofline
    assert beyond_copy({"candidate": None}, 3000.0) is None  # no bytes model
    assert beyond_copy({"candidate": 10 * 3000.0}, None) is None  # no reference (the CPU, tiny shapes)
    why = beyond_copy({"candidate": BEYOND_COPY * 3000.0 * 1.01}, 3000.0)
    assert why and why.startswith("candidate: claimed 6060 GB/s") and "copy bandwidth" in why


def test_a_sampler_that_skips_timed_calls_is_refused(tmp_path, env):
    """Once kept at a claimed 45343x under the interpreter: its replays did the work, its timed samples none."""
    raw = judged(tmp_path, ADVERSARIES / "skip_when_sampled.py")
    assert raw["status"] == "incorrect" and raw["failed_impl"] == "candidate", raw
    assert "audited timed request" in raw["message"] and "NaN" in raw["message"]


def test_under_the_interpreter_every_sample_is_audited(tmp_path, env):
    """Work done only when audited is work done at every sample: there is no sample no one checked
    (on a GPU, where a few requests are audited, the same candidate is refused: test_adversaries)."""
    raw = judged(tmp_path, ADVERSARIES / "work_when_audited.py")
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    for label, rc in shape["recheck"].items():
        assert rc["ok"] and rc["audits"] == shape["impls"][label]["nrep"] >= 6, (label, rc, shape["impls"][label])


def test_an_honest_candidate_passes_its_audits(tmp_path, env):
    raw = judged(tmp_path, Path(__file__).parent.parent / "kernels" / "vector_add" / "vector_add_triton.py")
    assert raw["status"] == "ok", raw
    shape = raw["timing"]["shapes"][0]
    for label in ("incumbent", "candidate"):  # under the interpreter, every sample
        n = shape["impls"][label]["nrep"]
        assert shape["recheck"][label] == {"ok": True, "audits": n} and n >= 6
        assert shape["corroboration"]["labels"][label]["audits"] == n
        assert isinstance(shape["corroboration"]["labels"][label]["audit_wake_ms"], float)  # each audit probed
    assert 0.0 <= shape["corroboration"]["audit_wake_allowed_ms"] <= min(
        max(shape["corroboration"]["labels"][lab]["audit_wake_ms"], 0.0) for lab in ("incumbent", "candidate"))


RETURNS_NEW = '''
import torch

def run(x, y, out):
    fresh = torch.empty_like(out)  # a tensor of its own, returned: the judge reads what the timed call returned
    n = fresh.numel()
    add_kernel[(triton.cdiv(n, BLOCK),)](x, y, fresh, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return fresh
'''


def _returning(tmp_path: Path, tail: str = "") -> Path:
    source = (Path(__file__).parent.parent / "kernels" / "vector_add" / "vector_add_triton.py").read_text()
    path = tmp_path / "returning.py"
    path.write_text(source.split("def run(")[0] + RETURNS_NEW + tail)
    return path


def test_a_kernel_that_returns_its_output_is_audited_on_what_it_returned(tmp_path, env):
    raw = judged(tmp_path / "judged", _returning(tmp_path))
    assert raw["status"] == "ok", raw
    shape = raw["timing"]["shapes"][0]
    assert shape["recheck"]["candidate"] == {"ok": True, "audits": shape["impls"]["candidate"]["nrep"]}


SKIP_SAMPLED = '''
import sys
_sampler = sys.modules.get("loop.worker.sampler")
if _sampler is not None:
    _real = _sampler.Sampler.sample
    _sampler.Sampler.sample = lambda self, rnd, empty=False: _real(self, rnd, True)
'''


def test_a_returned_output_left_from_an_earlier_call_is_refused(tmp_path, env):
    """No poison reaches a tensor the kernel process allocated on the CPU; the fresh inputs find it stale."""
    raw = judged(tmp_path / "judged", _returning(tmp_path, SKIP_SAMPLED))
    assert raw["status"] == "incorrect" and raw["failed_impl"] == "candidate", raw
    assert "audited timed request" in raw["message"] and "elements outside" in raw["message"]


@pytest.mark.gpu
@pytest.mark.parametrize("skip", [False, True], ids=["honest", "skips-timed-calls"])
def test_on_a_gpu_the_outputs_a_graph_returned_are_read_where_it_wrote_them(tmp_path, skip):
    """A CUDA graph of a kernel that returns new tensors: the judge maps the graph's outputs by IPC
    handle, poisons them before each audit and reads them after it."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    raw = judged(tmp_path / "judged", _returning(tmp_path, SKIP_SAMPLED if skip else ""), device="cuda")
    if skip:
        assert raw["status"] == "incorrect" and raw["failed_impl"] == "candidate", raw
        assert "audited timed request" in raw["message"] and "NaN" in raw["message"]
        return
    assert raw["status"] == "ok", raw
    shape = raw["timing"]["shapes"][0]
    assert shape["method"] == "cuda_graph" and shape["recheck"]["candidate"] == {"ok": True, "audits": 4}, shape


AUTOTUNED = '''"""vector_add autotuned over BLOCK x num_warps (12 configs, key n): the playbook's recipe."""

import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 1024, 4096) for w in (1, 2, 4, 8)],
                 key=["n"])
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def run(x, y, out):
    n = out.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return out
'''


@pytest.mark.gpu
def test_on_a_gpu_an_honest_autotuned_candidate_at_a_small_shape_passes_its_audits(tmp_path):
    """Refused on a 4x H200 before the wake-up probe (its audited requests claimed 0.297 ms and took
    0.742 ms beyond the overhead): vector_add autotuned, against its first version, at 2^20."""
    import shutil

    import torch

    from conftest import REPO_ROOT
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    op = REPO_ROOT / "kernels" / "vector_add"
    shutil.copy(op / "vector_add_triton.py", tmp_path / "incumbent.py")
    (tmp_path / "candidate.py").write_text(AUTOTUNED)
    job = {"spec": str(op / "spec.py"), "target_dir": str(op), "target": str(op / "vector_add_triton.py"),
           "device": "cuda", "backend": "ptx", "check": ["candidate"], "seed": 3, "bench": True,
           "impls": [{"label": "incumbent", "path": str(tmp_path / "incumbent.py")},
                     {"label": "candidate", "path": str(tmp_path / "candidate.py")}],
           "dtypes": ["float32"], "correctness_shapes": [[127], [4097]], "bench_shapes": [[1 << 20]]}
    raw = run_worker(tmp_path, job, backends.get("ptx"), Settings(), tmp_path / "cache", name="judged")
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    corroboration = shape["corroboration"]
    assert shape["method"] == "cuda_graph" and corroboration["ok"], corroboration
    for label in ("incumbent", "candidate"):
        assert shape["recheck"][label]["ok"] and isinstance(corroboration["labels"][label]["audit_wake_ms"], float)


def test_a_slow_make_inputs_gets_fewer_audits_and_says_so():
    from loop.judge.audit import AUDITS, MIN_AUDITS, Auditor

    fast = Auditor(None, None, None, {}, [], ((8,), "float32"), [], "cuda", set_s=1e-4)
    fast.used = 50
    assert fast.count(2) == AUDITS["cuda"] and fast.note(2) == []
    slow = Auditor(None, None, None, {}, [], ((8192, 8192), "bfloat16"), [], "cuda", set_s=0.35)  # CPU-made inputs
    slow.used = 2
    assert slow.count(2) == MIN_AUDITS
    assert slow.note(2) == [f"{MIN_AUDITS} audited requests per implementation over 2 input set(s): the spec's "
                            "make_inputs takes 350 ms a set (make them on the device for more)"]
