"""One namespace per kernel process, and what it gives (`loop/common/namespaces.py`,
`loop/worker/zygote.py`, `loop/measure/launch.py`): each implementation compiles into a Triton
cache of its own and, where its mount namespace is its own, cannot reach the others' (the
incumbent is unharmed by a candidate that writes its cache: tests/adversaries/write_incumbent_cache.py);
a kernel process cannot find or signal its sibling; a worker that runs kernel code outside a judge
(the compile gate, `check`) is confined as a kernel process is. Each holds where the machine allows
it and says so; with TILELOOP_PID_NAMESPACE=0 the same tests show the reach they take away (so they
can fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces, /proc: Linux")
ADVERSARIES = Path(__file__).parent / "adversaries"
PLANTED = "planted-by-the-candidate"  # what write_incumbent_cache leaves where it got


def _run(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# -- each implementation's own Triton cache -------------------------------------------------------

OWN_CACHE = """
    import json, sys
    import triton
    from loop.common.namespaces import own_triton_cache
    path = own_triton_cache(sys.argv[1], sys.argv[2].encode())
    print(json.dumps({"path": path, "knob": triton.knobs.cache.dir}))
"""


@linux
def test_each_implementation_takes_a_cache_of_its_own_that_a_rerun_of_its_source_finds(tmp_path):
    def own(label: str, source: str) -> str:
        got = json.loads(_run(OWN_CACHE, label, source, env={"TRITON_CACHE_DIR": str(tmp_path)}))
        assert got["knob"] == got["path"] and Path(got["path"]).is_dir(), got
        return got["path"]

    incumbent = own("incumbent", "def run(x): return x")
    assert Path(incumbent).parent == tmp_path / "implementations" and Path(incumbent).name.startswith("incumbent-")
    assert own("incumbent", "def run(x): return x") == incumbent  # the same source again: the same folder
    assert own("incumbent", "def run(x): return x + 0") != incumbent  # another source: another folder
    assert own("candidate", "def run(x): return x") != incumbent  # another implementation: another folder


HIDDEN = """
    import json, os, sys
    from pathlib import Path
    from loop.common.namespaces import hide_triton_caches, mount_proc, new_pid_namespace, own_triton_cache
    root = sys.argv[1]
    said = new_pid_namespace()  # as the zygote makes them: the next child is the init of its namespaces
    if said != "own":
        print(json.dumps({"said": said}))
        sys.exit(0)
    read, write = os.pipe()
    if os.fork() == 0:  # as a kernel process: its /proc mounted, the root hidden, then its load
        mount_proc()
        hidden = hide_triton_caches(root)
        path = own_triton_cache("candidate", b"def run(x): return x")
        Path(path, "compiled").write_text("the candidate's own")
        import subprocess  # a child of it (a compiler's worker, told TRITON_CACHE_DIR) reaches the folder too
        subprocess.run([sys.executable, "-c", f"open({path!r} + '/from-a-child', 'w').write('x')"], check=True)
        seen = {"said": said, "hidden": hidden, "path": path, "root": sorted(os.listdir(root)),
                "implementations": sorted(os.listdir(Path(root, "implementations"))),
                "incumbent": os.path.exists(Path(root, "implementations", "incumbent-0"))}
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 65536).decode())
    os.wait()
"""


@linux
def test_in_a_mount_namespace_of_its_own_the_other_caches_are_out_of_reach(tmp_path):
    """The cache root hidden under a tmpfs: the kernel process sees only its own folder (under the
    same path), writes through to the real one, and reaches neither the incumbent's nor the rest."""
    theirs = tmp_path / "implementations" / "incumbent-0"
    theirs.mkdir(parents=True)
    (theirs / "compiled").write_text("the incumbent's")
    (tmp_path / "a-shared-key").mkdir()
    got = json.loads(_run(HIDDEN, str(tmp_path)))
    if got["said"] != "own":
        pytest.skip(f"no mount namespace here: {got['said']}")
    name = Path(got["path"]).name
    assert got["hidden"] and got["path"] == str(tmp_path / "implementations" / name), got
    assert got["root"] == ["implementations"] and got["implementations"] == [name] and not got["incumbent"], got
    assert (tmp_path / "implementations" / name / "compiled").read_text() == "the candidate's own"
    assert (tmp_path / "implementations" / name / "from-a-child").read_text() == "x"
    assert (theirs / "compiled").read_text() == "the incumbent's" and (tmp_path / "a-shared-key").is_dir()


def _judged(tmp_path: Path, name: str) -> dict:
    from test_judge import judged

    return judged(tmp_path, ADVERSARIES / f"{name}.py")


