"""`tileloop compare kernels/<op>`: every implementation in every available backend, plus PyTorch
eager, torch.compile and the spec's named reference kernels (`REFERENCES`, see
`loop.worker.providers`), per benchmark shape, in one table per shape.

Each backend runs in its own worker (its own environment, e.g. ENABLE_TILE); inside a worker the
implementations are timed interleaved on the same inputs. PyTorch and the references are timed in
the first backend's worker that measures. An unavailable backend, or a reference that is
unavailable or incorrect, is a row that says so, with its reason, never a number from another
backend or implementation."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import HarnessFailure, UserError
from loop.common.language import LANGUAGES, detect_language
from loop.common.settings import Settings
from loop.measure.launch import run_worker
from loop.records.perf_table import markdown_table
from loop.target.contract import load_kernel
from loop.tools.final import compile_notes, without_failed_compile

TORCH_PROVIDERS = ["torch_eager", "torch_compile"]


def implementations(op_dir: Path) -> list[Path]:
    import ast

    files = sorted(p for p in op_dir.glob("*.py") if p.name != "spec.py")
    out = [p for p in files if detect_language(ast.parse(p.read_text())) is not None]
    if not out:
        raise UserError(f"{op_dir} has no Triton or cuTile implementation beside its spec.py")
    return out


def run_compare(op_dir: Path, root: Path, probe: dict, device: str, settings: Settings, workdir: Path, log=print,
                full_check: bool = False) -> dict:
    if not (op_dir / "spec.py").is_file():
        raise UserError(f"{op_dir} has no spec.py")
    impls = implementations(op_dir)
    kernels = [load_kernel(p, root) for p in impls]
    spec_path = op_dir / "spec.py"
    jobs = []  # (backend, [(label, path)], torch providers)
    for lang in LANGUAGES:
        mine = [(k.target.stem, k.target_abs) for k in kernels if k.language == lang]
        if not mine:
            continue
        for backend in backend_registry.for_language(lang, device):
            jobs.append((backend, mine))
    rows, torch_done, refs_done, verified = [], False, False, []
    for backend, mine in jobs:
        av = backend_registry.availability(backend, probe, device)
        if not av.available:
            for label, _ in mine:
                rows.append({"implementation": label, "backend": backend.name, "status": f"unavailable: {av.reason}"})
            continue
        providers = [] if torch_done or device != "cuda" else TORCH_PROVIDERS
        torch_done = torch_done or bool(providers)
        log(f"compare: {backend.name}: {', '.join(l for l, _ in mine + [(p, None) for p in providers])}")
        job = {"spec": str(spec_path), "target_dir": str(op_dir), "device": device, "backend": backend.name,
               "impls": [{"label": label, "path": str(path)} for label, path in mine], "torch_providers": providers,
               "check": [label for label, _ in mine], "seed": 1234, "bench": True, "check_benchmark_shapes": full_check,
               "references": not refs_done}
        raw = without_failed_compile(lambda j, b=backend: run_worker(workdir, j, b, settings, workdir / "cache" / b.name,
                                                                     name=f"compare-{b.name}"), job)
        if raw.get("status") in ("spec_error", "harness_error"):
            raise HarnessFailure(f"compare {backend.name}: {raw['status']}: {raw.get('message')}")
        if raw.get("status") != "ok":
            for label, _ in mine:
                rows.append({"implementation": label, "backend": backend.name,
                             "status": f"{raw['status']}: {raw.get('message', '')}"[:300]})
            continue
        refs = raw.get("references") or {}
        refs_done = refs_done or "references" in raw
        if raw.get("torch_compile"):  # it ran eagerly somewhere, or did not compile: no time of it
            rows.append({"implementation": "torch_compile", "backend": "torch.compile",
                         "status": f"{raw['torch_compile']['status']}: {raw['torch_compile']['reason']}"[:300]})
        for name, ref in refs.items():
            if ref["status"] != "ok":
                rows.append({"implementation": name, "backend": f"reference: {ref['source']}",
                             "status": f"{ref['status']}: {ref['reason']}"[:300], "reference": True})
        checks = raw.get("correctness", {}).get("checks", [])
        for label, _ in mine:
            mine_checks = [c for c in checks if c["label"] == label]
            verified.append({"implementation": label, "backend": backend.name, "checks": len(mine_checks),
                             "dtypes": sorted({c["dtype"] for c in mine_checks}),
                             "shapes": len({tuple(c["shape"]) for c in mine_checks}),
                             "max_abs_err": max((c.get("max_abs_err", 0) for c in mine_checks), default=None),
                             "skipped": raw.get("correctness", {}).get("skipped", [])})
        proof = raw.get("proof") or {}
        for s in raw["timing"]["shapes"]:
            for label, st in s["impls"].items():
                rows.append({"shape": "x".join(map(str, s["shape"])), "dtype": s["dtype"], "implementation": label,
                             "backend": _ran(label, backend.name, dict(mine), proof, refs), "status": "ok",
                             "time_ms": st["median_ms"], "rel_std": st["rel_std"],
                             "gbps": st.get("gbps"), "tflops": st.get("tflops"), "frac_clone_bw": st.get("frac_clone_bw"),
                             "clone_gbps": (s.get("clone") or {}).get("gbps"), "method": s["method"],
                             "clone_note": (s.get("clone") or {}).get("above_one"),
                             "reference": label in refs, **({"note": note} if label == "torch_compile" and (note := compile_notes(st)) else {})})
    return {"op": op_dir.name, "device": probe.get("gpu") or "cpu", "rows": rows, "verified": verified, "full_check": full_check}


def _ran(label: str, backend: str, mine: dict, proof: dict, refs: dict) -> str:
    """What ran a timed label: the backend (an implementation of the op folder, its proof if it
    failed), PyTorch, or a reference (its source, in this backend's worker environment)."""
    if label in refs:
        return f"reference: {refs[label]['source']} ({backend} worker)"
    if label not in mine:
        return "torch.compile" if label == "torch_compile" else "torch eager"
    return backend if proof.get("ok") else f"{backend} (proof failed: {proof.get('detail', '')[:80]})"


def render(result: dict) -> str:
    rows = result["rows"]
    lines = [f"# compare: {result['op']} on {result['device']}", "",
             "Time is the median over interleaved samples in one judged measurement per backend; GB/s counts the spec's "
             "bytes_moved; 'vs clone' is the fraction of a same-run device copy's bandwidth for the same traffic; "
             "'vs torch eager' is the eager time over this time (for matmul: the fraction of torch.matmul's rate); "
             "speedup is against Triton/PTX at the same shape; 'vs best reference' is the fastest reference's "
             "time over this time (above 1: faster than every public kernel named in the spec).", ""]
    down = [r for r in rows if r["status"] != "ok"]
    shapes = []
    for r in rows:
        if r["status"] == "ok" and r["shape"] not in shapes:
            shapes.append(r["shape"])
    for shape in shapes:
        here = [r for r in rows if r.get("shape") == shape and r["status"] == "ok"]
        base = next((r["time_ms"] for r in here if r["backend"] == "ptx"), None)
        eager = next((r["time_ms"] for r in here if r["implementation"] == "torch_eager"), None)
        best_ref = min((r["time_ms"] for r in here if r.get("reference")), default=None)
        table = []
        for r in here:
            table.append({"Implementation": r["implementation"], "Backend": r["backend"], "Time (ms)": f"{r['time_ms']:.6f}",
                          "GB/s": f"{r['gbps']:.0f}" if r.get("gbps") else "", "TFLOP/s": f"{r['tflops']:.2f}" if r.get("tflops") else "",
                          "vs clone": f"{r['frac_clone_bw']:.2f}" if r.get("frac_clone_bw") else "",
                          "vs torch eager": f"{eager / r['time_ms']:.2f}" if eager else "",
                          "vs best reference": f"{best_ref / r['time_ms']:.2f}" if best_ref else "",
                          "Speedup": f"{base / r['time_ms']:.2f}x" if base else ""})
        for r in down:
            table.append({"Implementation": r["implementation"], "Backend": r["backend"], "Time (ms)": r["status"]})
        clone = next((r["clone_gbps"] for r in here if r.get("clone_gbps")), None)
        lines += [f"## {shape} ({here[0]['dtype']})" + (f", clone {clone:.0f} GB/s" if clone else ""), "", markdown_table(table), ""]
        notes = [f"- {r['implementation']}: {r['note']}" for r in here if r.get("note")]
        notes += sorted({f"- clone: {r['clone_note']}" for r in here if r.get("clone_note")})
        lines += notes + [""] * bool(notes)
    if not shapes:
        lines += [markdown_table([{"Implementation": r["implementation"], "Backend": r["backend"], "Status": r["status"]} for r in rows]), ""]
    if result.get("verified"):
        scope = "correctness and full benchmark shapes" if result.get("full_check") else "correctness shapes"
        lines += [f"## Correctness ({scope}, every dtype; fresh random inputs, NaN-poisoned outputs)", "",
                  markdown_table([{**v, "dtypes": ", ".join(v["dtypes"]), "skipped": "; ".join(v["skipped"]),
                                   "max_abs_err": f"{v['max_abs_err']:.3g}" if v["max_abs_err"] is not None else ""}
                                  for v in result["verified"]]), ""]
    lines.append(f"_generated {dt.date.today().isoformat()} by `tileloop compare`_")
    return "\n".join(lines)
