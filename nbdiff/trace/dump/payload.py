"""One step's safetensors payload, written array by array while the step still runs.

A safetensors file is an 8-byte header length, a JSON header naming each tensor's dtype,
shape and byte range, then the bytes. The header is only known once the step's events are,
so the bytes go first, after room left for it; the header, padded with spaces (which the
format allows), goes into that room at the end. A header that does not fit, an array
whose type safetensors has no name for, or a failed write: the step is written whole,
as before, from the arrays its events still hold.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

from nbdiff.trace.spool import pwrite_all

__all__ = ["PayloadFile", "header_room"]

_DTYPES = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64", np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32",
    np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL", np.dtype(np.complex64): "C64",
}  # fmt: skip
_KEPT_SHARE = 0.75
"""A file whose kept arrays are less of its bytes is written again, compactly (a partial
gradient sum, replaced by the full one, or tensors copied for a layer no event shows)."""
_FIRST_ROOM = 16 << 10
"""Header room of a recording's first step: about 150 tensors; later steps size theirs by the last one."""


def header_room(last_header: int | None) -> int:
    """Bytes to leave for the next step's header, given the size of the last one (steps repeat)."""
    return _FIRST_ROOM if last_header is None else max(4096, last_header + last_header // 4 + 1024)


class PayloadFile:
    """``path``, written as arrays arrive (:meth:`add`) and closed by :meth:`finish` with the names
    the step's JSON gives them. Arrays added are held until then (their ids are the index)."""

    def __init__(self, path: Path, room: int) -> None:
        self.path, self.room = path, room
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._end = 0  # bytes of data written, after the room
        self._placed: dict[int, tuple[np.ndarray, int, int]] = {}  # id -> (array, begin, end)
        self.header_size: int | None = None
        """Bytes of the step's header, once :meth:`finish` has worked it out (room or not)."""

    def add(self, a: np.ndarray) -> None:
        """Write ``a``'s bytes now (C order); a type with no safetensors name waits for :meth:`finish`."""
        if self._fd is None or id(a) in self._placed or _dtype_name(a) is None:
            return
        try:
            self._append(a)
        except OSError:
            self._abandon()  # finish writes the step whole, and reports what goes wrong then

    def finish(self, named: dict[str, np.ndarray]) -> None:
        """Close the file as a safetensors payload holding ``named`` (key -> array). Written whole
        instead when its header outgrew the room, or when most of its bytes are of arrays the
        step did not keep."""
        try:
            if self._fd is not None and all(_dtype_name(a) is not None for a in named.values()):
                for a in named.values():
                    if id(a) not in self._placed:
                        self._append(a)
                header = self._header(named)
                self.header_size = len(header)
                kept = sum(a.nbytes for a in {id(a): a for a in named.values()}.values())
                if len(header) <= self.room - 8 and kept >= self._end * _KEPT_SHARE:
                    header += b" " * (self.room - 8 - len(header))
                    pwrite_all(self._fd, memoryview(struct.pack("<Q", len(header)) + header), 0)
                    return
        except OSError:
            pass
        finally:
            self._abandon()
        from safetensors.numpy import save_file

        save_file({k: np.require(a, requirements="C") for k, a in named.items()}, str(self.path))

    def discard(self) -> None:
        """Remove the file: its step was never written."""
        self._abandon()
        self.path.unlink(missing_ok=True)

    def _append(self, a: np.ndarray) -> None:
        c = np.ascontiguousarray(a)
        begin = self._end
        pwrite_all(self._fd, memoryview(c.reshape(-1)).cast("B"), self.room + begin)  # type: ignore[arg-type]
        self._end += c.nbytes
        self._placed[id(a)] = (a, begin, self._end)

    def _header(self, named: dict[str, np.ndarray]) -> bytes:
        header: dict[str, dict[str, object]] = {}
        used = set()
        for key, a in named.items():
            _, begin, end = self._placed[id(a)]
            used.add(id(a))
            header[key] = {"dtype": _dtype_name(a), "shape": list(a.shape), "data_offsets": [begin, end]}
        # The format allows no gap between tensors: bytes written for an array the step did not
        # keep (a partial gradient sum, an integer tensor filtered out) are named, as bytes.
        for i, (_, begin, end) in enumerate(v for k, v in self._placed.items() if k not in used):
            header[f"unused.{i}"] = {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}
        return json.dumps(header, separators=(",", ":")).encode()

    def _abandon(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._placed.clear()


def _dtype_name(a: np.ndarray) -> str | None:
    return _DTYPES.get(a.dtype) if a.dtype.isnative and sys.byteorder == "little" else None
