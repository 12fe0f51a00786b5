"""CUDA tensors a kernel process names to the judge by IPC handle: what a timed call returned, read
by the judge in place, with no copy the kernel process could do the work in. The description is
plain JSON (never a pickle: the judge reads what an untrusted process wrote), checked field by field
before the judge maps anything.

`export` runs in the kernel process; `open_tensor` in the judge, which decides how large a tensor it
agrees to map (`most_elements`)."""

from __future__ import annotations

import base64
import re

_SHM_NAME = re.compile(rb"/[A-Za-z0-9_.\-]{1,200}")


class BadHandle(ValueError):
    """A description the judge refuses to map."""


def export(torch, tensor) -> dict:
    """The IPC description of a CUDA tensor (its storage's handle, its place in the storage)."""
    device, handle, size, offset, counter, counter_offset, event, sync = tensor.untyped_storage()._share_cuda_()
    return {"device": int(device), "handle": _b64(handle), "storage_bytes": int(size), "storage_offset": int(offset),
            "counter": _b64(counter), "counter_offset": int(counter_offset), "event": _b64(event),
            "event_sync": bool(sync), "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
            "stride": list(tensor.stride()), "offset": int(tensor.storage_offset())}


def open_tensor(torch, desc: dict, most_elements: int):
    """The tensor `desc` names, mapped into this process; BadHandle when a field is not what `export`
    writes, the tensor has more than `most_elements` elements, or it does not lie inside its storage."""
    if not isinstance(desc, dict):
        raise BadHandle("an IPC description is not an object")
    ints = {k: desc.get(k) for k in ("device", "storage_bytes", "storage_offset", "counter_offset", "offset")}
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in ints.values()):
        raise BadHandle(f"IPC description with a field that is no count: {ints}")
    if ints["device"] >= torch.cuda.device_count():
        raise BadHandle(f"IPC description names device {ints['device']}")
    dtype = getattr(torch, str(desc.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise BadHandle(f"IPC description with dtype {desc.get('dtype')!r}")
    shape, stride = desc.get("shape"), desc.get("stride")
    if (not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride) or len(shape) > 8
            or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in shape + stride)):
        raise BadHandle(f"IPC description with shape {shape!r} and stride {stride!r}")
    numel = 1
    for s in shape:
        numel *= s
    if numel > most_elements:
        raise BadHandle(f"an output of {numel} elements where at most {most_elements} are expected")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    span = 0 if numel == 0 else (ints["offset"] + sum((s - 1) * st for s, st in zip(shape, stride)) + 1) * itemsize
    if span > ints["storage_bytes"]:
        raise BadHandle(f"an output of {span} bytes in a storage of {ints['storage_bytes']}")
    handle, counter, event = (_unb64(desc.get(k), k) for k in ("handle", "counter", "event"))
    if not handle or not _SHM_NAME.fullmatch(counter or b"/"):
        raise BadHandle("IPC description without a memory handle, or with a counter that names no shared-memory file")
    storage = torch.UntypedStorage._new_shared_cuda(ints["device"], handle, ints["storage_bytes"], ints["storage_offset"],
                                                    counter, ints["counter_offset"], event or None,
                                                    bool(desc.get("event_sync")))
    return torch.empty(0, dtype=dtype, device=f"cuda:{ints['device']}").set_(storage, ints["offset"], shape, stride)


def _b64(raw) -> str | None:
    return None if raw is None else base64.b64encode(bytes(raw)).decode()


def _unb64(text, name: str) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str) or len(text) > 4096:
        raise BadHandle(f"IPC description with a {name} that is no handle")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise BadHandle(f"IPC description with a {name} that is no handle") from None
