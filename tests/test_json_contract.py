"""The `--json` contract and the suggestions an agent can act on.

Every object the CLI prints in any test is checked against its JSON Schema (loop/cli/schema/) by
the `json_contract` fixture of tests/conftest.py; the golden interpreter session
(tests/test_golden_cli.py) checks each of its outputs explicitly too. Here: the schemas
themselves, docs/json.md generated from them, a drift planted to prove a drifted output fails, the
commands the other tests do not reach cheaply, and `step` (suggestions that skip what a run tried,
measured, or cannot check; `step --recipe`) on a run made without measuring its baseline.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import tomllib
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from cli_schema import BEGIN, END, SCHEMA_DIR, problems, render_doc, schemas
from conftest import git
from loop import cli
from loop.cli import main
from loop.common import settings as settings_mod
from loop.common.messages import Decision
from loop.records import experience, gitops
from loop.records.results import BackendResult, Record, append_record
from loop.run import state as st
from loop.run import suggest
from loop.run.experiment import open_run
from loop.target.contract import source_hash
from loop.tools import doctor
from playbook.analysis import analyze
from playbook.base import ranked

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "json.md"
TARGET = "kernels/vector_add/vector_add_triton.py"
RUN = "json-test"


def call(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv + ["--json"])
    return code, json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- the schemas and the page


def test_the_schemas_are_valid_and_name_every_command_and_action():
    for name, schema in schemas().items():
        Draft202012Validator.check_schema(schema)
    dispatch = schemas()["cli.json"]
    assert set(dispatch["properties"]["command"]["enum"]) - {None} == set(cli.COMMANDS)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in cli.COMMANDS:
        actions = next((a.choices for a in sub[command]._actions if a.dest == "action"), None)
        files = [f"{command}-{a}.json" for a in actions] if actions else [f"{command}.json"]
        assert all(f in schemas() for f in files), (command, files)
    assert not problems({"schema": "tileloop.cli/1", "command": None, "error": "x", "hint": "y"})
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "cli/schema/*.json" in package_data["loop"] and SCHEMA_DIR == ROOT / "loop" / "cli" / "schema"


def test_docs_json_md_is_generated_from_the_schemas():
    """Every field json.md documents for a command is in its schema and every field of the schema
    is documented: the page's command and shared-object sections are the schemas, rendered."""
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    generated = render_doc(list(cli.ORDER))
    if os.environ.get("TILELOOP_UPDATE_GOLDEN") == "1":
        DOC.write_text(text[:start] + generated + text[end:])
        text = DOC.read_text()
        start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == generated, "docs/json.md differs from the schemas: regenerate it (see the marker)"
    for name in ("step", "status", "playbook apply", "suite summarize"):
        assert f"### `{name}`" in generated
    assert "- `kernel_class` (" in generated and "- `suggestions` (" in generated and "- `repository` (" in generated


# ----------------------------------------------------------------------------- a run made without a measurement


TWO_KERNELS = '''

@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask), mask=mask)


def run_backward(x, y, out):
    n = out.numel()
    sub_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
'''


def two_kernels(source: str) -> str:
    """vector_add whose kernel already evicts its loads first, plus a second kernel that `run` reaches
    only on a branch no checked shape takes (so a reading of the source counts it on the forward path,
    and only the checks' record shows it never ran): the eviction recipe's one candidate touches only it."""
    for name in ("x_ptr", "y_ptr"):
        source = source.replace(f"tl.load({name} + offs, mask=mask)",
                                f'tl.load({name} + offs, mask=mask, eviction_policy="evict_first")')
    source = source.replace("def run(x, y, out):\n    n = out.numel()\n",
                            "def run(x, y, out):\n    n = out.numel()\n    if n < 0:\n        return run_backward(x, y, out)\n")
    assert "run_backward(x, y, out)" in source
    return source + TWO_KERNELS


