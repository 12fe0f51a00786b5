"""The judge's side of the shared memory: inputs placed where the kernel process can read them,
output slots it writes, and its answers turned back into the values the comparison reads."""

from __future__ import annotations

from loop.common import arena as shared
from loop.common import ipc
from loop.common.outputs import poison
from loop.judge.kernel_process import KernelFailure, KernelProcess

MIN_ARENA = 1 << 20


def slot_dtype(torch, ref):
    """Outputs are copied into slots of a wide type, exactly: fp64 for floating references, int64
    for integer ones (bool as it is)."""
    if ref.dtype == torch.bool:
        return torch.bool
    if ref.is_complex():
        return torch.complex128
    return torch.float64 if ref.is_floating_point() else torch.int64


class Bridge:
    """One arena at a time, grown when a request needs more, opened once by every kernel process
    (one per implementation: they all read the same input memory)."""

    def __init__(self, torch, kernels: dict[str, KernelProcess], device: str):
        self.torch, self.kernels, self.device = torch, kernels, device
        self.label = next(iter(kernels))  # the implementation a failure here is charged to
        self.arena: shared.Arena | None = None

    def fit(self, nbytes: int) -> shared.Arena:
        """An empty arena of at least `nbytes`, known to the kernel process."""
        if self.arena is not None and self.arena.nbytes >= nbytes:
            self.arena.reset()
            return self.arena
        old = self.arena
        self.arena = shared.Arena(self.torch, self.device, max(nbytes, MIN_ARENA))
        message = {"op": "arena", "open": self.arena.handle}
        if old is not None:
            message["drop"] = old.id
        for label, kernel in self.kernels.items():
            kernel.request(message, label)
        if old is not None:
            old.close()
        return self.arena

    def handover(self) -> None:
        """Before a kernel process reads memory the judge wrote: the judge's writes are complete (the
        kernel process runs on other streams, in another process; it synchronizes before it answers)."""
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def share(self, inputs: dict) -> dict:
        """Place `inputs` in the current arena: the dict's tensors are replaced by their shared copies
        (what the kernel will run on); returns the encoded inputs for a request."""
        encoded = {}
        for name, value in list(inputs.items()):
            inputs[name], encoded[name] = shared.encode(self.torch, value, self.arena.place, f"input {name!r}")
        return encoded

    def slots(self, refs: list) -> tuple[list, list[dict]]:
        """A poisoned slot per tensor output of the reference (None for other outputs)."""
        tensors, descs = [], []
        for _, ref in refs:
            if isinstance(ref, self.torch.Tensor):
                t, d = self.arena.slot(tuple(ref.shape), slot_dtype(self.torch, ref))
                poison(self.torch, t)
            else:  # a non-tensor output travels as JSON; its slot is a placeholder
                t, d = self.arena.slot((0,), self.torch.float64)
            tensors.append(t)
            descs.append(d)
        return tensors, descs

    def outputs(self, items: list[dict], slots: list, inputs: dict, most_elements: int = 0) -> list:
        """The kernel process's account of a call's outputs as (name, value) pairs, values read from
        the judge's own memory (slots, or the OUTPUTS buffers among `inputs`) or, for a timed call on a
        GPU, mapped from the kernel process by IPC handle (at most `most_elements` elements each)."""
        torch = self.torch
        if not isinstance(items, list):
            raise KernelFailure("runtime_error", self.label, "the kernel process gave no list of outputs")
        if items and all(i.get("kind") == "buffer" and "name" not in i for i in items):
            written = [(i.get("input"), self.buffer(i, inputs)) for i in items]
            return written if len(written) != 1 else [(None, written[0][1])]
        got = []
        for k, item in enumerate(items):
            name, kind = item.get("name"), item.get("kind")
            if kind == "value":
                got.append((name, item.get("value")))
            elif kind == "buffer":
                got.append((name, self.buffer(item, inputs)))
            elif kind == "ipc":
                got.append((name, self.mapped(item.get("ipc"), most_elements)))
            elif kind in ("slot", "unfit") and k < len(slots):
                shape = tuple(int(d) for d in item.get("shape") or ())
                got.append((name, slots[k] if kind == "slot" or shape == tuple(slots[k].shape)
                            else torch.empty(shape, device="meta")))
            elif kind in ("slot", "unfit"):  # more outputs than the reference has: counted, never read
                got.append((name, torch.empty((0,), device="meta")))
            else:
                raise KernelFailure("runtime_error", self.label, f"the kernel process reported an output of kind {kind!r}")
        return got

    def buffer(self, item: dict, inputs: dict):
        name = item.get("input")
        if name not in inputs or not isinstance(inputs[name], self.torch.Tensor):
            raise KernelFailure("runtime_error", self.label, f"the kernel process named {name!r} as an output buffer")
        return inputs[name]

    def mapped(self, desc, most_elements: int):
        """A tensor of the kernel process, mapped here by its IPC description (`loop.common.ipc`)."""
        try:
            return ipc.open_tensor(self.torch, desc, most_elements)
        except ipc.BadHandle as exc:
            raise KernelFailure("runtime_error", self.label, f"the kernel process named an output the judge "
                                f"cannot read: {exc}"[:500]) from None
        except RuntimeError as exc:  # CUDA refused the handle
            raise KernelFailure("runtime_error", self.label, f"the kernel process named an output by an IPC handle "
                                f"CUDA could not open: {exc}"[:500]) from None

    def close(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None