def _incumbent_cache(tmp_path: Path) -> Path:
    (folder,) = (tmp_path / "cache" / "implementations").glob("incumbent-*")
    return folder


@pytest.mark.slow
@linux
def test_a_candidate_that_writes_the_incumbents_cache_cannot_reach_it(tmp_path, env):
    raw = _judged(tmp_path, "write_incumbent_cache")
    assert raw["status"] == "ok", raw  # the incumbent's own code: measured, whatever noise decides
    if raw["isolation"]["triton_cache"] != "own, others hidden":
        assert raw["isolation"]["triton_cache"] == "own", raw["isolation"]  # said, never claimed
        pytest.skip(f"the caches are not hidden here: {raw['isolation']}")
    assert raw["isolation"]["siblings"] == "hidden", raw["isolation"]
    assert not list(_incumbent_cache(tmp_path).rglob(PLANTED)), list(_incumbent_cache(tmp_path).rglob("*"))
    assert not list((tmp_path / "cache").rglob(PLANTED))  # nothing of the real root reached either


@pytest.mark.slow
@linux
def test_without_the_namespaces_the_same_candidate_writes_the_incumbents_cache(tmp_path, env):
    """TILELOOP_PID_NAMESPACE=0 (as on a machine that forbids them): each still has a cache of its
    own, the record says the others are not hidden, and the planted file is there (the test above
    can fail)."""
    env.setenv("TILELOOP_PID_NAMESPACE", "0")
    raw = _judged(tmp_path, "write_incumbent_cache")
    assert raw["status"] == "ok", raw
    assert raw["isolation"]["triton_cache"] == "own" and raw["isolation"]["siblings"] == "visible", raw["isolation"]
    assert raw["isolation"]["pid_namespace"] == "unavailable: turned off (TILELOOP_PID_NAMESPACE=0)", raw["isolation"]
    assert list(_incumbent_cache(tmp_path).rglob(PLANTED))


# -- siblings -------------------------------------------------------------------------------------

# loaded by one kernel process as its spec: looks for its sibling as stop_the_sibling does (a child
# of its own parent running loop.worker), and anywhere in its /proc, then signals the sibling's pid
# as the judge names it (signal 0: it harms none)
FIND_SIBLING = textwrap.dedent("""
    import json, os
    from pathlib import Path

    here = Path(__file__).parent
    me, parent = os.getpid(), os.getppid()
    found, children = [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"loop.worker" in cmdline:
            found.append(int(entry.name))
            if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                children.append(int(entry.name))
    try:
        os.kill(int((here / "sibling.pid").read_text()), 0)
        kill = "ok"
    except ProcessLookupError:
        kill = "ESRCH"
    except PermissionError:
        kill = "EPERM"
    (here / "found.json").write_text(json.dumps({"found": found, "children": children, "kill": kill}))
""")

TWO_KERNELS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from loop.judge import fork
    from loop.judge.kernel_process import KernelProcess

    work = Path(sys.argv[1])
    sibling, finder = (KernelProcess(work, name, warm=None) for name in ("sibling", "finder"))
    sibling.request({"op": "arena"}, "sibling")
    (work / "sibling.pid").write_text(str(sibling.proc.pid))
    try:
        finder.request({"op": "load", "spec": str(work / "finder.py"), "target_dir": str(work), "device": "cpu",
                        "backend": "interpreter", "impls": []}, "finder")
    except Exception:
        pass  # not a spec: what it ran at import is all that is asked of it
    print(json.dumps(fork.isolation([sibling.proc.pid, finder.proc.pid])))
    for k in (sibling, finder):
        k.close()
