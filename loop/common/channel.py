"""The judge and the kernel process talk over a pair of pipes, one JSON object per line: the judge
asks (`{"op": ...}`), the kernel process answers once per request. Nothing but JSON crosses from the
kernel process to the judge (never a pickle: the judge must not run anything the kernel's process
made). The pipes are the kernel process's own file descriptors, not its stdout, which kernel code
may print to."""

from __future__ import annotations

import json
import os

MAX_LINE = 64 * 2**20  # bytes; a longer answer is a broken protocol, not data


class ChannelClosed(Exception):
    """The other side closed its end (it exited or died)."""


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self._r = os.fdopen(read_fd, "rb", buffering=0)
        self._w = os.fdopen(write_fd, "wb", buffering=0)
        self._buf = b""

    def send(self, message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()
        try:
            self._w.write(data)
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None

    def receive(self) -> dict:
        while b"\n" not in self._buf:
            chunk = self._r.read(1 << 20)
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            self._buf += chunk
            if len(self._buf) > MAX_LINE:
                raise ValueError(f"a message longer than {MAX_LINE} bytes")
        line, self._buf = self._buf.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"a message that is not an object: {line[:200]!r}")
        return message

    def close(self) -> None:
        for fh in (self._r, self._w):
            try:
                fh.close()
            except OSError:
                pass
