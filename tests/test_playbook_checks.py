"""The playbook's rewrites still build and still compute the op.

* Ahead of time: one candidate of every recipe, on a temp copy of its kernel folder, compiles for
  sm_90 and sm_100 through `tileloop compile` (every dtype of the spec; every autotune config).
* Triton interpreter: the Triton rewrites pass their spec through the loop's worker (interpreter
  backend, check only). Triton 3.6's autotuner cannot benchmark under TRITON_INTERPRET=1
  ("0 active drivers"), so autotuned targets are checked config by config instead: each config
  alone (a one-config autotuner runs without benchmarking), through the worker's own Harness.

The full sweep (every candidate on every reference kernel, AOT, plus the GPU checks) is too slow
for this suite; its results are in the recipe pages and the report of the change that added it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import playbook
from loop import backends
from loop.cli import main
from loop.measure.launch import run_worker
from loop.common.settings import Settings
from playbook.analysis import analyze

pytestmark = pytest.mark.slow
from tests.conftest import materialise

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS = REPO_ROOT / "kernels"


def candidate(recipe_id: str, op: str, lang: str, key: str | None = None):
    source = (KERNELS / op / f"{op}_{lang}.py").read_text()
    found = [c for c in playbook.get(recipe_id).candidates(source, analyze(source)) if key is None or c.key == key]
    assert found, f"{recipe_id} proposed nothing for {op}_{lang}"
    return found[0]


# --------------------------------------------------------------------------- ahead of time

AOT_CASES = [  # (recipe, op, language, candidate key or None for the first)
    ("triton-autotune", "vector_add", "triton", None),
    ("fast-math", "silu_mul", "triton", "fast-math:sigmoid"),
    ("fast-math", "softmax", "triton", "fast-math:exp2"),
    ("eviction-policy", "vector_add", "triton", None),
    ("launch-param", "row_sum", "triton", "launch-param:num_stages=4"),
    ("grouped-ordering", "matmul", "triton", None),
    ("cutile-latency", "vector_add", "cutile", "cutile-latency:latency=2"),
    ("cutile-store-no-tma", "rmsnorm", "cutile", None),
    ("cutile-approx", "softmax", "cutile", "cutile-approx:exp"),
    ("cutile-approx", "layernorm", "cutile", "cutile-approx:div"),  # fp32 tile / int scalar
    ("cutile-approx", "softmax", "cutile", "cutile-approx:ftz"),
    ("cutile-num-ctas", "matmul", "cutile", None),
]


@pytest.mark.parametrize("recipe_id,op,lang,key", AOT_CASES, ids=lambda v: str(v))
def test_candidate_compiles_ahead_of_time_for_hopper_and_blackwell(recipe_id, op, lang, key, tmp_path, env, capsys):
    cand = candidate(recipe_id, op, lang, key)
    target = materialise(tmp_path, op, lang, cand.source)
    rc = main(["compile", str(target), "--arch", "sm_90,sm_100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"], [k.get("error") for k in out["kernels"] if not k.get("ok")]
    rows = out["kernels"]
    assert {r["arch"] for r in rows} == {"sm_90", "sm_100"}
    assert all(r["ok"] for r in rows)


# --------------------------------------------------------------------------- Triton interpreter

INTERPRETER_CASES = [
    ("fast-math", "silu_mul", "fast-math:sigmoid"),
    ("fast-math", "softmax", "fast-math:exp2"),
    ("eviction-policy", "vector_add", None),
    ("launch-param", "row_sum", "launch-param:num_stages=4"),
    ("grouped-ordering", "matmul", None),
]


@pytest.mark.parametrize("recipe_id,op,key", INTERPRETER_CASES, ids=lambda v: str(v))
def test_triton_rewrite_passes_its_spec_in_the_interpreter(recipe_id, op, key, tmp_path, env):
    cand = candidate(recipe_id, op, "triton", key)
    target = materialise(tmp_path / "k", op, "triton", cand.source)
    job = {"spec": str(target.parent / "spec.py"), "target_dir": str(target.parent), "device": "cpu",
           "backend": "interpreter", "impls": [{"label": "candidate", "path": str(target)}], "check": ["candidate"],
           "seed": 11, "bench": False}
    res = run_worker(tmp_path / "w", job, backends.get("interpreter"), Settings(worker_timeout_s=600), tmp_path / "cache")
    assert res["status"] == "ok", (res.get("message"), res.get("log_tail", "")[-1500:])
    checks = res["correctness"]["checks"]
    assert checks and all(c["ok"] for c in checks)
    assert res["proof"]["ran"] == "interpreter"


PER_CONFIG = r'''
import json, sys
from pathlib import Path
spec_path, target_path, shapes = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, str(target_path.parent))
import torch
from triton.runtime.autotuner import Autotuner
from loop.worker.correctness import Harness
from loop.common.spec import Spec
from loop.worker.failures import load_module
spec = load_module("spec_under_test", spec_path)
target = load_module("target_under_test", target_path)
(tuner,) = [v for v in vars(target).values() if isinstance(v, Autotuner)]
harness = Harness(torch, Spec(torch, spec), "cpu")
configs, checks = list(tuner.configs), []
for i, cfg in enumerate(configs):
    tuner.configs = [cfg]  # one config: the autotuner runs it without benchmarking
    tuner.cache.clear()
    for shape in shapes or spec.CORRECTNESS_SHAPES:
        for dtype in [d for d in spec.DTYPES if d != "bfloat16"]:
            rec = harness.check_one(target, "candidate", tuple(shape), dtype, 1000 + i)
            checks.append({"config": str(cfg), "shape": list(shape), "dtype": dtype, "ok": rec["ok"], "reason": rec.get("reason")})
print("RESULT " + json.dumps({"configs": len(configs), "checks": checks}))
'''


@pytest.mark.parametrize("op,shapes", [("vector_add", None), ("matmul", [[17, 33, 65], [129, 65, 257]]),
                                      # ragged seq, causal and not: the 128-row tiles see partial blocks
                                      ("attention", [[1, 2, 77, 64, 1], [1, 1, 129, 64, 0]])],
                         ids=["vector_add", "matmul", "attention"])
def test_every_autotune_config_passes_the_spec_in_the_interpreter(op, shapes, tmp_path):
    cand = candidate("triton-autotune", op, "triton")
    target = materialise(tmp_path, op, "triton", cand.source)
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PER_CONFIG, str(target.parent / "spec.py"), str(target),
                           json.dumps(shapes)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    res = json.loads(line[len("RESULT "):])
    assert res["configs"] == int(cand.title.split("(")[1].split(" configs")[0])
    bad = [c for c in res["checks"] if not c["ok"]]
    assert res["checks"] and not bad, bad[:3]
    assert {c["config"] for c in res["checks"]} and len({c["config"] for c in res["checks"]}) == res["configs"]
