"""The judge (loop/judge/): timing claims checked against its own clock (pure functions), and judged
measurements through the real processes on the CPU, where a candidate that bends the comparison in
its own process, or scales its own clock, is refused."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from loop import backends
from loop.common.settings import Settings
from loop.judge.corroborate import judge_timing
from loop.measure.launch import JudgeAhead, run_worker

ADVERSARIES = Path(__file__).parent / "adversaries"
GRAPH = "cuda_graph"


def honest(ms: float, n: int = 40, overhead: float = 0.08) -> tuple[list[float], list[float]]:
    """Claims of `ms` per sample and request walls of the same work plus a round trip."""
    claims = [ms * (1 + 0.01 * ((i % 5) - 2)) for i in range(n)]
    return claims, [c + overhead + 0.005 * (i % 3) for i, c in enumerate(claims)]


def empties(overhead: float = 0.08) -> list[float]:
    return [overhead - 0.003, overhead, overhead + 0.004, overhead, overhead + 0.002, overhead - 0.001]


def verdict(inc_ms: float, cand_ms: float, cand_claim_scale: float = 1.0) -> dict:
    """Requests of about the size the judge asks for on a GPU (BATCH_MS of work)."""
    (ci, wi), (cc, wc) = honest(inc_ms), honest(cand_ms)
    return judge_timing(GRAPH, {"incumbent": ci, "candidate": [c * cand_claim_scale for c in cc]},
                        {"incumbent": wi, "candidate": wc}, {"incumbent": empties(), "candidate": empties()},
                        ("incumbent", "candidate"))


def test_honest_claims_pass_and_a_real_speedup_stands():
    out = verdict(4.0, 2.0)
    assert out["ok"], out
    assert out["claimed_speedup"] == pytest.approx(2.0, rel=0.02) and out["wall_speedup"] == pytest.approx(2.0, rel=0.05)


@pytest.mark.parametrize("scale", [0.5, 0.85])
def test_a_candidate_that_scales_its_clock_down_is_refused(scale):
    out = verdict(4.0, 4.0, cand_claim_scale=scale)
    assert not out["ok"]
    assert "judge's clock" in out["reason"]


def test_a_sample_claiming_more_time_than_its_request_took_is_refused():
    claims, walls = honest(1.0)
    claims[7] = walls[7] * 2
    out = judge_timing(GRAPH, {"baseline": claims}, {"baseline": walls}, {"baseline": empties()}, None)
    assert not out["ok"] and "more time than they took" in out["reason"]


def test_a_small_fake_within_the_band_passes_and_the_band_is_what_the_docstring_says():
    """A gain faked below the band is not caught here (the band is documented, not hidden)."""
    assert verdict(4.0, 4.0, cand_claim_scale=0.97)["ok"]
    assert not verdict(4.0, 4.0, cand_claim_scale=0.90)["ok"]


def judged(tmp_path: Path, candidate: Path, ahead: bool = False, host=None, device: str = "cpu",
           timing: dict | None = None) -> dict:
    """`candidate` judged against vector_add's own code: under the interpreter, or on the GPU (PTX)
    at one shape of 2^24 elements with the default timing plan (`timing`: another plan)."""
    op = REPO_ROOT / "kernels" / "vector_add"
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(op / "vector_add_triton.py", tmp_path / "incumbent.py")
    shutil.copy(candidate, tmp_path / "candidate.py")
    backend = "interpreter" if device == "cpu" else "ptx"
    job = {"spec": str(op / "spec.py"), "target_dir": str(op), "target": str(op / "vector_add_triton.py"),
           "device": device, "backend": backend, "check": ["candidate"], "seed": 3, "bench": True,
           "impls": [{"label": "incumbent", "path": str(tmp_path / "incumbent.py")},
                     {"label": "candidate", "path": str(tmp_path / "candidate.py")}],
           "dtypes": ["float32"], "correctness_shapes": [[127], [4097]],
           **({"bench_shapes": [[2048]], "timing": {"min_reps": 6, "max_reps": 8, "budget_s": 0.2}} if device == "cpu"
              else {"bench_shapes": [[1 << 24]]})}
    if timing is not None:
        job["timing"] = timing
    started = JudgeAhead(tmp_path, "judged", backends.get(backend), Settings(), tmp_path / "cache", device, 2,
                         host=host) if ahead else None
    return run_worker(tmp_path, job, backends.get(backend), Settings(), tmp_path / "cache", name="judged",
                      ahead=started, host=host)


@pytest.mark.parametrize("name, status", [("replace_comparison", "incorrect"), ("scale_timer", "uncorroborated")])
def test_the_judge_refuses_what_the_candidate_decided_in_its_own_process(tmp_path, env, name, status):
    raw = judged(tmp_path, ADVERSARIES / f"{name}.py")
    assert raw["status"] == status, raw
    assert raw["failed_impl"] == "candidate"
    assert not list(tmp_path.glob("*.pid"))  # judge and kernel processes are gone


def test_an_honest_candidate_is_measured_and_corroborated(tmp_path, env):
    raw = judged(tmp_path, REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py")
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    assert shape["corroboration"]["ok"] and set(shape["impls"]) == {"incumbent", "candidate"}
    assert all(rc["ok"] for rc in shape["recheck"].values())
    logs = sorted(p.name for p in tmp_path.glob("*.kernel.log"))
    assert logs == ["judged-candidate.kernel.log", "judged-incumbent.kernel.log"]  # one process per implementation


@pytest.mark.slow
def test_a_judge_started_ahead_of_its_job_judges_it_with_the_processes_it_started(tmp_path, env):
    """The orchestrator starts the judge before the commit; the job comes later over a pipe. The
    verdict is the same, the two kernel processes started first are the implementations'."""
    raw = judged(tmp_path, ADVERSARIES / "replace_comparison.py", ahead=True)
    assert raw["status"] == "incorrect" and raw["failed_impl"] == "candidate", raw
    assert not list(tmp_path.glob("*.pid"))
    raw = judged(tmp_path, REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py", ahead=True)
    assert raw["status"] == "ok", raw
    phases = raw["phases_s"]
    assert phases["warm"] <= phases["job"] <= phases["checked"] <= phases["timed"]
    assert phases["candidate.warm"] <= phases["candidate.loaded"]  # its kernel process was ready before its job
    assert sorted(p.name for p in tmp_path.glob("*.kernel.log")) == ["judged-candidate.kernel.log", "judged-incumbent.kernel.log"]


def test_a_judge_called_off_ends_with_its_kernel_processes(tmp_path, env):
    ahead = JudgeAhead(tmp_path, "judged", backends.get("interpreter"), Settings(), tmp_path / "cache", "cpu", 2)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("judged-*.kernel.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in tmp_path.glob("judged-*.kernel.pid")]
    assert len(pids) == 2
    ahead.cancel()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
    assert not (tmp_path / "judged.pid").exists() and not (tmp_path / "judged.result.json").exists()


def alive(pid: int) -> bool:
    """Alive and not a zombie (a killed child of a killed parent is reaped by init, at once or soon)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_kernel_processes_hold_neither_the_result_pipe_nor_the_job_pipe(tmp_path, env):
    """Forked from the judge (torch shared), a kernel process keeps only its own two pipes: the pipe
    the verdict travels on, and the one the job comes on, are closed in it before any kernel code runs."""
    ahead = JudgeAhead(tmp_path, "judged", backends.get("interpreter"), Settings(), tmp_path / "cache", "cpu", 2)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("judged-*.kernel.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the children close what they inherited first thing
        guarded = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in (ahead.launched.piped.read_fd, ahead.launched.job_w)}
        for pid_file in tmp_path.glob("judged-*.kernel.pid"):
            fd_dir = Path(f"/proc/{int(pid_file.read_text())}/fd")
            held = {os.readlink(fd_dir / fd) for fd in os.listdir(fd_dir)}
            assert not held & guarded, (pid_file.name, held)
            assert len([h for h in held if h.startswith("pipe:")]) == 2, held  # its own two
    finally:
        ahead.cancel()


class _Captures:
    """A kernel process that captures whatever it is asked to (the method's choice is the judge's)."""

    def __init__(self, note: str = ""):
        self.note = note

    def send(self, message: dict, label: str) -> None:
        self.asked = message

    def answer(self, message: dict, label: str) -> dict:
        return {"ok": True, "captured": True, **({"note": self.note} if self.note else {})}

    def request(self, message: dict, label: str) -> dict:
        self.send(message, label)
        return self.answer(message, label) if message.get("op") == "capture" else {"ok": True}


class _Audits:
    """An auditor that agrees to audit whatever method the judge chose."""

    def timed_as(self, method: str, calls: int, used: int, captured) -> None:
        self.method, self.calls, self.used = method, calls, used


def test_a_slow_torch_baseline_does_not_push_the_implementations_off_cuda_graphs():
    """`report --measure`: PyTorch eager at 0.51 ms once made every implementation eager (host noise
    of 0.92x and 1.41x for one code); the implementations under study choose the method."""
    from loop.common.messages import JudgeJob
    from loop.common.timing import GRAPH_BELOW_MS, TimingPlan
    from loop.judge.bench import Bench

    kernels = {"best": _Captures(), "torch_eager": _Captures("torch_eager: captured at the second try (x)")}
    job = JudgeJob("spec.py", ".", "cuda", None, (), ("best",), torch_providers=("torch_eager",))
    bench = Bench(None, None, None, kernels, job, None)
    prepared = {"best": {"call_ms": 0.05}, "torch_eager": {"call_ms": GRAPH_BELOW_MS * 1.02}}
    auditor = _Audits()
    method, calls, notes = bench.method(prepared, 4, 8, TimingPlan(), auditor)
    assert method == "cuda_graph" and 4 <= calls <= 8  # one call per input set: at most the sets shared
    assert (auditor.method, auditor.calls, auditor.used) == ("cuda_graph", calls, calls)
    assert kernels["best"].asked == {"op": "capture", "calls": calls}
    assert notes[0].startswith(f"CUDA graphs of {calls} call(s): the slowest call (best)")  # why, first
    assert notes[1:] == ["torch_eager: captured at the second try (x)"]  # said, not hidden
    prepared["best"]["call_ms"] = GRAPH_BELOW_MS * 2  # an implementation's own slow call still decides
    method, calls, notes = bench.method(prepared, 4, 8, TimingPlan(), auditor)
    assert method == "cuda_events_l2_flush" and calls == 1 and auditor.used == 4
    assert notes == [f"timed eagerly: the slowest call (best) takes {GRAPH_BELOW_MS * 2:.3f} ms (CUDA graphs below "
                     f"{GRAPH_BELOW_MS} ms)"]


VECTOR_ADD = REPO_ROOT / "kernels" / "vector_add" / "vector_add_triton.py"


def _interleaved(after_candidate: float, after_itself: float, rounds: int = 20, noise: float = 0.03):
    """The incumbent's claims and predecessors of `rounds` ABBA rounds (`bench.round_order`): its
    request in an odd round follows the candidate's, in an even one its own; each claim jittered by up
    to `noise` (a deterministic pattern, so that the test is the same every run)."""
    from loop.judge.bench import round_order
    from loop.common.timing import abba

    claims, follows, last = [], [], None
    for rnd in range(rounds):
        for lab in abba(round_order(["candidate", "incumbent"], ("incumbent", "candidate")), rnd):
            if lab == "incumbent":
                base = after_candidate if last == "candidate" else after_itself
                claims.append(base * (1 + noise * ((rnd * 7) % 5 - 2) / 2))
                follows.append(last)
            last = lab
    return {"incumbent": claims, "candidate": [1.0] * rounds}, {"incumbent": follows, "candidate": [None] * rounds}


def test_the_incumbent_follows_both_the_candidate_and_itself_in_the_rounds():
    _, follows = _interleaved(1.0, 1.0)
    assert follows["incumbent"].count("candidate") >= 9 and follows["incumbent"].count("incumbent") >= 9


@pytest.mark.parametrize("method", ["cuda_graph", "cuda_events_l2_flush", "interpreter_wallclock"])
def test_an_incumbent_slowed_right_after_the_candidate_refuses_the_candidate(method):
    from loop.judge.corroborate import INTERFERENCE_BAND, interference

    pair = ("incumbent", "candidate")
    band = INTERFERENCE_BAND[method]
    honest = interference(method, *_interleaved(1.0, 1.0), pair)
    assert honest["ok"] and honest["n"] >= 9 and abs(honest["slower"] - 1) < band, honest
    within = interference(method, *_interleaved(1 + band / 2, 1.0), pair)  # a switch's cost, within the band
    assert within["ok"], within
    slowed = interference(method, *_interleaved(1 + 3 * band, 1.0), pair)
    assert not slowed["ok"] and slowed["reason"].startswith("candidate: interferes: the incumbent ran"), slowed
    assert slowed["lo"] > 1 + band and slowed["after_candidate_ms"] > slowed["after_itself_ms"]
    # not symmetric: an incumbent slower after itself than after the candidate says nothing against the candidate
    assert interference(method, *_interleaved(1.0, 1 + 3 * band), pair)["ok"]
    assert interference(method, *_interleaved(1 + 3 * band, 1.0), None) is None  # no pair, no check


def test_a_load_that_hits_some_pairs_only_is_no_interference():
    """A CPU shared with other work: four of seven of the incumbent's requests after the candidate's
    met a burst of load that its requests after its own missed. The median says 60% slower, but the
    other three pairs say no slower: a distribution-free interval (min..max at seven pairs) does not
    call that an effect, where one from the spread of the middle pairs would have refused an honest
    candidate."""
    from loop.common.stats import median_interval
    from loop.judge.corroborate import interference

    after_candidate, after_itself = [50.0, 51.0, 49.0, 52.0, 30.0, 31.0, 30.0], [30.0, 30.5, 29.8, 31.0, 30.0, 30.5, 29.9]
    claims = {"incumbent": [x for pair in zip(after_candidate, after_itself) for x in pair], "candidate": [6.0] * 14}
    follows = {"incumbent": ["candidate", "incumbent"] * 7, "candidate": ["incumbent"] * 14}
    out = interference("interpreter_wallclock", claims, follows, ("incumbent", "candidate"))
    assert out["ok"] and out["n"] == 7 and out["slower"] > 1.5 and out["lo"] < 1.05, out
    assert median_interval([3.0, 1.0, 2.0], 2.576) == (1.0, 3.0)
    assert median_interval(list(range(100)), 2.576) == (37, 62)  # k = floor((100 - 25.76) / 2)


def test_too_few_requests_of_each_kind_decide_nothing():
    from loop.judge.corroborate import INTERFERENCE_PAIRS, interference

    claims, follows = _interleaved(3.0, 1.0, rounds=2 * INTERFERENCE_PAIRS - 2)
    short = interference("cuda_graph", claims, follows, ("incumbent", "candidate"))
    assert short["ok"] and short["n"] < INTERFERENCE_PAIRS and "slower" not in short


def test_an_interference_is_taken_again_once_and_refused_when_it_stays():
    from loop.judge.bench import judged_rounds

    def rounds(after_candidate: float):
        claims, follows = _interleaved(after_candidate, 1.0)
        n = len(claims["incumbent"])
        claims["candidate"] = [1.0] * n
        follows["candidate"] = [None] * n
        walls = {lab: [c + 0.1 for c in claims[lab]] for lab in claims}
        empty = {"batch": {lab: [0.1, 0.11, 0.1, 0.12, 0.1] for lab in claims}}
        return dict(claims), claims, walls, empty, {lab: [] for lab in claims}, follows

    taken = [rounds(2.0), rounds(2.0)]
    _, verdict, _, notes = judged_rounds(lambda: taken.pop(0), "cuda_graph", ("incumbent", "candidate"))
    assert not verdict["ok"] and verdict["label"] == "candidate" and verdict["check"] == "interferes", verdict
    assert "interferes" in verdict["refused_before"] and len(notes) == 1
    taken = [rounds(2.0), rounds(1.0)]  # noise of one set of rounds: passes in the next
    _, verdict, _, _ = judged_rounds(lambda: taken.pop(0), "cuda_graph", ("incumbent", "candidate"))
    assert verdict["ok"] and verdict["interference"]["ok"], verdict


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vector_add", "busy_after_answering"])
def test_under_the_interpreter_neither_an_a_a_pair_nor_work_left_after_answering_interferes(tmp_path, env, name):
    """On the CPU the busy thread the candidate leaves after each answer is stopped with its process
    tree until its next request (`kernel_process`): it slows only the candidate, and the
    interference check (with pairs enough to decide) refuses neither it nor the incumbent's own code
    as the candidate (A/A)."""
    path = VECTOR_ADD if name == "vector_add" else ADVERSARIES / f"{name}.py"
    raw = judged(tmp_path, path, timing={"min_reps": 12, "max_reps": 12, "budget_s": 0.2})
    assert raw["status"] == "ok", raw
    (shape,) = raw["timing"]["shapes"]
    slowed = shape["corroboration"]["interference"]
    assert slowed["ok"] and slowed["n"] >= 3 and slowed["slower"] > 0, slowed
    inc, cand = (shape["impls"][k]["median_ms"] for k in ("incumbent", "candidate"))
    assert inc < 1.5 * cand, (inc, cand)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["vector_add", "busy_after_answering"])
def test_on_a_gpu_work_left_on_a_stream_of_its_own_is_refused_or_slows_nothing(tmp_path, env, name):
    """A kernel left spinning on the candidate's own stream runs on while its process is stopped.
    Where it slows the incumbent's next request, the candidate is refused (`interferes`); where the
    device does not let it (on an H200, a spin as long as the request left the incumbent's CUDA-graph
    requests after it at 3.648 ms against 3.646 ms after its own), the candidate, the incumbent's own
    code, is no faster than the incumbent. The incumbent's own code as the candidate (A/A) is never
    refused."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    path = VECTOR_ADD if name == "vector_add" else ADVERSARIES / f"{name}.py"
    raw = judged(tmp_path, path, device="cuda")
    if raw["status"] != "ok":
        assert name != "vector_add", raw
        assert raw["status"] == "uncorroborated" and raw["failed_impl"] == "candidate", raw
        assert "interferes" in raw["message"], raw
        return
    (shape,) = raw["timing"]["shapes"]
    slowed = shape["corroboration"]["interference"]
    assert slowed["ok"] and slowed["n"] >= 3, slowed
    inc, cand = (shape["impls"][k]["median_ms"] for k in ("incumbent", "candidate"))
    from loop.judge.corroborate import INTERFERENCE_BAND

    assert cand >= inc * (1 - INTERFERENCE_BAND[shape["method"]]), (inc, cand, slowed)