def make_run(root: Path, source: str | None = None, coverage: tuple[list, list] | None = None,
             recorded: bool = False) -> st.RunState:
    """A run on the repository's HEAD as `init` leaves it, with its baseline recorded but not measured
    (latency null); `coverage`: what the baseline's checks launched and called, in its judge's result
    file as a run before `BackendResult.launched` kept it, or in its record (`recorded`) alone."""
    if source is not None:
        (root / TARGET).write_text(source)
        git(root, "commit", "-qam", "another version")
    head, branch = git(root, "rev-parse", "HEAD").strip(), git(root, "rev-parse", "--abbrev-ref", "HEAD").strip()
    state = st.RunState(run_id=RUN, branch=branch, origin_branch=branch, target=TARGET, spec="kernels/vector_add/spec.py",
                        language="triton", op="vector_add", device="cpu", target_backend="interpreter",
                        backends=["interpreter"], availability={"interpreter": {"available": True, "reason": ""}},
                        base_commit=head, seed=0, env={}, untracked_at_start=[], policy={}, archs=[],
                        best_commit=head, last_iteration=0)
    st.save(root, state)
    st.set_current(root, RUN)
    gitops.ensure_excluded(root, "/sandbox/")
    baseline = Record(run=RUN, iteration=0, optimization="baseline", status="keep", correctness="PASS", latency_ms=None,
                      target_backend="interpreter",
                      backends={"interpreter": BackendResult("interpreter", True, "ok", timing_label="interpreter",
                                                             **({"launched": coverage[0], "called": coverage[1]}
                                                                if recorded and coverage else {}))},
                      commit=head, parent=None, decision=Decision(None, "baseline", "iteration 0: the code as given"),
                      source_hash=source_hash((root / TARGET).read_text()))
    append_record(st.run_dir(root, RUN) / "results.jsonl", baseline)
    if coverage is not None and not recorded:
        result = st.run_dir(root, RUN) / "logs" / "iter-000" / "worker-interpreter.result.json"
        result.parent.mkdir(parents=True)
        result.write_text(json.dumps({"status": "ok", "correctness": {"passed": True, "launched": {"baseline": coverage[0]},
                                                                      "called": {"baseline": coverage[1]}}}))
    return state


def keys(suggestions: list[dict]) -> list[str]:
    return [s["key"] for s in suggestions]


# ----------------------------------------------------------------------------- drift


def test_a_drifted_output_fails_its_schema(kernel_repo, capsys, monkeypatch, json_contract):
    make_run(kernel_repo)
    code, payload = call(capsys, ["results"])
    assert code == 0 and problems(payload) == [] and json_contract.failures == []
    assert payload["rows"][0]["latency_ms"] is None and payload["records"][0]["latency_ms"] is None

    # the defect this contract was made for: perf_results.md's cell text as a row's latency_ms
    from loop.cli import reading

    monkeypatch.setattr(reading, "row_json", lambda r: {
        "iteration": r.iteration, "optimization": r.optimization, "latency_ms": r.latency_ms,
        "correctness": r.correctness, "status": r.status, "backends": dict(r.backends)})
    assert main(["results", "--json"]) == 0
    capsys.readouterr()
    assert len(json_contract.failures) == 1 and "rows/0/latency_ms: '' is not of type 'number', 'null'" \
        in json_contract.failures[0], json_contract.failures
    json_contract.failures.clear()  # planted: this test's own drift, seen

    for drift, found in (
            (lambda d: d.pop("run"), "'run' is a required property"),
            (lambda d: d["records"][0].update(status="kept"), "records/0/status: 'kept' is not one of"),
            (lambda d: d["records"][0].update(latency_ms="0.5"), "records/0/latency_ms: '0.5' is not of type"),
            (lambda d: d.update(note="a field no schema names"), "note: a field results.json does not declare"),
            (lambda d: d.update(command="result"), "no schema for command 'result'")):
        drifted = copy.deepcopy(payload)
        drift(drifted)
        assert any(found in p for p in problems(drifted)), (found, problems(drifted))


# ----------------------------------------------------------------------------- commands the other tests do not reach


