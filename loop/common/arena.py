"""Memory the judge and the kernel process both see, so that what the kernel writes is judged where
the kernel's code never ran, without copying tensors through files.

The judge owns every byte: it allocates an `Arena` (one block of device memory, or on the CPU one
memory-mapped file), places the inputs and the output slots in it, and sends the kernel process
the arena's handle (`Arena.handle`: a CUDA IPC handle, or the file's path) and each tensor's place
in it (`describe`: offset, dtype, shape, stride). The kernel process opens the arena once
(`open_arena`) and views the tensors in place (`view`). Strides are kept, so a non-contiguous input
reaches the kernel as the spec made it.

On the CPU the file's name lives only until every kernel process has opened it: the judge hands out
memory only after each kernel process answered its `open` (`Bridge.fit`), so the arena's first use
removes the name, and the memory lives on in the mappings alone, gone with the last process that maps
it, however it ends. A name left by a judge killed in between carries its pid (`tileloop-arena-<pid>-`);
`sweep` removes the names of judges no longer alive (every tileloop command and every new arena run it).

Descriptors are plain JSON. Values that are not tensors (sizes, flags, dtypes, tuples of them)
travel as JSON too (`encode` / `decode`); anything else is refused (the spec's inputs must be data).
"""

from __future__ import annotations

import base64
import os
import pickle
import tempfile
import uuid
from pathlib import Path

from loop.common.errors import SpecError
from loop.common.files import remove_dead

ALIGN = 256  # bytes; what CUDA allocations give, so every dtype and vectorised access is aligned
PREFIX = "tileloop-arena-"  # then the pid of the judge that made the file, a dash, the arena's id


def default_folder() -> Path:
    """Where a CPU arena's file is made: shared memory where the system has it, else the temporary folder."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def sweep(folder: Path | None = None) -> list[Path]:
    """Remove the arena files whose judge is no longer alive (killed before its kernel processes had
    opened them); returns what was removed. The files of live judges, and any file this user cannot
    remove, stay."""
    return remove_dead(Path(folder or default_folder()), PREFIX, lambda path: path.unlink())


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def span_bytes(tensor) -> int:
    """Bytes from a tensor's first element to just past its last, by its sizes and strides."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def tensor_bytes(values) -> int:
    """Arena bytes needed to place every tensor among `values` (a dict's values or a list)."""
    items = values.values() if isinstance(values, dict) else values
    return sum(_align(span_bytes(v)) for v in items if hasattr(v, "stride"))


