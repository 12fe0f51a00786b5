"""`tileloop doctor`: what this machine can run, per backend, and what to do about it."""

from __future__ import annotations

from loop import backends as backend_registry


def report(probe: dict) -> dict:
    avail = {}
    for name, b in backend_registry.BACKENDS.items():
        device = b.device
        if device == "cuda" and not probe.get("cuda_available"):
            a = backend_registry.Availability(False, probe.get("cuda_reason") or "no CUDA device")
        else:
            a = backend_registry.availability(b, probe, device)
        avail[name] = a.to_json()
    return {"probe": probe, "backends": avail, "recommendation": recommend(probe, avail)}


def recommend(probe: dict, avail: dict) -> str:
    cap = probe.get("capability") or [0, 0]
    if not probe.get("cuda_available"):
        tail = "; cuTile and Triton still compile ahead of time here (tileloop compile)" if probe.get("tileiras") else ""
        return f"no GPU: run the loop with --device cpu (Triton interpreter, interpreter timings){tail}"
    if avail["tileir"]["available"]:
        if probe.get("triton_active_target") and "tile" not in probe["triton_active_target"]:
            return "nvtriton is installed but the active target is not tileir: set ENABLE_TILE=1 and check the install"
        return "Tile IR through nvtriton is available: Triton runs decide on tileir, with ptx as a guard"
    if cap[0] >= 10 and not probe.get("nvtriton"):
        return "Blackwell GPU without nvtriton: install Triton-to-tile-IR for the tileir backend; ptx decides meanwhile"
    parts = [f"sm_{cap[0]}{cap[1]}: Triton runs decide on ptx (Tile IR through nvtriton needs Blackwell)"]
    if avail["cutile"]["available"]:
        parts.append("cuTile targets run on cutile")
    else:
        parts.append(f"cuTile unavailable ({avail['cutile']['reason']})")
    return "; ".join(parts)


def render(rep: dict) -> str:
    p = rep["probe"]
    cap = p.get("capability")
    lines = [
        f"GPU:            {p.get('gpu') or 'none'}" + (f" (sm_{cap[0]}{cap[1]}, {p.get('sm_count')} SMs, L2 {p.get('l2_mb')} MB)" if cap else ""),
        f"driver:         {p.get('driver') or 'n/a'}",
        f"CUDA (torch):   {p.get('cuda_runtime') or 'n/a'}",
        f"torch:          {p.get('torch_version')}",
        f"triton:         {p.get('triton_version')}",
        f"nvtriton:       {'installed' if p.get('nvtriton') else 'not installed'}"
        + (f"; active target: {p['triton_active_target']}" if p.get("triton_active_target") else ""),
        f"cuda-tile:      {p.get('cutile_version') or 'not installed'}",
        f"tileiras:       {p.get('tileiras') or 'not found'}" + (f" ({p['tileiras_version']})" if p.get("tileiras_version") else ""),
        f"tileiras archs: {', '.join(p.get('tileiras_archs') or []) or 'n/a'}",
        f"ncu:            {p.get('ncu') or 'not found'}" + (f" ({p['ncu_version']})" if p.get("ncu_version") else ""),
        f"tile env:       {p.get('tile_env') or '{}'}",
        "",
        "| backend | available | reason |",
        "|---|---|---|",
    ]
    for name, a in rep["backends"].items():
        lines.append(f"| {name} | {'yes' if a['available'] else 'no'} | {a['reason']} |")
    lines += ["", f"recommendation: {rep['recommendation']}"]
    return "\n".join(lines)
