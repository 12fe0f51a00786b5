"""decision-check's campaign of honest refusals (`tileloop decision-check --scenarios aa,honest
--method graph|eager --l2-multiples ...`): the playbook's own candidates for a target (`honest_candidates`,
as an iteration's `next_candidate` offers them), shapes whose inputs and outputs take multiples of the
device's L2 (`size_for_l2`: the spec's make_inputs run in a process of its own, `l2_shapes` pure), and
the counts of the trials' decisions per scenario and timing method (`tally`, pure), with the
`uncorroborated` refusals of honest candidates and A/A pairs. The measuring is
`loop.tools.decision_check`'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Sequence

from loop import decide
from loop.common.errors import UserError
from loop.common.jobs import shape_text as _key
from loop.decide.check import trial_rows
from loop.measure.launch import with_package_path
from loop.records.perf_table import markdown_table
from loop.target.contract import Kernel, spec_dtypes
from playbook.analysis import analyze
from playbook.base import ranked
from playbook.cst.entry import entry_beside

CPU_L2_BYTES = 256 * 2**10  # the stand-in for an L2 under the interpreter (it has none): small shapes it can time


def honest_candidates(kernel: Kernel, source: str, backend: str, probe: dict) -> list[tuple[str, str]]:
    """The playbook's own candidates for the target, (key, source), as an iteration's `next_candidate`
    offers them (`playbook.base.ranked` over the target's analysis, from the entry its spec names),
    every value of a candidate's sweep included; each source once."""
    cap = probe.get("capability")
    arch = f"sm_{cap[0]}{cap[1]}" if isinstance(cap, (list, tuple)) and len(cap) == 2 else None
    an = analyze(source, backend=backend, arch=arch, entry=entry_beside(kernel.target_abs))
    out: dict[str, str] = {}
    for cand in ranked(source, an, (), ()):
        for key, src in [(cand.key, cand.source)] + [(v.key, v.source) for v in (cand.sweep.values if cand.sweep else ())]:
            if src != source and src not in out.values() and key not in out:
                out[key] = src
    return list(out.items())


def l2_shapes(multiples: Sequence[float], l2_bytes: int, rank: int, cols: int | None,
              probes: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Shapes whose inputs and outputs take `multiples` of `l2_bytes`: 1-D (n) or 2-D (rows x `cols`, the
    spec's column count). `probes`: two (size, bytes) pairs the spec's make_inputs gave (size is n, or
    rows at `cols` columns), so bytes = fixed + per * size (a weight over the columns is the fixed part)."""
    if rank not in (1, 2) or (rank == 2 and not cols):
        raise UserError(f"--l2-multiples sizes 1-D shapes (n) and 2-D shapes (rows x cols); this spec's benchmark "
                        f"shapes have {rank} dimension(s)", hint="pass --shapes")
    (s1, b1), (s2, b2) = probes
    per = (b2 - b1) / (s2 - s1)
    if per <= 0:
        raise UserError("--l2-multiples: the spec's make_inputs gives no more bytes at a larger shape", hint="pass --shapes")
    fixed = b1 - per * s1
    sizes = [max(1, int(round((m * l2_bytes - fixed) / per))) for m in multiples]
    return [(n,) if rank == 1 else (n, int(cols)) for n in sizes]


SIZING = """
import json, sys
import torch
from loop.common.spec import Spec, load_module
sys.path.insert(0, sys.argv[2])
spec = Spec(torch, load_module("tileloop_sizing_spec", sys.argv[1]))
shape = tuple(spec.benchmark_shapes[-1])
def nbytes(s):
    got = spec.make_inputs(s, sys.argv[3], 0, "cpu")
    return sum(v.numel() * v.element_size() for v in got.values() if isinstance(v, torch.Tensor))
probes = [(4096, nbytes((4096,))), (8192, nbytes((8192,)))] if len(shape) == 1 else \
    [(8, nbytes((8, shape[1]))), (16, nbytes((16, shape[1])))] if len(shape) == 2 else []
print(json.dumps({"shape": list(shape), "probes": probes}))
"""


def size_for_l2(kernel: Kernel, multiples: Sequence[float], dtype: str, device: str, probe: dict) -> dict:
    """The shapes of --l2-multiples: the spec's make_inputs run at two small shapes (in a process of its
    own, on the CPU: the orchestrator imports no spec) for the bytes of a shape's inputs and outputs,
    and the device's L2 (the environment probe's; a stand-in of CPU_L2_BYTES under the interpreter)."""
    if device == "cuda" and probe.get("l2_mb"):
        l2, note = int(float(probe["l2_mb"]) * 2**20), f"L2 {float(probe['l2_mb']):g} MiB, the device's"
    else:
        l2, note = CPU_L2_BYTES, f"L2 stand-in {CPU_L2_BYTES // 2**10} KiB: the interpreter has no L2"
    done = subprocess.run([sys.executable, "-c", SIZING, str(kernel.spec_abs), str(kernel.target_abs.parent), dtype],
                          capture_output=True, text=True, env=with_package_path(dict(os.environ)), timeout=300)
    if done.returncode != 0:
        raise UserError(f"--l2-multiples: the spec's make_inputs failed at a small shape: "
                        f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}"[:600])
    got = json.loads(done.stdout.strip().splitlines()[-1])
    shape = got["shape"]
    cols = shape[1] if len(shape) == 2 else None
    shapes = l2_shapes(multiples, l2, len(shape), cols, [tuple(p) for p in got["probes"]])
    return {"multiples": list(multiples), "l2_bytes": l2, "dtype": dtype, "shapes": [list(x) for x in shapes],
            "note": note + ("" if cols is None else f"; {cols} columns, the spec's last benchmark shape's")}


def first_dtype(kernel: Kernel, device: str) -> str:
    """The dtype an iteration times (the spec's first; bfloat16 skipped under the interpreter), read statically."""
    known = [d for d in spec_dtypes(kernel.spec_abs) or () if not (device == "cpu" and d == "bfloat16")]
    if not known:
        raise UserError("--l2-multiples needs the dtype to size shapes at, and the spec's DTYPES are not literal",
                        hint="pass --dtype")
    return known[0]


METHOD_NAMES = {"cuda_graph": "graph", "cuda_events_l2_flush": "eager", "interpreter_wallclock": "interpreter"}


def tally(events: Sequence[dict], asked: str, policy: decide.Policy) -> dict:
    """Counts per scenario and timing method of the trials' decisions: trials, kept, reverted,
    unmeasured (void or not measurable), refused by the judge (`uncorroborated`, by the implementation
    charged), failures (a candidate that is incorrect, or does not build or run: no refusal for
    cheating), and where the forced method was not the one used. `honest_refusals`: the uncorroborated
    refusals of honest candidates and A/A pairs over their judged trials (the number that must be 0)."""
    per: dict[str, dict[str, dict]] = {}
    refusals = []
    for event in events:
        out = event.get("again") or event["first"]
        rows = trial_rows(event, policy)
        whole = next((r for r in rows if r["shape"] == "all"), rows[0])
        used = sorted({METHOD_NAMES.get(m, m) for m in out.get("methods") or ()}) or ["untimed"]
        method = "+".join(used)
        c = per.setdefault(event["scenario"], {}).setdefault(method, {
            "trials": 0, "kept": 0, "reverted": 0, "unmeasured": 0, "uncorroborated": 0, "refused": {}, "failures": {},
            "method_not_forced": 0})
        c["trials"] += 1
        if out["status"] == "uncorroborated":
            c["uncorroborated"] += 1
            who = out.get("failed_impl") or "candidate"
            c["refused"][who] = c["refused"].get(who, 0) + 1
            refusals.append({"trial": event["trial"], "scenario": event["scenario"], "candidate": event.get("candidate"),
                             "method": method, "failed_impl": who, "message": str(out.get("message") or "")[:400]})
        elif out["status"] != "ok":
            c["failures"][out["status"]] = c["failures"].get(out["status"], 0) + 1
        elif whole["action"] == "keep":
            c["kept"] += 1
        elif whole["action"] == "revert":
            c["reverted"] += 1
        else:
            c["unmeasured"] += 1
        if asked != "auto" and out.get("methods") and any(METHOD_NAMES.get(m) not in (asked, "interpreter")
                                                           for m in out["methods"]):
            c["method_not_forced"] += 1
    judged = [c for name in ("honest", "aa") for c in per.get(name, {}).values()]
    return {"by_scenario": per, "refusals": refusals,
            "honest_refusals": {"judged": sum(c["trials"] for c in judged),
                                "uncorroborated": sum(c["uncorroborated"] for c in judged)}}


def render_counts(result: dict) -> list[str]:
    counts = result.get("counts") or {}
    rows = [{"scenario": scenario, "method": method, "trials": c["trials"], "kept": c["kept"], "reverted": c["reverted"],
             "unmeasured": c["unmeasured"], "uncorroborated": c["uncorroborated"],
             "refused (charged to)": ", ".join(f"{k} {v}" for k, v in c["refused"].items()),
             "failures": ", ".join(f"{k} {v}" for k, v in c["failures"].items()),
             "forced method not used": c["method_not_forced"]}
            for scenario, methods in (counts.get("by_scenario") or {}).items() for method, c in methods.items()]
    if not rows:
        return []
    honest = counts["honest_refusals"]
    lines = ["", "## Decisions by scenario and timing method", "", markdown_table(rows), "",
             f"Honest candidates and A/A pairs refused `uncorroborated`: {honest['uncorroborated']} of "
             f"{honest['judged']} judged trial(s)."]
    if result.get("honest_candidates"):
        lines.append(f"Honest candidates (the playbook's, in turn): {', '.join(result['honest_candidates'])}.")
    if result.get("l2_sizing"):
        z = result["l2_sizing"]
        lines.append(f"Shapes sized to {', '.join(f'{m:g}' for m in z['multiples'])}x L2 ({z['note']}): "
                     f"{', '.join(_key(x) for x in z['shapes'])}.")
    lines += [f"- refused: trial {r['trial'] + 1} {r['scenario']}" + (f" {r['candidate']}" if r["candidate"] else "")
              + f" ({r['method']}, charged to {r['failed_impl']}): {r['message']}" for r in counts["refusals"]]
    return lines + [""]