class Arena:
    """A block of memory shared with the kernel process, handed out front to back."""

    def __init__(self, torch, device: str, nbytes: int, folder: Path | None = None):
        self.torch, self.device = torch, device
        self.nbytes = max(_align(nbytes), ALIGN)
        self.id = uuid.uuid4().hex[:12]
        self.path: Path | None = None
        if device == "cuda":
            self.block = torch.empty(self.nbytes, dtype=torch.uint8, device="cuda")
        else:
            where = Path(folder or default_folder())
            sweep(where)
            self.path = where / f"{PREFIX}{os.getpid()}-{self.id}"
            with open(self.path, "wb") as fh:
                fh.truncate(self.nbytes)
            self.block = torch.from_file(str(self.path), shared=True, size=self.nbytes, dtype=torch.uint8)
        self.used = 0
        self.unnamed = False

    @property
    def handle(self) -> dict:
        """What the kernel process needs to open this arena."""
        if self.path is not None:
            return {"id": self.id, "device": "cpu", "nbytes": self.nbytes, "path": str(self.path)}
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(self.block)
        blob = base64.b64encode(pickle.dumps((rebuild, args))).decode()
        return {"id": self.id, "device": "cuda", "nbytes": self.nbytes, "cuda_ipc": blob}

    def reset(self) -> None:
        self._unname()
        self.used = 0

    def _unname(self) -> None:
        """Remove the file's name once every kernel process has opened the arena (its first use; see
        the module's docstring): nothing of it outlives the processes that map it."""
        if self.path is not None and not self.unnamed:
            self.path.unlink(missing_ok=True)
            self.unnamed = True

    def fits(self, nbytes: int) -> bool:
        return self.used + _align(nbytes) <= self.nbytes

    def empty_strided(self, shape, stride, dtype):
        """A tensor of this arena with the given shape, stride and dtype (contents undefined)."""
        self._unname()
        probe = self.torch.empty(0, dtype=dtype)
        n = 0 if 0 in shape else (sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * probe.element_size()
        if not self.fits(n):
            raise MemoryError(f"arena of {self.nbytes} bytes is full ({self.used} used, {n} asked)")
        offset = self.used
        self.used += _align(n)
        raw = self.block[offset:offset + max(n, 0)]
        flat = raw.view(dtype) if n else self.torch.empty(0, dtype=dtype, device=self.block.device)
        return flat.as_strided(tuple(shape), tuple(stride)), offset

    def place(self, tensor):
        """A copy of `tensor` in this arena, with its strides; returns (the copy, its descriptor)."""
        copy, offset = self.empty_strided(tensor.shape, tensor.stride(), tensor.dtype)
        copy.copy_(tensor)
        return copy, self._describe(copy, offset)

    def slot(self, shape, dtype):
        """A contiguous tensor of this arena to receive an output; returns (it, its descriptor)."""
        stride = self.torch.empty(tuple(shape), dtype=dtype, device="meta").stride()
        tensor, offset = self.empty_strided(tuple(shape), stride, dtype)
        return tensor, self._describe(tensor, offset)

    def _describe(self, tensor, offset: int) -> dict:
        return {"arena": self.id, "offset": offset, "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape), "stride": list(tensor.stride())}

    def close(self) -> None:
        self.block = None
        self._unname()


def open_arena(torch, handle: dict):
    """In the kernel process: the arena's bytes as a uint8 tensor on its device."""
    if handle["device"] == "cpu":
        return torch.from_file(handle["path"], shared=True, size=int(handle["nbytes"]), dtype=torch.uint8)
    rebuild, args = pickle.loads(base64.b64decode(handle["cuda_ipc"]))  # from the judge, which the kernel process trusts
    return rebuild(*args)


def view(torch, arenas: dict, desc: dict):
    """The tensor a descriptor names, viewed in place in its (opened) arena."""
    dtype = getattr(torch, desc["dtype"])
    block = arenas[desc["arena"]]
    shape, stride = tuple(desc["shape"]), tuple(desc["stride"])
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = 0 if 0 in shape else (sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * itemsize
    if n == 0:
        return torch.empty(shape, dtype=dtype, device=block.device)
    return block[desc["offset"]:desc["offset"] + n].view(dtype).as_strided(shape, stride)


def encode(torch, value, place, where: str):
    """An input value as it reaches the kernel process: (the value as the judge keeps it, its JSON).
    A tensor goes through `place(tensor) -> (copy, descriptor)`, plain values stay as they are,
    dtypes travel by name, tuples and lists element by element. Anything else is a SpecError."""
    if isinstance(value, torch.Tensor):
        copy, desc = place(value)
        return copy, {"tensor": desc}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value, {"value": value}
    if isinstance(value, torch.dtype):
        return value, {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, (tuple, list)):
        pairs = [encode(torch, v, place, f"{where}[{i}]") for i, v in enumerate(value)]
        kept = [p[0] for p in pairs]
        return (tuple(kept) if isinstance(value, tuple) else kept), {"seq": [p[1] for p in pairs],
                                                                      "tuple": isinstance(value, tuple)}
    raise SpecError(f"make_inputs gave {where} of type {type(value).__name__}: tileloop hands the kernel process "
                    "tensors, numbers, strings, dtypes and tuples or lists of them only")


def decode(torch, arenas: dict, enc: dict):
    """The value `encode` described, tensors viewed in place."""
    if "tensor" in enc:
        return view(torch, arenas, enc["tensor"])
    if "dtype" in enc:
        return getattr(torch, enc["dtype"])
    if "seq" in enc:
        items = [decode(torch, arenas, e) for e in enc["seq"]]
        return tuple(items) if enc.get("tuple") else items
    return enc["value"]