""")


def _find_sibling(tmp_path: Path, env: dict[str, str]) -> tuple[dict, dict]:
    (tmp_path / "finder.py").write_text(FIND_SIBLING)
    isolation = json.loads(_run(TWO_KERNELS, str(tmp_path), env=env, timeout=300).splitlines()[-1])
    return isolation, json.loads((tmp_path / "found.json").read_text())


@pytest.mark.slow  # a zygote imports torch
@linux
def test_a_kernel_process_cannot_find_or_signal_its_sibling(writable_by_kernels):
    isolation, found = _find_sibling(writable_by_kernels, {})
    assert isolation["spawn"] == "zygote", isolation
    if isolation["siblings"] != "hidden":
        assert isolation["siblings"] == "visible", isolation
        pytest.skip(f"no namespace per kernel process here: {isolation}")
    assert found == {"found": [], "children": [], "kill": "ESRCH"}, found


@pytest.mark.slow
@linux
def test_without_the_namespaces_a_kernel_process_finds_and_reaches_its_sibling(tmp_path):
    isolation, found = _find_sibling(tmp_path, {"TILELOOP_PID_NAMESPACE": "0"})
    assert isolation["siblings"] == "visible" and isolation["spawn"] == "zygote", isolation
    assert found["kill"] == "ok" and found["children"], found  # stop_the_sibling's way finds it


# -- a read-only view of the machine --------------------------------------------------------------

# loaded by a kernel process as its spec (from a folder it can write, where it reports back): it tries to
# plant a module where a later process would import it, and writes its temporary file
PLANT = textwrap.dedent("""
    import json, os, sys, tempfile
    from pathlib import Path

    here = Path(__file__).parent
    targets = json.loads((here / "targets.json").read_text())
    got = {}
    for name, path in targets.items():
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "x") as f:
                f.write("raise SystemExit('planted')")
            got[name] = "written"
        except OSError as exc:
            got[name] = exc.strerror
    scratch = os.path.join(tempfile.gettempdir(), "scratch.txt")
    with open(scratch, "w") as f:
        f.write("ok")
    got["scratch"] = scratch
    (here / "planted.json").write_text(json.dumps(got))
""")

ONE_KERNEL = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from loop.judge import fork
    from loop.judge.kernel_process import KernelProcess

    work = Path(sys.argv[1])
    planter = KernelProcess(work, "planter", warm=None)
    try:
        planter.request({"op": "load", "spec": str(work / "planter.py"), "target_dir": str(work), "device": "cpu",
                         "backend": "interpreter", "impls": []}, "planter")
    except Exception:
        pass  # not a spec: what it ran at import is all that is asked of it
    print(json.dumps(fork.isolation([planter.proc.pid])))
    planter.close()
""")


def _plant(reports: Path, repo: Path, env: dict[str, str], source: bool = True) -> tuple[dict, dict]:
    """A kernel process tries to write into `repo` (the run's folders: a later iteration's, beside the
    target) and, with `source`, into tileloop's own source: (its isolation, what each write did)."""
    marker = f"tileloop_planted_{reports.name.replace('-', '_')}"
    targets = {"later iteration": str(repo / "sandbox" / "run" / "logs" / "iter-009" / "statistics.py"),
               "repository": str(repo / "kernels" / f"{marker}.py"),
               **({"tileloop": str(REPO_ROOT / "loop" / f"{marker}.py")} if source else {})}
    (reports / "targets.json").write_text(json.dumps(targets))
    (reports / "planter.py").write_text(PLANT)
    try:
        isolation = json.loads(_run(ONE_KERNEL, str(reports), env=env, timeout=300).splitlines()[-1])
        return isolation, json.loads((reports / "planted.json").read_text())
    finally:
        for path in targets.values():
            Path(path).unlink(missing_ok=True)  # where the view let it through: gone before it is imported


@pytest.mark.slow  # a zygote imports torch
@linux
def test_a_kernel_process_sees_the_machine_read_only_but_its_scratch(writable_by_kernels, tmp_path):
    isolation, got = _plant(writable_by_kernels, tmp_path, {})
    if isolation["filesystem"] != "read-only":
        assert isolation["filesystem"] == "writable", isolation
        pytest.skip(f"no read-only view here: {isolation}")
    assert {k: got[k] for k in ("later iteration", "repository", "tileloop")} == dict.fromkeys(
        ("later iteration", "repository", "tileloop"), "Read-only file system"), got
    assert not got["scratch"].startswith(str(tmp_path)) and not Path(got["scratch"]).exists(), got  # private, gone


@pytest.mark.slow
@linux
def test_without_the_read_only_view_a_kernel_process_plants_a_module(writable_by_kernels, tmp_path):
    """TILELOOP_READ_ONLY=0: the same kernel process writes beside the target and in a later iteration's
    folder (what the view takes away; tileloop's own source is left out here)."""
    isolation, got = _plant(writable_by_kernels, tmp_path, {"TILELOOP_READ_ONLY": "0"}, source=False)
    assert isolation["filesystem"] == "writable", isolation
    assert got["later iteration"] == got["repository"] == "written", got


# -- workers that run kernel code outside a judge -------------------------------------------------

STATUS = """
    import json, os
    from pathlib import Path
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    print(json.dumps({k: status[k].strip() for k in ("NSpid", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd")}
                     | {"ppid": os.getppid()}))
    raise SystemExit(3)
"""


