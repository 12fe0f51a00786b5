"""A cuTile search's result kept per implementation folder (`loop.worker.cutile_tune`): the same key
is timed once, anything that changes the key is timed again, a bad file is ignored, folders do not
share. cuda.tile's own exhaustive_search is replaced by a counting fake that returns a real
TuningResult (nothing here needs a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT

ct = pytest.importorskip("cuda.tile")
torch = pytest.importorskip("torch")

import cuda.tile.tune as tune  # noqa: E402
from cuda.tile.tune import Measurement, TuningResult, _tune  # noqa: E402

from loop.worker import cutile_tune  # noqa: E402

SPACE = [{"TILE": 64}, {"TILE": 128}, {"TILE": 256}]
DEVICE = {"name": "Fake GPU", "capability": [9, 0]}


@ct.kernel
def row_sum(x, out, TILE: ct.Constant[int]):
    pass


@ct.kernel
def other_sum(x, out, TILE: ct.Constant[int]):
    pass


class FakeSearch:
    """cuda.tile's exhaustive_search as far as its result goes: config i takes 10 + 7 * ((i + 2) % 3) us
    (the middle one wins), the last config fails when the space has more than two."""

    def __init__(self):
        self.calls = 0

    def __call__(self, search_space, stream, grid_fn, kernel, args_fn, hints_fn=None, *, quiet=False,
                 single_run_timeout_sec=None, flush_l2=True):
        self.calls += 1
        ok = search_space[:-1] if len(search_space) > 2 else search_space
        measured = tuple(Measurement(config=cfg, mean_us=10.0 + 7 * ((i + 2) % 3), num_samples=5 + i,
                                     error_margin_us=0.25 * (i + 1)) for i, cfg in enumerate(ok))
        failures = tuple((cfg, RuntimeError, "out of shared memory") for cfg in search_space[len(ok):])
        return TuningResult(best=min(measured, key=lambda m: m.mean_us), successes=measured, failures=failures)


@pytest.fixture
def fake(monkeypatch):
    search = FakeSearch()
    monkeypatch.setattr(tune, "exhaustive_search", search)
    monkeypatch.setattr(_tune, "exhaustive_search", search)
    device = dict(DEVICE)
    monkeypatch.setattr(cutile_tune, "device_identity", lambda: dict(device))
    search.device = device
    return search


def tuned(folder, rows=8, cols=32, space=SPACE, kernel=row_sum, hints=None, flush_l2=True):
    """What the autotune recipe's code does: one search through ct.tune, kept under `folder`."""
    assert cutile_tune.keep_cutile_tunings(str(folder))
    x, out = torch.zeros(rows, cols), torch.zeros(rows)
    return ct.tune.exhaustive_search(space, None, lambda cfg: (rows,), lambda cfg: kernel,
                                     lambda cfg: (x, out, cfg["TILE"]),
                                     hints_fn=None if hints is None else (lambda cfg: hints), quiet=True,
                                     flush_l2=flush_l2)


def test_a_second_search_with_the_same_key_times_nothing_and_returns_the_same_choice(tmp_path, fake):
    first = tuned(tmp_path)
    again = tuned(tmp_path)
    assert fake.calls == 1
    assert isinstance(again, TuningResult) and all(isinstance(m, Measurement) for m in again.successes)
    assert again.best.config == first.best.config == SPACE[1]
    assert again.best.config is SPACE[1]  # the space's own config: the recipe's code finds it with space.index
    assert [(m.config, m.mean_us, m.error_margin_us, m.num_samples) for m in again.successes] == \
        [(m.config, m.mean_us, m.error_margin_us, m.num_samples) for m in first.successes]
    assert [(cfg, exc, msg) for cfg, exc, msg in again.failures] == [(SPACE[2], RuntimeError, "out of shared memory")]
    assert len(list((tmp_path / cutile_tune.SUBFOLDER).glob("*.json"))) == 1


def test_the_alias_cuda_tile_calls_through_keeps_too(tmp_path, fake):
    tuned(tmp_path)
    x, out = torch.zeros(8, 32), torch.zeros(8)
    again = _tune.exhaustive_search(SPACE, None, lambda cfg: (8,), row_sum, lambda cfg: (x, out, cfg["TILE"]),
                                    quiet=True)
    assert fake.calls == 1 and again.best.config == SPACE[1]


@pytest.mark.parametrize("change", [
    {"rows": 16},
    {"cols": 64},
    {"space": list(reversed(SPACE))},
    {"space": SPACE[:2]},
    {"hints": {"occupancy": 2}},
    {"kernel": other_sum},
    {"flush_l2": False},
])
def test_anything_the_timings_depend_on_searches_again(tmp_path, fake, change):
    tuned(tmp_path)
    tuned(tmp_path, **change)
    assert fake.calls == 2
    tuned(tmp_path, **change)
    assert fake.calls == 2


def test_another_device_searches_again(tmp_path, fake):
    tuned(tmp_path)
    fake.device["name"] = "Other GPU"
    tuned(tmp_path)
    assert fake.calls == 2
    fake.device.update(name="Fake GPU", capability=[10, 0])
    tuned(tmp_path)
    assert fake.calls == 3


def test_a_dtype_or_stride_change_searches_again(tmp_path, fake):
    assert cutile_tune.keep_cutile_tunings(str(tmp_path))
    x = torch.zeros(8, 32)
    for arg in (x, x.half(), x.t().contiguous().t(), x):
        ct.tune.exhaustive_search(SPACE, None, lambda cfg: (8,), row_sum, lambda cfg: (arg, cfg["TILE"]), quiet=True)
    assert fake.calls == 3


