"""A kept candidate's cache folder becomes the incumbent's (`namespaces.adopt_kept_cache`, called by
`launch.run_worker` before every judge): the same source's folder only, never another's, links kept
as links, nothing over the size limit, nothing where the incumbent has a folder already."""

from __future__ import annotations

import os

from loop.common import namespaces
from loop.common.namespaces import IMPLEMENTATIONS, adopt_kept_cache, cache_name
from loop.measure import launch

SOURCE = b"def run(x):\n    return x\n"


def _filled(root, label, source, files):
    folder = root / IMPLEMENTATIONS / cache_name(label, source)
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_the_kept_candidates_folder_becomes_the_incumbents(tmp_path):
    _filled(tmp_path, "candidate", SOURCE, {"cutile-tune/k.json": "{}", "abc/kernel.cubin": "x"})
    os.symlink("/nonexistent-target", tmp_path / IMPLEMENTATIONS / cache_name("candidate", SOURCE) / "link")
    assert adopt_kept_cache(tmp_path, SOURCE)
    mine = tmp_path / IMPLEMENTATIONS / cache_name("incumbent", SOURCE)
    assert (mine / "cutile-tune" / "k.json").read_text() == "{}" and (mine / "abc" / "kernel.cubin").read_text() == "x"
    assert os.readlink(mine / "link") == "/nonexistent-target"  # a link copied as a link, never followed
    assert not adopt_kept_cache(tmp_path, SOURCE)  # the incumbent has its own now: left alone
    assert not [p for p in (tmp_path / IMPLEMENTATIONS).iterdir() if p.name.startswith(".")]  # no leftovers


def test_another_sources_folder_is_never_adopted(tmp_path):
    _filled(tmp_path, "candidate", SOURCE + b"# another\n", {"k.json": "{}"})
    assert not adopt_kept_cache(tmp_path, SOURCE)
    assert not (tmp_path / IMPLEMENTATIONS / cache_name("incumbent", SOURCE)).exists()


def test_the_incumbents_own_folder_is_never_overwritten(tmp_path):
    _filled(tmp_path, "candidate", SOURCE, {"k.json": "candidate's"})
    _filled(tmp_path, "incumbent", SOURCE, {"k.json": "incumbent's"})
    assert not adopt_kept_cache(tmp_path, SOURCE)
    assert (tmp_path / IMPLEMENTATIONS / cache_name("incumbent", SOURCE) / "k.json").read_text() == "incumbent's"


def test_a_folder_over_the_limit_is_not_copied(tmp_path, monkeypatch):
    _filled(tmp_path, "candidate", SOURCE, {"big": "x" * 2000})
    monkeypatch.setattr(namespaces, "ADOPT_LIMIT", 1000)
    assert not adopt_kept_cache(tmp_path, SOURCE)


def test_a_judge_is_started_with_the_incumbents_adopted_folder(tmp_path):
    impl = tmp_path / "target__incumbent.py"
    impl.write_bytes(SOURCE)
    _filled(tmp_path / "cache", "candidate", SOURCE, {"k.json": "{}"})
    job = {"impls": [{"label": "incumbent", "path": str(impl)}, {"label": "candidate", "path": str(tmp_path / "none.py")}]}
    assert launch.adopt_kept_caches(tmp_path / "cache", job) == ["incumbent"]
    assert launch.adopt_kept_caches(tmp_path / "cache", None) == []


def test_run_worker_adopts_before_it_starts_the_judge(tmp_path, monkeypatch):
    impl = tmp_path / "target__incumbent.py"
    impl.write_bytes(SOURCE)
    _filled(tmp_path / "cache", "candidate", SOURCE, {"k.json": "{}"})
    seen = []

    class Started:
        def __init__(self, workdir, name, cmd, job, backend, cache_dir, **kw):
            seen.append((cache_dir / IMPLEMENTATIONS / cache_name("incumbent", SOURCE)).is_dir())
            self.proc = None

        def wait(self, timeout):
            return {"status": "ok"}

    monkeypatch.setattr(launch, "_Launched", Started)
    from loop.common.settings import Settings

    job = {"impls": [{"label": "incumbent", "path": str(impl)}]}
    assert launch.run_worker(tmp_path / "work", job, None, Settings(), tmp_path / "cache") == {"status": "ok"}
    assert seen == [True]
