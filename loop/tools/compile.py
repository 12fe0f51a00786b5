"""`tileloop compile`: a target compiled ahead of time for GPUs that are not here (no GPU needed),
with registers and spills per kernel, and its Tile IR hazards with their line."""

from __future__ import annotations

from pathlib import Path

from loop.common.settings import Settings
from loop.measure.compile_gate import compile_gate, compile_summary
from loop.records import gitops
from loop.records.perf_table import markdown_table
from loop.target.contract import load_kernel, spec_dtypes
from loop.common.files import scratch
from playbook.hazards import scan


def compile_target(target: str, archs: list[str], settings: Settings) -> tuple[dict, str]:
    """(payload, text) of `tileloop compile`; payload["ok"] says whether every build succeeded."""
    path = Path(target).resolve()
    root = gitops.root_or_folder(path.parent)
    kernel = load_kernel(path, root)
    hazards = [] if kernel.language == "cuda" else scan(kernel.target_abs.read_text(), kernel.language)
    with scratch("compile") as tmp:
        raw = compile_gate(workdir=Path(tmp), spec_path=kernel.spec_abs, target_dir=kernel.target_abs.parent,
                           target=kernel.target_abs, language=kernel.language, archs=archs, settings=settings,
                           cache_root=Path(tmp), dtypes=spec_dtypes(kernel.spec_abs))
    rows = compile_summary(raw)
    ok = raw["status"] == "ok"
    text = markdown_table(rows) + "\n" + "\n".join(str(h) for h in hazards)
    text += f"\n{'ok' if ok else 'FAILED'}: {kernel.target} ({kernel.language}) for {', '.join(archs)}"
    if not ok:
        text += f"\n{raw.get('message', '')}"
    payload = {"target": str(kernel.target), "language": kernel.language, "archs": archs, "ok": ok,
               "status": raw["status"], "message": raw.get("message"), "kernels": rows,
               "hazards": [h.to_json() for h in hazards]}
    builds = [k["build"] for r in (raw.get("compile") or {}).get("results", []) for k in r.get("kernels") or []
              if k.get("build")]
    if builds:  # a CUDA C target: the nvcc, its version and the flags of each architecture's library
        payload["builds"] = list({b["key"]: b for b in builds}.values())
        text += "".join(f"\nbuilt by {b['toolchain']['nvcc']} ({b['toolchain']['release']}, {b['toolchain']['version']}): "
                        f"{' '.join(b['flags'])}" for b in payload["builds"][:1])
    return payload, text
