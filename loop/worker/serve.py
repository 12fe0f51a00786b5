"""The kernel process of a judged measurement: forked by the judge's zygote (`loop.worker.zygote`,
which imported torch once) or `python -m loop.worker --serve R,W`, started by the judge
(`loop.judge`) with a pair of pipes; either way `serve` runs the same loop. It imports the implementations, runs them on memory the
judge owns (`loop.common.arena`), writes what they return into the judge's output slots (or, for
timed calls on a GPU, names the memory they returned by IPC handle), and times them. It decides nothing: it never sees a reference, a tolerance
or a comparison, and every number it reports is checked by the judge (outputs element by element,
timings against the judge's own clock).

One kernel process runs one implementation (the judge starts one per implementation, so that a
candidate cannot reach the incumbent it is timed against). Requests (`op`) and answers, one JSON
object each:
  load     spec, implementation, backend -> {labels}            (an import failure is a compile error; the
           implementation's own Triton cache taken first: `loop.common.namespaces.own_triton_cache`,
           its cuTile tuning results kept there: `loop.worker.cutile_tune`; a target that is not Python
           loaded by its language's `load`, a CUDA C one built there for this device: `cuda_build`; a
           TileLang one's kernel cache in that own folder and its target the device's, set before
           TileLang is imported: `tilelang_build.use_own_cache`; its kernels compile at their first
           call, in the checks or the warm-up of `prepare`, never in a timed call)
  arena    open an arena the judge made / drop one it is freeing
  call     one call on inputs in an arena; outputs copied into the judge's slots
  record   launch recording on or off -> {launched, called} when off
  prepare  input sets for timing, warm-up -> {call_ms, peak_mem_mb}
  capture  a CUDA graph of `calls` calls, one per input set -> {captured, outputs: where each set's
           outputs are}; eager: time without a graph, over the first `sets` input sets
  sample   `n` timed samples -> {ms: [...], launches: [...]} (per call; the target's kernels each
           sample launched), or empty ones (their overhead); the judge
           interleaves the processes' requests and times each on its own clock; an audited sample
           also says where the outputs of the set it used are (`audit`)
  tuned    the configs a run-time tuner picked while timed
  proof    which backend compiled the kernels (for nvcc: the library built for this device, and called;
           for tilelang: each kernel built for this device's target, here or in its own cache)
A kernel's failure answers {"failure": {status, label, message, detail}}; the spec's or tileloop's
own answers {"error": {status, message, detail}}.

Launches are recorded through each implementation's language's launch hook (its registry entry,
`loop.common.language`: a `.cu` file's language by its suffix, any other by the backend that runs it).

Timer tampering: the timing functions are captured before any kernel code is imported, and the
process checks after each stage (import, correctness, timing) that the target has not replaced them
(a candidate that patches the clock would time itself): `incorrect`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from loop.common import arena, ipc, timing
from loop.common.channel import Channel, ChannelClosed
from loop.common.language import LANGUAGES, not_python
from loop.common.namespaces import own_triton_cache
from loop.common.outputs import as_outputs, poison_allocator
from loop.common.spec import Spec
from loop.worker.bench import tuned_configs
from loop.worker.compiled import CompiledReference, spec_pairs
from loop.worker.cutile_tune import keep_cutile_tunings
from loop.worker.failures import KernelFailure, SpecError, call_impl, load_module, short_traceback
from loop.worker.launches import LaunchRecorder
from loop.worker.sampler import Sampler
from loop.worker.providers import load_reference
from loop.worker.proof import backend_proof, pin_autotune_to_first_config, watch_cutile_compiles, watch_tilelang_compiles
from loop.worker.tilelang_build import use_own_cache


def timer_identities(torch) -> dict:
    watched = {"time.perf_counter": (time, "perf_counter")}
    if hasattr(torch, "cuda"):
        watched.update({"torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event")})
        ev = torch.cuda.Event
        watched.update({"Event.record": (ev, "record"), "Event.elapsed_time": (ev, "elapsed_time"),
                        "CUDAGraph.replay": (torch.cuda.CUDAGraph, "replay")})
    return {name: (owner, attr, getattr(owner, attr)) for name, (owner, attr) in watched.items()}


def check_tamper(torch, watch: dict, stage: str):
    changed = [name for name, (owner, attr, orig) in watch.items() if getattr(owner, attr) is not orig]
    if changed:
        raise KernelFailure("incorrect", "candidate", f"timer tampering detected after {stage}: {', '.join(changed)} replaced")


class KernelSide:
    """What the kernel process holds between requests. `warm`: the device to get ready for before
    the first request (torch and Triton imported, the CUDA context made), while the judge starts."""

    def __init__(self, warm: str | None = None):
        self.marks = {"start": time.time()}  # when each step of getting ready ended (epoch s: the judge's timeline is another process's)
        import torch

        self.torch = torch
        self.device = self.backend = None
        self.spec: Spec | None = None
        self.modules: dict[str, Any] = {}
        self.languages: dict[str, str] = {}  # label -> the language whose launch hook records its launches
        self.tilelang_cache = ""  # TileLang's kernel cache: the implementation's own folder ("": none, off)
        self.arenas: dict[str, Any] = {}
        self.recorders: dict[str, LaunchRecorder] = {}
        self.sampler: Sampler | None = None
        self.tuned_before: dict = {}
        self.counter: LaunchRecorder | None = None  # launches per timed request (`prepare` on)
        self.graph_launches = 0
        self.clock = None
        self.watch = timer_identities(torch)  # before any kernel code is imported
        self.marks["torch"] = time.time()
        if warm == "cpu":
            torch.set_num_threads(1)  # no pool of spinning threads beside the judge's clock (one call at a time anyway)
        if warm == "cuda" and torch.cuda.is_available():
            torch.zeros(1, device="cuda").add_(1)  # the CUDA context, made once
            torch.cuda.synchronize()
            self.marks["cuda"] = time.time()
        if warm is not None:
            try:
                import triton  # noqa: F401 - imported by every Triton target (cuTile runs may lack it)
            except ImportError:
                pass
            self.marks["warm"] = time.time()

    def sync(self, label: str) -> None:
        if self.device == "cuda":
            call_impl(label, "call", self.torch.cuda.synchronize)

    # -- requests -------------------------------------------------------------------------------

    def load(self, msg: dict) -> dict:
        torch = self.torch
        self.device, self.backend = msg["device"], msg["backend"]
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the kernel process was asked for cuda but no CUDA device is visible")
        if self.device == "cuda":
            self.clock = timing._Clock(torch)
        impl = (msg.get("impls") or [{}])[0]  # its own Triton cache, before any code of the spec or the implementation runs
        own = own_triton_cache(impl.get("label") or msg.get("reference") or "+".join(msg.get("torch_providers", [])),
                               Path(impl["path"]).read_bytes() if impl else b"")
        sys.path.insert(0, msg["target_dir"])
        # cuTile's compiled kernels, and torch.compile's (inductor's caches: a provider's), in the same folder of
        # its own, never in one another implementation reads (nor one a read-only view refuses)
        os.environ["CUDA_TILE_CACHE_DIR"] = os.path.join(own, "cutile") if own else "off"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(own or tempfile.gettempdir(), "inductor")
        if self.backend == "cutile":
            watch_cutile_compiles()
            keep_cutile_tunings(own)  # its cuTile searches kept in the same folder of its own ("": none kept)
        if self.backend == "interpreter":
            pin_autotune_to_first_config()
        if self.backend == "tilelang" and self.device == "cuda":  # before TileLang is imported: its cache, its target
            major, minor = torch.cuda.get_device_capability()
            self.tilelang_cache = use_own_cache(own, major * 10 + minor)
            watch_tilelang_compiles()
        self.spec = Spec(torch, load_module("tileloop_spec", Path(msg["spec"])))
        for impl in msg["impls"]:
            label = impl["label"]
            self.modules[label] = call_impl(label, "import", load_module, f"tileloop_impl_{label}", Path(impl["path"]))
            self.languages[label] = language_of(Path(impl["path"]), self.backend, self.device)
            built_here = not_python(Path(impl["path"])) is not None  # a library its load returns unbuilt
            prepare = getattr(getattr(self.modules[label], "solve", None), "prepare", None)
            if self.device == "cuda" and built_here and callable(prepare):  # built for this device now: nvcc's
                call_impl(label, "import", prepare, device_arch(torch))  # refusal is the candidate's compile error
        for provider in msg.get("torch_providers", []):
            self.modules[provider] = torch_provider(torch, self.spec, provider)
        answer: dict = {}
        if msg.get("reference"):  # a named public kernel of the spec's REFERENCES
            stand_in, source, why = load_reference(self.spec, msg["reference"])
            answer.update(source=source, unavailable=why)
            if stand_in is not None:
                self.modules[msg["reference"]] = stand_in
        check_tamper(torch, self.watch, "import")
        self.marks["loaded"] = time.time()
        return {"labels": list(self.modules), "marks": self.marks, **answer}

    def arena(self, msg: dict) -> dict:
        if msg.get("drop"):
            self.arenas.pop(msg["drop"], None)
        if msg.get("open"):
            self.arenas[msg["open"]["id"]] = arena.open_arena(self.torch, msg["open"])
        return {}

    def inputs(self, encoded: dict) -> dict:
        return {k: arena.decode(self.torch, self.arenas, v) for k, v in encoded.items()}

    def call(self, msg: dict) -> dict:
        label, torch = msg["label"], self.torch
        inputs = self.inputs(msg["inputs"])
        slots = [arena.view(torch, self.arenas, d) for d in msg["slots"]]
        if self.device == "cuda":
            poison_allocator(torch, sum(s.numel() * s.element_size() for s in slots))
        result = call_impl(label, "call", self.spec.entry(self.modules[label]), **inputs)
        self.sync(label)
        return {"outputs": self.deliver(label, result, inputs, slots)}

    def deliver(self, label: str, result, inputs: dict, slots: list, in_place: bool = False) -> list[dict]:
        """What a call produced, as the judge reads it: an OUTPUTS buffer by name (it is already the
        judge's memory), a returned tensor copied into its slot (or its shape, when it does not fit the
        slot), any other value as JSON. `in_place` (a timed call on a GPU): a returned tensor is named
        by IPC handle instead, for the judge to read where the timed call wrote it (no copy that work
        could hide in)."""
        torch = self.torch
        if result is None:
            return [{"kind": "buffer", "input": name} for name in self.spec.outputs if name in inputs]
        out = []
        for i, (name, value) in enumerate(as_outputs(result)):
            item: dict[str, Any] = {"name": name}
            if isinstance(value, torch.Tensor) and in_place:
                buffer = next((k for k in self.spec.outputs if isinstance(inputs.get(k), torch.Tensor)
                               and inputs[k].data_ptr() == value.data_ptr() and inputs[k].shape == value.shape), None)
                item.update({"kind": "buffer", "input": buffer} if buffer is not None else
                            {"kind": "ipc", "ipc": call_impl(label, "call", ipc.export, torch, value.detach())})
            elif isinstance(value, torch.Tensor):
                item.update(shape=list(value.shape), dtype=str(value.dtype).removeprefix("torch."))
                if i < len(slots) and tuple(slots[i].shape) == tuple(value.shape):
                    call_impl(label, "call", slots[i].copy_, value.detach())
                    item["kind"] = "slot"
                else:
                    item["kind"] = "unfit"
            else:
                item.update(kind="value", value=value if value is None or isinstance(value, (bool, int, float, str))
                            else repr(value)[:200])
            out.append(item)
        self.sync(label)
        return out

    def record(self, msg: dict) -> dict:
        label = msg["label"]
        if msg["on"]:
            self.recorders[label] = LaunchRecorder(self.modules[label], self.language(label)).__enter__()
            return {}
        rec = self.recorders.pop(label)
        rec.__exit__(None, None, None)
        check_tamper(self.torch, self.watch, "correctness")
        return {"launched": sorted(rec.launched), "called": sorted(rec.called)}

    def prepare(self, msg: dict) -> dict:
        """Input sets for timing (in the judge's arena), warm-up, peak memory and the call's estimate."""
        label = msg["label"]
        sets = [self.inputs(s) for s in msg["sets"]]
        self.tuned_before = tuned_configs(self.modules[label])
        if self.counter is None and isinstance(self.modules[label], ModuleType):
            self.counter = LaunchRecorder(self.modules[label], self.language(label),
                                          host=False).__enter__()  # on for the rest of this process
        self.sampler = Sampler(self.torch, self.clock, self.device, label, self.spec.entry(self.modules[label]), sets)
        return self.sampler.prepare()

    def capture(self, msg: dict) -> dict:
        t, before = self.sampler, self.launches()
        answer = t.capture(int(msg["calls"]))
        self.graph_launches = self.launches() - before  # what a replay launches (it runs no Python)
        if answer["captured"]:  # the graph's outputs stay where they are from replay to replay
            answer["outputs"] = {str(j): self.deliver(t.label, t.last[j], s, [], in_place=True)
                                 for j, s in enumerate(t.sets)}
        return answer

    def eager(self, msg: dict) -> dict:
        self.sampler.eager(int(msg["sets"]))
        return {}

    def sample(self, msg: dict) -> dict:
        """`n` samples back to back (per call, ms), or as many empty ones; an audited one (`audit`)
        also says where the set it used has its outputs (eagerly on a GPU: by IPC handle; under the
        interpreter: copied into the judge's slots)."""
        t, first, empty = self.sampler, int(msg["first"]), bool(msg.get("empty"))
        answer: dict = {"ms": [], "launches": []}
        for i in range(int(msg.get("n", 1))):
            before = self.launches()
            answer["ms"].append(t.sample(first + i, empty))
            answer["launches"].append(self.graph_launches if t.graph is not None and not empty
                                      else self.launches() - before)
        audit = msg.get("audit")
        if isinstance(audit, dict) and t.graph is None:
            j = first % len(t.sets)
            slots = [arena.view(self.torch, self.arenas, d) for d in audit.get("slots") or []]
            answer["outputs"] = self.deliver(t.label, t.last[j], t.sets[j], slots, in_place=self.device == "cuda")
        return answer

    def launches(self) -> int:
        return self.counter.count if self.counter is not None else 0

    def language(self, label: str) -> str:
        """The language whose launch hook records `label`'s launches (a stand-in's: the backend's)."""
        return self.languages.get(label) or language_of(None, self.backend, self.device)

    def tuned(self, msg: dict) -> dict:
        """The configs a run-time tuner picked during the timing, and the timer watch."""
        check_tamper(self.torch, self.watch, "timing")
        label = msg["label"]
        return {"tuned": {k: v for k, v in tuned_configs(self.modules[label]).items() if k not in self.tuned_before}}

    def proof(self, msg: dict) -> dict:
        arch = device_arch(self.torch) if self.device == "cuda" else None
        return {"proof": backend_proof({k: v for k, v in self.modules.items() if not isinstance(v, SimpleNamespace)},
                                       self.backend, arch, self.tilelang_cache)}


def device_arch(torch) -> str:
    """The current CUDA device's architecture, as nvcc names it ("sm_90")."""
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def language_of(path: Path | None, backend: str, device: str) -> str:
    """The language of an implementation, from the registry: a file that is not Python by its suffix
    (`.cu`: CUDA C), any other by the backend that runs it (the language whose entry lists it for the
    device); Triton where none does."""
    by_file = not_python(path) if path is not None else None
    return by_file.name if by_file else next((e.name for e in LANGUAGES.values()
                                              if backend in e.backends.get(device, ())), "triton")


def torch_provider(torch, spec, name: str):
    """PyTorch eager (the spec's reference at the benchmark dtype) or torch.compile of it, compiled
    code proven at every shape and dtype it is called at (`loop.worker.compiled`)."""
    if name == "torch_compile":
        return CompiledReference(torch, spec.module.reference, spec_pairs(spec))
    if name != "torch_eager":
        raise ValueError(f"unknown torch provider {name!r}")
    return SimpleNamespace(run=spec.module.reference)


OPS = ("load", "arena", "call", "record", "prepare", "capture", "eager", "sample", "tuned", "proof")


def answer(side: KernelSide, msg: dict) -> dict:
    """One request's answer; a failure is data, never an exception out of the loop."""
    op = msg.get("op")
    try:
        if op not in OPS:
            raise ValueError(f"unknown request {op!r}")
        return {"ok": True, **getattr(side, op)(msg)}
    except KernelFailure as exc:
        return {"failure": exc.wire()}
    except SpecError as exc:
        return {"error": {"status": "spec_error", "message": str(exc)}}
    except Exception as exc:  # noqa: BLE001 - tileloop's own failure, reported to the judge with its traceback
        return {"error": {"status": "harness_error", "message": f"{type(exc).__name__}: {exc}",
                          "detail": short_traceback(exc)}}


def serve(fds: str, warm: str | None = None) -> int:
    read_fd, write_fd = (int(x) for x in fds.split(","))
    channel = Channel(read_fd, write_fd)
    side = KernelSide(warm)
    while True:
        try:
            msg = channel.receive()
        except ChannelClosed:
            return 0
        if msg.get("op") == "exit":
            return 0
        channel.send(answer(side, msg))
