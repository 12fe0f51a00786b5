"""A resume on another machine or toolchain is refused, naming what changed; a CUDA C run's
fingerprint holds nvcc's version and flags too, a TileLang run's TileLang's and nvcc's versions,
which a Triton run's timings do not depend on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loop.common.errors import EnvironmentMismatch
from loop.run.resume import check_environment
from loop.run.state import RunState

ENV = {"gpu": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "driver": "580", "cuda_runtime": "13.0",
       "torch_version": "2.11", "triton_version": "3.6.0", "cutile_version": None, "nvtriton": False,
       "nvcc_version": "13.4.92", "nvcc_flags": ["-O3"], "tilelang_version": "0.1.15"}


def run_of(language: str) -> SimpleNamespace:
    state = RunState(run_id="r", branch="b", origin_branch=None, target="k", spec="s", language=language, op="op",
                     device="cuda", target_backend="ptx", backends=["ptx"], availability={}, base_commit="c", seed=0,
                     env=dict(ENV), untracked_at_start=[], policy={})
    return SimpleNamespace(state=state)


def test_the_same_machine_resumes_and_another_gpu_is_refused():
    check_environment(run_of("triton"), dict(ENV))
    with pytest.raises(EnvironmentMismatch, match="gpu: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA H200'"):
        check_environment(run_of("triton"), {**ENV, "gpu": "NVIDIA H200"})


def test_another_nvcc_refuses_a_cuda_c_run_only():
    other = {**ENV, "nvcc_version": "13.0.88"}
    check_environment(run_of("triton"), other)  # a Triton kernel is not built by nvcc
    with pytest.raises(EnvironmentMismatch, match="nvcc_version: '13.4.92' -> '13.0.88'"):
        check_environment(run_of("cuda"), other)
    with pytest.raises(EnvironmentMismatch, match="nvcc_flags"):
        check_environment(run_of("cuda"), {**ENV, "nvcc_flags": ["-O2"]})


def test_another_tilelang_or_nvcc_refuses_a_tilelang_run_only():
    other = {**ENV, "tilelang_version": "0.1.16"}
    check_environment(run_of("triton"), other)
    with pytest.raises(EnvironmentMismatch, match="tilelang_version: '0.1.15' -> '0.1.16'"):
        check_environment(run_of("tilelang"), other)
    with pytest.raises(EnvironmentMismatch, match="nvcc_version"):
        check_environment(run_of("tilelang"), {**ENV, "nvcc_version": "13.0.88"})
