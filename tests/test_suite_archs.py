"""`tileloop suite run --archs`: what each run of the suite is given (the compile gate's
architectures, `none` included), without running one."""

from __future__ import annotations

import pytest

from loop.cli import main
from loop.cli import suite as suite_cli


@pytest.mark.parametrize(("given", "passed"), [
    (["--archs", "none"], ["--archs", "none"]),
    (["--archs", "sm_90"], ["--archs", "sm_90"]),
    (["--archs", "sm_90,sm_100"], ["--archs", "sm_90,sm_100"]),
    ([], None),
])
def test_each_run_gets_the_suites_archs(kernel_repo, monkeypatch, capsys, given, passed):
    seen = []
    monkeypatch.setattr(suite_cli.runner, "run_suite", lambda root, targets, out_dir, per_run, extra, **kw: seen.append(extra) or [])
    assert main(["suite", "run", "kernels/vector_add/vector_add_triton.py", "--device", "cpu", *given]) == 0
    (extra,) = seen
    if passed is None:  # no --archs: each run's own default
        assert "--archs" not in extra
    else:
        i = extra.index("--archs")
        assert extra[i:i + 2] == passed
