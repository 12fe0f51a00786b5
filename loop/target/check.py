"""`tileloop check <target>`: the target and its spec validated without starting a run, every
problem listed at once, each with where it is (file:line where one is known) and a fix.

Three passes: the contract read from the source (`contract.load_kernel`: the files, the language;
missing names and a missing entry point are left to the worker, which names them with the rest); the
check job in a worker (`loop.worker.check_job`: the spec's names and values, make_inputs, the
reference and the kernel at every correctness shape and dtype, every output, flops and bytes_moved);
and, with `archs`, the ahead-of-time build for each architecture (also when the only problem is a
construct the Triton interpreter cannot run: the build is then the CPU's proof that it compiles).
A kernel of the target that no checked shape launches is a warning: a change to it could not be
seen by the correctness checks. Without a GPU (a cuTile target, or a Triton target checked for the
GPU), what needs none is checked (make_inputs and the reference on the CPU, the spec's contract, the
build) and one warning says that the kernel itself was not run, why, and the command that runs it.
`tileloop init` runs the same checks (without the build, which its baseline makes) and refuses to
start on any problem.
"""

from __future__ import annotations

import re
from pathlib import Path

from loop import backends as backend_registry
from loop.common.errors import UserError
from loop.common.language import get_language
from loop.common.settings import Settings
from loop.measure.compile_gate import compile_gate, compile_summary
from loop.measure.launch import run_worker
from loop.records import gitops
from loop.target.contract import Kernel, load_kernel, spec_dtypes
from loop.common.files import scratch


def problem(what: str, where: str = "", hint: str = "") -> dict:
    return {"what": what, "where": where, "hint": hint}


def line_of(p: dict) -> str:
    """One problem as one line: where: what (fix: hint)."""
    return (f"{p['where']}: " if p.get("where") else "") + p["what"] + (f" (fix: {p['hint']})" if p.get("hint") else "")


AT = re.compile(r" \(at shape (\([^)]*\)) (\w+)\)")


def grouped(problems: list[dict]) -> list[dict]:
    """One problem per cause: the same failure at several shapes and dtypes is one line that lists them."""
    out: dict[tuple, dict] = {}
    for p in problems:
        m = AT.search(p["what"])
        key = (p["where"], AT.sub("", p["what"]) if m else p["what"], p["hint"])
        if key not in out:
            out[key] = {**p, "at": []}
        if m:
            out[key]["at"].append(f"{m.group(1)} {m.group(2)}")
    for (where, what, hint), p in out.items():
        if len(p["at"]) > 1:
            p["what"] = f"{what} (at {len(p['at'])} shape/dtype pairs: {', '.join(p['at'][:4])}" + \
                (", ...)" if len(p["at"]) > 4 else ")")
        p.pop("at")
    return list(out.values())


def check(target: str | Path, *, device: str, archs: list[str], settings: Settings, root: Path | None = None,
          log=lambda message: None) -> dict:
    """Every problem of the target and its spec (the `--json` payload of `tileloop check`)."""
    path = Path(target).resolve()
    if root is None:
        root = gitops.root_or_folder(path.parent)
    out: dict = {"target": str(target), "device": device, "archs": archs, "problems": [], "warnings": [],
                 "kernels": [], "launched": [], "kernel_run": True}
    try:
        kernel = load_kernel(path, root, names=False)  # the worker names every missing name, with the rest
    except UserError as exc:
        out["problems"].append(problem(exc.message, "", exc.hint or ""))
        return _done(out)
    out.update(target=str(kernel.target), spec=str(kernel.spec), language=kernel.language)
    log(f"checking {kernel.target} with {kernel.spec} ({device})")
    if kernel.language == "cuda":  # solve's parameters against the spec's inputs, read from both sources
        from loop.target.cuda_c import problems as cuda_problems

        out["problems"] += cuda_problems(kernel.target_abs, kernel.spec_abs, str(kernel.target), str(kernel.spec))
    interpreter_only = _dynamic(kernel, device, settings, out)
    built = bool(archs) and (not out["problems"] or interpreter_only)  # what the interpreter cannot run, a GPU may
    if built:
        log(f"building {kernel.target} ahead of time for {', '.join(archs)}")
        _build(kernel, archs, settings, out)
    if not out["kernel_run"]:
        out["warnings"].insert(0, _not_run(kernel, str(target), device, archs if built else []))
    return _done(out)