@linux
@pytest.mark.parametrize("namespace", ["on", "off"])
def test_a_worker_launched_confined_has_no_capabilities_and_where_allowed_a_namespace(namespace):
    from loop.common.processes import confine_zygote
    from loop.measure.launch import confined_command

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **({"TILELOOP_PID_NAMESPACE": "0"} if namespace == "off" else {})}
    done = subprocess.run(confined_command([sys.executable, "-c", textwrap.dedent(STATUS)]), capture_output=True,
                          text=True, timeout=60, env=env, preexec_fn=confine_zygote)
    assert done.returncode == 3, done.stderr[-2000:]  # its exit code, through the launcher
    got = json.loads(done.stdout)
    assert got["NoNewPrivs"] == "1" and {got[k] for k in ("CapEff", "CapPrm", "CapBnd")} == {"0000000000000000"}, got
    depth = len(Path("/proc/self/status").read_text().split("NSpid:")[1].splitlines()[0].split())
    if namespace == "off" or _run("from loop.common.namespaces import new_pid_namespace as n; print(n())").strip() != "own":
        assert len(got["NSpid"].split()) == depth and got["ppid"] != 0, got
    else:
        assert got["NSpid"] == "1" and got["ppid"] == 0, got  # pid 1 of its own, in the /proc it mounted


CHECK_SPEC = """
import json, os, tempfile
from pathlib import Path
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
got = {k: status[k].strip() for k in ("NSpid", "NoNewPrivs", "CapEff")}
try:  # beside the spec and the target: the repository, where the worker may not write
    Path(__file__).with_name("planted.py").write_text("raise SystemExit('planted')")
    got["beside the target"] = "written"
except OSError as exc:
    got["beside the target"] = exc.strerror
with tempfile.NamedTemporaryFile(dir=None) as scratch:
    got["scratch"] = scratch.name
(Path.cwd() / "worker.json").write_text(json.dumps(got))  # its working folder, where its result goes
"""


@pytest.mark.slow  # a worker imports torch
@linux
def test_a_check_worker_runs_the_users_code_confined(tmp_path, env):
    from loop import backends
    from loop.common.settings import Settings
    from loop.measure.launch import run_worker

    (tmp_path / "spec.py").write_text(CHECK_SPEC)
    (tmp_path / "target.py").write_text("def run(x):\n    return x\n")
    job = {"mode": "check", "spec": str(tmp_path / "spec.py"), "target": str(tmp_path / "target.py"),
           "target_dir": str(tmp_path), "language": "triton", "backend": "interpreter", "device": "cpu",
           "spec_shown": "spec.py", "target_shown": "target.py", "run_kernels": False}
    run_worker(tmp_path / "work", job, backends.get("interpreter"), Settings(), tmp_path / "cache", name="check")
    got = json.loads((tmp_path / "work" / "worker.json").read_text())
    assert got["NoNewPrivs"] == "1" and got["CapEff"] == "0000000000000000", got
    own = _run("from loop.common.namespaces import new_pid_namespace as n; print(n())").strip() == "own"
    assert (got["NSpid"].split()[-1] == "1") == own, got
    log = (tmp_path / "work" / "check.log").read_text()
    if own and "tileloop: filesystem read-only" in log:  # the machine read-only but its folder, caches and scratch
        assert got["beside the target"] == "Read-only file system" and not (tmp_path / "planted.py").exists(), got
        assert ".tileloop-scratch-" in got["scratch"] and not list((tmp_path / "work").glob(".tileloop-scratch-*")), got
    else:
        assert got["beside the target"] == "written", (got, log[-500:])


@pytest.mark.gpu
def test_on_a_gpu_each_implementation_compiles_into_its_own_cache_and_the_incumbents_is_unharmed(tmp_path, env):
    """PTX on a CUDA device: the kernels compile into each implementation's own folder (reached, where
    the root is hidden, through the handle the kernel process kept), the candidate that writes the
    incumbent's cache reaches none of it, and the incumbent's compiled kernels are whole."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from test_judge import judged

    raw = judged(tmp_path, ADVERSARIES / "write_incumbent_cache.py", device="cuda")
    assert raw["status"] == "ok", raw
    assert raw["isolation"]["triton_cache"] == "own, others hidden" and raw["isolation"]["siblings"] == "hidden", raw
    incumbent = _incumbent_cache(tmp_path)
    (candidate,) = (tmp_path / "cache" / "implementations").glob("candidate-*")
    for folder in (incumbent, candidate):
        cubins = list(folder.rglob("*.cubin"))
        assert cubins and all(c.stat().st_size > 0 for c in cubins), (folder, list(folder.rglob("*")))
    assert not list((tmp_path / "cache").rglob(PLANTED))
