"""`suite run --ray`'s driver with Ray faked (no cluster, fast tier): what a local cluster's workers
are given to import Ray and tileloop with, and the deadlines that keep a task which never begins,
or never ends, from holding the suite up."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import pytest

from loop.measure.launch import SOURCE_ROOT
from loop.suite import ray_deadlines, ray_engine
from loop.suite.engines import SuiteCall
from loop.suite.ray_task import Started, TaskResult, pack
from tests.conftest import git

TARGETS = ("kernels/vector_add/vector_add_triton.py", "kernels/row_sum/row_sum_triton.py")
MISSING_RAY = """Traceback (most recent call last):
  File "/opt/site/ray/_private/workers/default_worker.py", line 8, in <module>
    import ray
ModuleNotFoundError: No module named 'ray'
"""


class _Stream:
    """A task's stream, scripted: (seconds after it could begin, item) pairs; `after` a stream whose
    task must end first (the one slot it waits for), `never` for a task whose worker never runs it."""

    def __init__(self, items: list, after: _Stream | None = None, never: bool = False):
        self.items, self.after, self.never, self.t0 = list(items), after, never, None

    def ready(self) -> bool:
        if self.never or (self.after is not None and self.after.items):
            return False
        self.t0 = self.t0 if self.t0 is not None else time.monotonic()
        return bool(self.items) and time.monotonic() - self.t0 >= self.items[0][0]

    def __next__(self):
        if not self.items:
            raise StopIteration
        return self.items.pop(0)[1]


class _FakeRay:
    """Ray as the driver uses it: `init`'s arguments kept, each task's stream scripted, cancels kept."""

    class exceptions:  # noqa: N801 (as Ray names it)
        class RayError(Exception):
            pass

    def __init__(self, streams: list[_Stream], session: str = "/nonexistent"):
        self.streams, self.session, self.inits, self.cancelled = streams, session, [], []
        self.t0 = time.monotonic()

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return type("Context", (), {"address_info": {"session_dir": self.session}})()

    def shutdown(self):
        pass

    def cluster_resources(self):
        return {"CPU": 2.0}

    def put(self, data):
        return data

    def wait(self, streams, num_returns, timeout):
        assert time.monotonic() - self.t0 < 30, "the driver still waits for its tasks"  # what a hang looks like here
        return [s for s in streams if s.ready()], []

    def get(self, item):
        return item

    def cancel(self, stream, force):
        self.cancelled.append((stream, force))

    def remote(self, fn):
        fake = self

        class Remote:
            def options(self, **kwargs):
                return self

            def remote(self, spec, bundle, records):
                return fake.streams.pop(0)

        return Remote()


def _call(repo, targets=TARGETS, per_run_s=None, said=None) -> SuiteCall:
    return SuiteCall(root=repo, start_branch=git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip(),
                     start_sha=git(repo, "rev-parse", "HEAD").strip(), targets=tuple(targets),
                     out_dir=repo / "sandbox" / "suite", per_run_s=per_run_s, extra=("--device", "cpu"), resume=False,
                     killed_here=None, log=(said if said is not None else []).append)


def _result(target: str) -> TaskResult:
    run = "suite-" + target.rsplit("/", 1)[1].removesuffix(".py").replace("_", "-")
    entry = {"schema": "tileloop.suite-entry/1", "run": run, "target": target, "iterations": 1}
    return TaskResult(target=target, node="n1", entry=entry, refs={}, bundle=None, archive=pack({}), log=[])


@pytest.fixture
def fast(monkeypatch):
    """The driver's looks and deadlines short, so that a test of them takes a second or so."""
    monkeypatch.setattr(ray_engine, "WAIT_S", 0.02)
    monkeypatch.setattr(ray_deadlines, "START_S", 0.4)
    monkeypatch.setattr(ray_deadlines, "GRACE_S", 0.3)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")  # short enough for a cluster's sockets: no root of our own