def test_experience_and_playbook_actions_fit_their_schemas(kernel_repo, capsys):
    entry = experience.Entry(op="vector_add", kernel_class="element-wise", language="triton", backend="interpreter",
                             arch="cpu", kind="block", key="launch-param:BLOCK=256", optimization="BLOCK 128 -> 256",
                             outcome="keep", verdict="improved", speedup=1.25, run="r", date="2026-01-01",
                             timing="interpreter", device="CPU")
    experience.append(entry)
    experience.append(dataclasses.replace(entry, outcome="revert", verdict="within_noise", speedup=None))
    with open(experience.path(), "a") as fh:  # an entry a later tileloop wrote, with a field added since
        fh.write(json.dumps({**dataclasses.asdict(entry), "kind": "num_warps", "a_later_field": 1}) + "\n")
    seen = []
    for argv in (["experience", "list"], ["experience", "stats"],
                 ["experience", "recommend", "--kernel-class", "element-wise", "--backend", "interpreter"],
                 ["playbook", "list"], ["playbook", "show", "launch-param"],
                 ["playbook", "apply", "launch-param", TARGET, "--dry-run"]):
        code, payload = call(capsys, argv)
        assert code == 0 and problems(payload) == [], (argv, problems(payload))
        assert payload["action"] == argv[1]
        seen.append(payload)
    assert len(seen[0]["entries"]) == 3 and "a_later_field" not in seen[0]["entries"][2]
    assert {"kind": "block", "tries": 2, "kept": 1, "kept_fraction": 0.5, "crash_fraction": 0.0,
            "geomean_speedup_kept": 1.25} in seen[2]["recommend"]


def test_spec_and_suite_summarize_fit_their_schemas(kernel_repo, capsys):
    (kernel_repo / "lonely").mkdir()
    (kernel_repo / "lonely" / "k.py").write_text((kernel_repo / TARGET).read_text())
    code, payload = call(capsys, ["spec", "lonely/k.py"])
    assert code == 0 and problems(payload) == [] and payload["spec"].endswith("spec.py")
    entry = {"schema": "tileloop.suite-entry/1", "run": "r", "target": TARGET, "error": "no records (exit 1)"}
    (kernel_repo / "out").mkdir()
    (kernel_repo / "out" / "r.json").write_text(json.dumps(entry))
    code, payload = call(capsys, ["suite", "summarize", "out"])
    assert code == 0 and problems(payload) == [] and payload["entries"] == 1 and payload["action"] == "summarize"


# ----------------------------------------------------------------------------- status: the kernel class


def test_status_names_the_kernel_class_why_and_every_run(kernel_repo, capsys):
    make_run(kernel_repo)
    code, payload = call(capsys, ["status"])
    assert code == 0 and problems(payload) == []
    assert payload["kernel_class"] == "element-wise" and payload["runs"] == [RUN]
    assert payload["kernel_class_reasons"] == ["no matrix product (dot, mma)",
                                               "no reduction (argmax, argmin, max, min, reduce, sum, xor_sum)"]
    # the class of the best version, not of an edit in progress (which may not even parse)
    (kernel_repo / TARGET).write_text("def broken(:\n")
    assert call(capsys, ["status"])[1]["kernel_class"] == "element-wise"
    matmul = analyze((ROOT / "kernels" / "matmul" / "matmul_triton.py").read_text())
    assert (matmul.kernel_class, matmul.reasons()) == ("dot", ["matrix product: calls dot"])
    softmax = analyze((ROOT / "kernels" / "softmax" / "softmax_triton.py").read_text())
    assert softmax.reasons() == ["no matrix product (dot, mma)", "reduction: calls max, sum", "normalisation: calls exp"]


# ----------------------------------------------------------------------------- suggestions an agent can act on


def test_suggestions_skip_keys_the_run_tried_and_sources_it_measured(kernel_repo):
    state = make_run(kernel_repo)
    settings = settings_mod.load()
    exp = open_run(None, settings)
    first = suggest.suggestions(exp, limit=5)
    assert len(first) == 5 and all(s["apply"] == f"tileloop step --recipe {s['recipe']} --key {s['key']}" for s in first)
    tried, by_hand = first[0]["key"], first[1]["key"]
    # one candidate tried by key; another's exact source measured as an agent's hand edit (no key)
    source = next(c.source for c in ranked((kernel_repo / TARGET).read_text(), analyze((kernel_repo / TARGET).read_text()),
                                           [], []) if c.key == by_hand)
    by_key = Record(run=RUN, iteration=1, optimization="a candidate", status="revert", correctness="PASS", latency_ms=None,
                    target_backend="interpreter", backends={}, commit=None, parent=state.best_commit, recipe=tried,
                    decision=Decision("revert", "no_gain", "no gain"))  # its record names its key: tried
    edit = Record(run=RUN, iteration=2, optimization="my own edit", status="revert", correctness="PASS", latency_ms=None,
                  target_backend="interpreter", backends={}, commit=None, parent=state.best_commit,
                  source_hash=source_hash(source))
    append_record(exp.results_path, by_key)
    append_record(exp.results_path, edit)
    later = suggest.suggestions(open_run(None, settings), limit=5)
    assert tried not in keys(later) and by_hand not in keys(later)
    assert keys(later)[:3] == keys(first)[2:5]  # the rest keep their order