def _done(out: dict) -> dict:
    out["ok"] = not out["problems"]
    return out


def _backend(kernel: Kernel, device: str) -> str:
    """The backend the check job runs in: the language's on the CPU where it has one there, else the one
    its ahead-of-time build runs in."""
    entry = get_language(kernel.language)
    return entry.preferred["cpu"][0] if device == "cpu" and "cpu" in entry.preferred else entry.compile_backend


def _gpu_only(kernel: Kernel) -> bool:
    """The language has no backend that runs its kernels on the CPU."""
    return "cpu" not in get_language(kernel.language).preferred


def _not_run(kernel: Kernel, shown: str, device: str, archs: list[str]) -> dict:
    """The one line that says the kernel itself was not run here, why, and what would run it."""
    gpu_only = _gpu_only(kernel)
    why = f"{get_language(kernel.language).title} kernels run on a GPU only" if gpu_only else "no GPU is visible here"
    if gpu_only and device == "cuda":
        why += ", and none is visible here"
    checked = "make_inputs and the reference on the CPU, the spec's contract" + (
        f", the ahead-of-time build for {', '.join(archs)}" if archs else "")
    fix = (f"tileloop check {shown} on a machine with a GPU runs it" if gpu_only else
           f"tileloop check {shown} --device cpu runs it under the Triton interpreter; on a machine with a GPU, "
           f"tileloop check {shown}")
    return problem(f"the kernel itself was not run: {why} (checked: {checked})", str(kernel.target), fix)


def _dynamic(kernel: Kernel, device: str, settings: Settings, out: dict) -> bool:
    """The check job, in a worker; True when its only problem is what the Triton interpreter cannot run.
    `out["kernel_run"]` says whether the kernel itself ran (not for cuTile on the CPU, nor without a GPU)."""
    backend = _backend(kernel, device)
    job = {"mode": "check", "spec": str(kernel.spec_abs), "target": str(kernel.target_abs),
           "target_dir": str(kernel.target_abs.parent), "language": kernel.language, "backend": backend,
           "device": device, "run_kernels": not (_gpu_only(kernel) and device == "cpu"),
           "spec_shown": str(kernel.spec), "target_shown": str(kernel.target)}
    with scratch("check") as tmp:
        raw = run_worker(Path(tmp), job, backend_registry.get(backend), settings, Path(tmp) / "cache", name="check")
    if raw.get("status") != "ok":
        tail = (raw.get("log_tail") or "").strip().splitlines()
        out["problems"].append(problem(f"the check worker failed: {raw.get('status')}: {raw.get('message')}",
                                       str(kernel.target), tail[-1][:300] if tail else ""))
        return False
    out["kernel_run"] = job["run_kernels"] and not raw.get("no_gpu")
    out["problems"] += grouped(raw["problems"])
    out["warnings"] += grouped(raw.get("warnings", []))
    out["kernels"], out["launched"] = raw.get("kernels", []), raw.get("launched", [])
    unreached = [k for k in out["kernels"] if k not in out["launched"]]
    if unreached and out["kernel_run"] and not raw["problems"]:
        out["warnings"].append(problem(f"no checked shape launches {', '.join(unreached)}", str(kernel.target),
                                       "a change to it cannot be checked: add a shape that reaches it, or it is not "
                                       "part of this entry point"))
    return bool(raw["problems"]) and bool(raw.get("interpreter_only"))


def _build(kernel: Kernel, archs: list[str], settings: Settings, out: dict) -> None:
    with scratch("check") as tmp:
        raw = compile_gate(workdir=Path(tmp), spec_path=kernel.spec_abs, target_dir=kernel.target_abs.parent,
                           target=kernel.target_abs, language=kernel.language, archs=archs, settings=settings,
                           cache_root=Path(tmp), dtypes=spec_dtypes(kernel.spec_abs))
    failed = {(r["arch"], r["dtype"]): r.get("error", "") for r in compile_summary(raw) if not r["ok"]}
    for (arch, dtype), error in failed.items():
        out["problems"].append(problem(f"the kernel does not compile for {arch} ({dtype}): {error.splitlines()[0][:300]}",
                                       str(kernel.target), "tileloop compile shows the full error"))
    if raw.get("status") != "ok" and not failed:
        out["problems"].append(problem(f"the ahead-of-time build failed: {raw.get('message', '')}"[:400], str(kernel.target)))