@pytest.mark.parametrize("driver", [["/opt/site-a", "/opt/site-b"], []])
def test_a_local_cluster_s_workers_import_tileloop_then_the_driver_s_pythonpath(kernel_repo, monkeypatch, fast, driver):
    """Ray installed with `pip install --target DIR` and found through PYTHONPATH: the workers' PYTHONPATH
    keeps the driver's entries after tileloop's (it once held tileloop's only, and every worker died
    importing Ray); a cluster joined by address gets none of the driver's paths."""
    if driver:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(driver))
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    ray = _FakeRay([])
    monkeypatch.setitem(sys.modules, "ray", ray)
    ray_engine.RayEngine().cluster.start(1, _call(kernel_repo).log)
    [local] = ray.inits
    assert local["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep) == [str(SOURCE_ROOT), *driver]
    ray_engine.RayEngine("127.0.0.1:6379").cluster.start(1, _call(kernel_repo).log)
    assert "runtime_env" not in ray.inits[1] and ray.inits[1]["address"] == "127.0.0.1:6379"


def test_a_task_that_never_begins_is_given_up_and_its_entry_says_why_from_the_worker_logs(kernel_repo, monkeypatch,
                                                                                          fast, tmp_path_factory):
    """A task whose worker dies at start (it never says it began) is cancelled `START_S` after it was
    sent; its entry names the last line of the traceback in the local cluster's worker logs; the
    other target's run comes back as usual and the cluster's logs are kept."""
    session = tmp_path_factory.mktemp("session")
    (session / "logs").mkdir()
    (session / "logs" / "raylet.out").write_text("no traceback here\n")
    (session / "logs" / "worker-01-ffff-4242.err").write_text(MISSING_RAY)
    stuck = _Stream([], never=True)
    ray = _FakeRay([stuck, _Stream([(0, Started(TARGETS[1], "n1", 7)), (0, _result(TARGETS[1]))])], str(session))
    monkeypatch.setitem(sys.modules, "ray", ray)
    said: list[str] = []
    t0 = time.monotonic()
    first, second = ray_engine.RayEngine().run(_call(kernel_repo, said=said), None)
    assert time.monotonic() - t0 >= ray_deadlines.START_S
    error = first["error"]
    # (counted from when the other task, which had begun, left the cluster: it might have waited for that one's slot)
    assert error.startswith(f"the Ray task failed (it had not begun {ray_deadlines.START_S:g} s after "), error
    assert "ModuleNotFoundError: No module named 'ray' (ray-logs/worker-01-ffff-4242.err)" in error and "\n" not in error
    assert error.endswith("nothing of its run came back: suite run --ray --resume starts it anew")
    assert json.loads((kernel_repo / "sandbox" / "suite" / f"{first['run']}.json").read_text()) == first
    assert "error" not in second and second["node"] == "n1"
    assert ray.cancelled == [(stuck, True)]
    assert (kernel_repo / "sandbox" / "suite" / "ray-logs" / "worker-01-ffff-4242.err").read_text() == MISSING_RAY
    assert any("began on n1 (task pid 7)" in line for line in said), said


def test_a_task_waiting_for_a_slot_of_the_suite_is_not_given_up_and_one_past_its_per_run_is(kernel_repo, monkeypatch,
                                                                                           fast):
    """Without --per-run, a task that began runs as long as it runs, and one that waits for its slot
    counts `START_S` from when that task ended, not from when it was sent. With --per-run, a task still
    running `--per-run` plus `GRACE_S` after it began is cancelled, its entry saying so."""
    slow = ray_deadlines.START_S * 3
    running = _Stream([(0, Started(TARGETS[0], "n1", 7)), (slow, _result(TARGETS[0]))])
    ray = _FakeRay([running, _Stream([(0, Started(TARGETS[1], "n1", 8)), (0, _result(TARGETS[1]))], after=running)])
    monkeypatch.setitem(sys.modules, "ray", ray)
    entries = ray_engine.RayEngine().run(_call(kernel_repo), None)
    assert [e.get("error") for e in entries] == [None, None] and ray.cancelled == []

    for target in TARGETS:  # a new suite: the runs of the one above forgotten
        run = "suite-" + target.rsplit("/", 1)[1].removesuffix(".py").replace("_", "-")
        (kernel_repo / "sandbox" / "suite" / f"{run}.json").unlink()
    hung = _Stream([(0, Started(TARGETS[0], "n2", 9))])  # began, then nothing
    ray = _FakeRay([hung])
    monkeypatch.setitem(sys.modules, "ray", ray)
    [entry] = ray_engine.RayEngine().run(_call(kernel_repo, targets=TARGETS[:1], per_run_s=0.2), None)
    assert entry["error"].startswith("the Ray task failed (it was still running on n2 0.5 s after it began "
                                     "(--per-run 0.2 s, and 0.3 s "), entry
    assert ray.cancelled == [(hung, True)]


def test_the_last_line_of_a_worker_log_s_last_traceback_is_found(tmp_path):
    logs = tmp_path / "logs"
    (logs / "old").mkdir(parents=True)
    assert ray_deadlines.traceback_end(logs) is None
    (logs / "worker-a.err").write_text("starting\n" + MISSING_RAY.replace("ray'", "grpc'") + "later output\n")
    assert ray_deadlines.traceback_end(logs) == ("ModuleNotFoundError: No module named 'grpc'", "worker-a.err")
    newer = logs / "old" / "worker-b.err"
    newer.write_text('Traceback (most recent call last):\n  File "x.py", line 1\n    f(\n    ^\n'
                     "SyntaxError: '(' was never closed\n")
    os.utime(newer, (time.time() + 5, time.time() + 5))
    assert ray_deadlines.traceback_end(logs) == ("SyntaxError: '(' was never closed", "old/worker-b.err")