def test_suggestions_skip_a_change_no_checked_shape_runs(kernel_repo, capsys):
    source = two_kernels((kernel_repo / TARGET).read_text())
    make_run(kernel_repo, source, coverage=(["add_kernel"], ["run"]))
    settings = settings_mod.load()
    assert "eviction-policy:evict_first" not in keys(suggest.suggestions(open_run(None, settings), limit=20))
    code, payload = call(capsys, ["step", "--recipe", "eviction-policy"])
    assert code == 2 and "sub_kernel, which no checked shape runs" in payload["error"], payload
    assert (kernel_repo / TARGET).read_text() == source
    # the same run without a record of what its checks ran: the candidate is offered
    (st.run_dir(kernel_repo, RUN) / "logs" / "iter-000" / "worker-interpreter.result.json").unlink()
    assert "eviction-policy:evict_first" in keys(suggest.suggestions(open_run(None, settings), limit=20))


def test_suggestions_read_what_the_checks_ran_from_the_best_record(kernel_repo, capsys):
    source = two_kernels((kernel_repo / TARGET).read_text())
    make_run(kernel_repo, source, coverage=(["add_kernel"], ["run"]), recorded=True)
    assert not (st.run_dir(kernel_repo, RUN) / "logs").exists()  # no judge's result file: the record alone says
    settings = settings_mod.load()
    assert "eviction-policy:evict_first" not in keys(suggest.suggestions(open_run(None, settings), limit=20))
    code, payload = call(capsys, ["step", "--recipe", "eviction-policy"])
    assert code == 2 and "sub_kernel, which no checked shape runs" in payload["error"], payload


@pytest.mark.parametrize("argv, error", [
    (["step"], "step needs --optimization"),
    (["step", "--key", "launch-param:BLOCK=256"], "--key names a candidate of a recipe"),
    (["step", "--recipe", "no-such-recipe"], "unknown recipe 'no-such-recipe'"),
    (["step", "--recipe", "grouped-ordering"], "recipe grouped-ordering does not apply to a triton element-wise kernel"),
    (["step", "--recipe", "fast-math"], "recipe fast-math no tl.exp call in the kernel"),
    (["step", "--recipe", "cutile-autotune"], "recipe cutile-autotune does not apply to a triton"),
    (["step", "--recipe", "triton-tensor-descriptor"], "recipe triton-tensor-descriptor proposes nothing for"),
    (["step", "--recipe", "launch-param", "--key", "launch-param:BLOCK=7"],
     "recipe launch-param has no candidate 'launch-param:BLOCK=7' for the best version; its candidates: launch-param:"),
])
def test_step_recipe_refuses_in_one_line(kernel_repo, capsys, argv, error):
    state = make_run(kernel_repo)
    code, payload = call(capsys, argv)
    assert code == 2 and payload["error"].startswith(error), payload
    assert gitops.head_sha(kernel_repo) == state.best_commit and not git(kernel_repo, "status", "--porcelain").strip()


def test_step_recipe_refuses_a_tree_with_other_edits_and_a_skipped_recipe(kernel_repo, capsys):
    state = make_run(kernel_repo)
    for path in (TARGET, "kernels/vector_add/spec.py"):
        edited = (kernel_repo / path).read_text() + "\n# my edit\n"
        (kernel_repo / path).write_text(edited)
        code, payload = call(capsys, ["step", "--recipe", "launch-param"])
        assert code == 2 and payload["error"] == f"the tree has edits a recipe step would mix with its own: {path}"
        assert (kernel_repo / path).read_text() == edited  # the agent's edit stays, untouched
        git(kernel_repo, "checkout", "--", path)
    state.skip_recipes = ["launch-param"]
    st.save(kernel_repo, state)
    code, payload = call(capsys, ["step", "--recipe", "launch-param"])
    assert code == 2 and "skipped in this run" in payload["error"]
    assert gitops.head_sha(kernel_repo) == state.best_commit