@pytest.mark.parametrize("corrupt", [
    lambda data: "{not json",
    lambda data: json.dumps({**data, "key": "0" * 64}),
    lambda data: json.dumps({**data, "best": 7}),
    lambda data: json.dumps({**data, "successes": [{**data["successes"][0], "index": 9}]}),
    lambda data: json.dumps({**data, "successes": [{**data["successes"][0], "mean_us": "fast"}]}),
    lambda data: json.dumps({**data, "format": "something else"}),
    lambda data: json.dumps([data]),
])
def test_a_corrupt_or_foreign_file_searches_again_and_is_replaced(tmp_path, fake, corrupt):
    tuned(tmp_path)
    (path,) = (tmp_path / cutile_tune.SUBFOLDER).glob("*.json")
    path.write_text(corrupt(json.loads(path.read_text())))
    again = tuned(tmp_path)
    assert fake.calls == 2 and again.best.config == SPACE[1]
    tuned(tmp_path)
    assert fake.calls == 2


def test_two_folders_do_not_share(tmp_path, fake):
    tuned(tmp_path / "incumbent-aaaa")
    tuned(tmp_path / "candidate-bbbb")
    assert fake.calls == 2
    tuned(tmp_path / "incumbent-aaaa")
    assert fake.calls == 2


def test_an_argument_it_cannot_describe_is_timed_every_time_and_not_kept(tmp_path, fake):
    assert cutile_tune.keep_cutile_tunings(str(tmp_path))
    opaque = object()
    for _ in range(2):
        ct.tune.exhaustive_search(SPACE, None, lambda cfg: (8,), row_sum, lambda cfg: (opaque, cfg["TILE"]), quiet=True)
    assert fake.calls == 2
    assert not (tmp_path / cutile_tune.SUBFOLDER).exists()


def test_no_folder_installs_nothing(fake):
    assert not cutile_tune.keep_cutile_tunings("")
    assert tune.exhaustive_search is fake and _tune.exhaustive_search is fake


# run in a process of its own (a load takes the process's Triton cache folder for good): what a
# cuTile kernel process's search keeps its results in, seen from the code it loads after
LOAD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from loop.worker.serve import KernelSide

    work, backend = Path(sys.argv[1]), sys.argv[2]
    (work / "impl.py").write_text("def run(x):\\n    return x\\n")
    (work / "probe.py").write_text(
        "import json, triton, cuda.tile.tune as t\\n"
        "search = t.exhaustive_search\\n"
        "print(json.dumps({'store': str(getattr(search, 'tileloop_store', '')), 'cache': triton.knobs.cache.dir}))\\n")
    try:
        KernelSide().load({"spec": str(work / "probe.py"), "target_dir": str(work), "device": "cpu",
                           "backend": backend, "impls": [{"label": "incumbent", "path": str(work / "impl.py")}]})
    except Exception:
        pass  # not a spec: what it printed at import is all that is asked of it
""")


@pytest.mark.parametrize("backend", ["cutile", pytest.param("interpreter", marks=pytest.mark.slow)])
def test_a_cutile_kernel_process_keeps_its_searches_in_its_own_cache_folder(tmp_path, backend):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path), backend], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=120)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    own = Path(seen["cache"])
    assert own.parent == tmp_path / "cache" / "implementations" and own.name.startswith("incumbent-")
    assert seen["store"] == (str(own / cutile_tune.SUBFOLDER) if backend == "cutile" else "")


def test_the_recipes_tuned_row_sum_in_a_second_kernel_process_picks_the_same_config_untimed(tmp_path, fake,
                                                                                           monkeypatch):
    """The code cutile-autotune writes (its `_TUNED` emptied, as in a new kernel process) asks the kept
    search again: no timing, the same config and kernel hints; a new shape is timed."""
    import importlib.util

    import playbook
    from playbook.analysis import analyze

    source = (REPO_ROOT / "kernels" / "row_sum" / "row_sum_cutile.py").read_text()
    (candidate,) = playbook.get("cutile-autotune").candidates(source, analyze(source))
    path = tmp_path / "tuned_row_sum.py"
    path.write_text(candidate.source)
    loaded = importlib.util.spec_from_file_location("tuned_row_sum_for_keeping", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: None)
    monkeypatch.delenv("DISABLE_CUTILE_TUNE", raising=False)
    assert cutile_tune.keep_cutile_tunings(str(tmp_path / "incumbent-aaaa"))

    x, out = torch.randn(16, 300), torch.empty(16)
    first = module._tuned(x, out)
    module._TUNED.clear()
    again = module._tuned(x, out)
    assert fake.calls == 1
    assert again[0] is first[0] and again[0] in module._TUNE_SPACES["sm_90"]
    assert repr(again[1]._compiler_options) == repr(first[1]._compiler_options)
    module._tuned(torch.randn(16, 600), out)
    assert fake.calls == 2


def test_a_dtype_argument_is_part_of_the_key(tmp_path, fake):
    assert cutile_tune.keep_cutile_tunings(str(tmp_path))
    x = torch.zeros(8, 32)
    for dtype in (ct.float32, ct.float16, torch.float32, ct.float32):
        ct.tune.exhaustive_search(SPACE, None, lambda cfg: (8,), row_sum, lambda cfg: (x, dtype, cfg["TILE"]),
                                  quiet=True)
    assert fake.calls == 3
