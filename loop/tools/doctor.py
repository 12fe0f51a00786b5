"""`tileloop doctor`: what this machine can run, per backend, which known-bad combinations of
packages it has, and what to do about it."""

from __future__ import annotations

from pathlib import Path

from loop import backends as backend_registry
from loop.common import nvcc, tilelang_install
from loop.common.settings import Settings
from loop.measure.launch import run_worker, with_package_path
from loop.common.files import scratch
from loop.common.processes import probe_isolation

# (package, version prefix, other package, its bad versions from, what breaks, the fix)
KNOWN_BAD = (
    ("triton", "3.6", "numpy", (2, 4), "the Triton interpreter (--device cpu) fails on every loop to a runtime bound "
     "(TypeError: only 0-dimensional arrays can be converted to Python scalars)", "pip install 'numpy<2.4'"),
)


def _release(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "").split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def known_bad(probe: dict) -> list[dict]:
    """The known-bad pairs of packages this machine has, each with what breaks and the fix."""
    out = []
    for pkg, prefix, other, bad_from, what, fix in KNOWN_BAD:
        have, theirs = probe.get(f"{pkg}_version"), probe.get(f"{other}_version")
        if have and theirs and (have == prefix or have.startswith(prefix + ".")) and _release(theirs) >= bad_from:
            out.append({"name": f"{pkg} {have} with {other} {theirs}", "ok": False, "detail": what, "fix": fix})
    return out


def interpreter_check(settings: Settings) -> dict:
    """A small kernel with a loop to a runtime bound, run under the Triton interpreter in a worker."""
    with scratch("doctor") as tmp:
        raw = run_worker(Path(tmp), {"mode": "interpreter-check"}, backend_registry.get("interpreter"), settings,
                         Path(tmp) / "triton-cache", timeout_s=300, name="interpreter-check")
    if raw.get("status") != "ok":
        return {"ok": False, "error": f"{raw.get('status')}: {raw.get('message')}"[:300]}
    return raw["interpreter"]


def isolation_check(settings: Settings) -> dict:
    """The boundary a judge would put around its kernel processes here (`loop.judge.fork`), as a
    check: full when kernel code can neither trace the judge nor outlive its measurement."""
    import os

    got = probe_isolation(settings.python, with_package_path(dict(os.environ)))
    if got is None:
        return {"name": "kernel process isolation", "ok": False, "detail": "the probe failed", "fix": "run tileloop doctor "
                "again; a judge records what it had in force in every record"}
    weak = [f"{k}: {v}" for k, v in got.items() if (k, v) in (("ptrace", "open"), ("descendants", "open"), ("stopped", "no"))]
    detail = "; ".join(f"{k}: {v}" for k, v in got.items())
    return {"name": "kernel process isolation", "ok": not weak, "detail": detail,
            "fix": None if not weak else "Linux with prctl (PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP) "
            "and /proc: without them kernel code may reach the judge or outlive its measurement, and every record says so"}


def report(probe: dict, interpreter: dict | None = None, isolation: dict | None = None) -> dict:
    avail = {}
    for name, b in backend_registry.BACKENDS.items():
        device = b.device
        if device == "cuda" and not probe.get("cuda_available"):
            a = backend_registry.Availability(False, probe.get("cuda_reason") or "no CUDA device")
        else:
            a = backend_registry.availability(b, probe, device)
        avail[name] = a.to_json()
    checks = known_bad(probe)
    if interpreter is not None:
        bad = next((c for c in checks if "numpy" in c["name"]), None)
        checks.insert(0, {"name": "Triton interpreter (a loop to a runtime bound)", "ok": interpreter["ok"],
                          "detail": interpreter.get("error") or "runs", "fix": None if interpreter["ok"] else
                          (bad["fix"] if bad else "see the error; tileloop is tested with triton 3.6 and numpy < 2.4")})
    recommendation = recommend(probe, avail, checks)
    if isolation is not None:  # said, never what decides the backends
        checks.append(isolation)
    return {"probe": probe, "backends": avail, "checks": checks, "recommendation": recommendation,
            "cuda_c": cuda_c_compiler()}


def cuda_c_compiler() -> dict:
    """The compiler of CUDA C targets: the nvcc found, its version and the architectures it emits
    machine code for, or why there is none and what installs one."""
    chain = nvcc.toolchain()
    return {**chain.to_json(), "reason": None} if chain is not None else {"nvcc": None, "reason": nvcc.why_none()}


def recommend(probe: dict, avail: dict, checks: list[dict] = ()) -> str:
    cap = probe.get("capability") or [0, 0]
    failed = [c for c in checks if not c["ok"]]
    if failed and not probe.get("cuda_available"):  # without a GPU the interpreter is all there is
        return f"fix first: {failed[0]['name']}: {failed[0]['fix']}"
    if failed:  # on a GPU only --device cpu needs the interpreter
        return f"{recommend(probe, avail)}; for --device cpu, fix first: {failed[0]['name']}: {failed[0]['fix']}"
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


def _nvcc_line(found: dict) -> str:
    """The CUDA C compiler's line: nvcc's path, release and the sm_XX it targets, or why none."""
    if not found.get("nvcc"):
        return f"nvcc (CUDA C):  {found.get('reason') or 'not found'}"
    return (f"nvcc (CUDA C):  {found['nvcc']} ({found['release']}, {found['version']}, from {found['source']}); "
            f"targets {', '.join(found['archs'])}")


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
        _nvcc_line(rep.get("cuda_c") or {}),
        tilelang_install.line(),
        f"ncu:            {p.get('ncu') or 'not found'}" + (f" ({p['ncu_version']})" if p.get("ncu_version") else ""),
        f"numpy:          {p.get('numpy_version') or 'n/a'}",
        f"tile env:       {p.get('tile_env') or '{}'}",
        "",
        "| backend | available | reason |",
        "|---|---|---|",
    ]
    for name, a in rep["backends"].items():
        lines.append(f"| {name} | {'yes' if a['available'] else 'no'} | {a['reason']} |")
    for c in rep.get("checks", []):
        lines.append(f"{'ok' if c['ok'] else 'FAILED'}: {c['name']}: {c['detail']}" + (f" (fix: {c['fix']})" if c.get("fix") else ""))
    lines += ["", f"recommendation: {rep['recommendation']}"]
    return "\n".join(lines)