def test_step_recipe_applies_the_candidate_as_the_step(kernel_repo, capsys):
    """The one measured step of this file: a recipe's candidate committed and evaluated under the
    interpreter, its optimization and hypothesis the candidate's, its key tried from then on."""
    state = make_run(kernel_repo)
    source = (kernel_repo / TARGET).read_text()
    cand = next(c for c in ranked(source, analyze(source), [], []) if c.key == "launch-param:BLOCK=256")
    code, payload = call(capsys, ["step", "--recipe", "launch-param", "--key", cand.key, "--rationale", "one warp is idle"])
    assert code == 0, payload
    assert (payload["key"], payload["optimization"], payload["hypothesis"], payload["kind"], payload["rationale"]) == \
        (cand.key, cand.title, cand.hypothesis, "block", "one warp is idle")
    assert payload["status"] in ("keep", "revert") and payload["correctness"] == "PASS"
    assert git(kernel_repo, "show", f"{payload['commit']}:{TARGET}") == cand.source
    assert cand.key not in keys(payload["suggestions"])
    assert cand.key in st.load(kernel_repo, RUN).tried and st.load(kernel_repo, RUN).inflight is None
    # what the next suggestions read of a kept version: the kernels and host functions its checks ran
    result = json.loads((st.run_dir(kernel_repo, RUN) / "logs" / "iter-001" / "worker-interpreter.result.json").read_text())
    assert result["correctness"]["launched"]["candidate"] == ["add_kernel"] and "run" in result["correctness"]["called"]["candidate"]
    kept = payload["status"] == "keep"
    assert gitops.head_sha(kernel_repo) == (payload["commit"] if kept else state.best_commit)
    # asked again: reverted, it was tried; kept, the best version is already that value
    code, again = call(capsys, ["step", "--recipe", "launch-param", "--key", cand.key])
    assert code == 2 and ("no candidate" if kept else "already tried in this run") in again["error"], again


# ----------------------------------------------------------------------------- demo (a whole run)


@pytest.mark.slow
def test_demo_names_its_repository_and_its_runs(tmp_path, clean_env, capsys):
    clean_env.chdir(tmp_path)  # the demo moves into its repository: back here afterwards
    where = tmp_path / "demo"
    code, payload = call(capsys, ["demo", "--device", "cpu", "--max-iters", "1", "--dir", str(where)])
    assert code == 0 and problems(payload) == []
    assert payload["repository"] == str(where.resolve()) and payload["runs"] == [payload["run"]]
    assert (where / payload["perf_results"]).is_file() and len(payload["records"]) == 2


def test_doctor_fits_its_schema_here_and_for_gpu_probes(capsys):
    code, payload = call(capsys, ["doctor"])
    assert code == 0 and problems(payload) == [] and payload["checks"][0]["name"].startswith("Triton interpreter")
    from test_backends import BLACKWELL_NVTRITON, HOPPER, make_probe

    clocks = {"max_sm_mhz": "1980", "max_mem_mhz": "2619", "sm_mhz_now": "1980", "power_limit_w": "700.00"}
    gpu = make_probe(cap=(9, 0), driver="570.86", cuda_runtime="12.8", clocks=clocks, ncu="/usr/local/cuda/bin/ncu",
                     ncu_version="2025.1", triton_active_target="cuda", tile_env={}, numpy_version="2.4.0")
    for probe in (HOPPER, BLACKWELL_NVTRITON, gpu):
        report = doctor.report(probe, {"ok": True})
        assert problems({"schema": cli.CLI_SCHEMA, "command": "doctor", **report}) == [], probe


@pytest.mark.slow
def test_compare_fits_its_schema(kernel_repo, capsys):
    code, payload = call(capsys, ["compare", "kernels/vector_add", "--device", "cpu"])
    assert code == 0 and problems(payload) == []
    ran = [r for r in payload["rows"] if r["status"] == "ok"]
    assert ran and all(isinstance(r["time_ms"], float) for r in ran) and payload["verified"]
