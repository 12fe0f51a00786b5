"""Settings read from the environment: each TILELOOP_* variable parsed strictly, one line for a bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.common.errors import UserError
from loop.common.settings import load


def test_the_aot_cache_is_the_runs_own_unless_a_shared_folder_is_named(tmp_path):
    assert load({}).aot_cache is None
    assert load({"TILELOOP_AOT_CACHE": str(tmp_path)}).aot_cache == tmp_path
    assert load({"TILELOOP_AOT_CACHE": "~/aot"}).aot_cache == Path.home() / "aot"
    with pytest.raises(UserError, match="TILELOOP_AOT_CACHE must be an absolute folder"):
        load({"TILELOOP_AOT_CACHE": "relative/aot"})


def test_the_compile_gate_builds_in_the_shared_cache_when_one_is_named(tmp_path, monkeypatch):
    from loop.measure import compile_gate

    seen = []
    monkeypatch.setattr(compile_gate, "run_worker", lambda workdir, job, backend, settings, cache, **kw:
                        seen.append(cache) or {"status": "ok", "compile": {"ok": True, "results": []}})
    args = dict(workdir=tmp_path, spec_path=tmp_path / "spec.py", target_dir=tmp_path, target=tmp_path / "k.py",
                language="triton", archs=["sm_90"], cache_root=tmp_path / "run-cache")
    compile_gate.compile_gate(settings=load({}), **args)
    compile_gate.compile_gate(settings=load({"TILELOOP_AOT_CACHE": str(tmp_path / "shared")}), **args)
    assert seen == [tmp_path / "run-cache" / "aot", tmp_path / "shared"]
