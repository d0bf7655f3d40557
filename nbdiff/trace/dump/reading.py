"""Reading a dump's files, which are untrusted input: only regular files, opened once without
following a link and without blocking (a FIFO in place of a payload hung ``compare``); a payload's
claimed sizes checked against the file and the memory at hand before anything is allocated;
names with control characters escaped as they are read (an ESC or a newline in a layer name
reached the terminal, or forged a line of the report)."""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.trace.dump.payload import _DTYPES

__all__ = ["read_text", "read_payload", "printable", "available_memory"]

_NUMPY = {name: dtype.newbyteorder("<") for dtype, name in _DTYPES.items()}
_SAFETENSORS_ONLY = {
    "BF16": np.dtype("u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "C128": np.dtype("c16"),
}
"""Types nbdiff does not write itself (a payload written whole by safetensors): sized here, read by it."""
_MAX_DIM = 2**62
"""A dimension at or beyond this is no tensor a file holds (numpy refuses such a shape even when empty)."""
_MAX_HEADER = 100 << 20
"""A payload header longer than this is not one nbdiff wrote (one step's tensors take kilobytes)."""


def printable(text: str) -> str:
    """``text`` with each non-printable character (ESC, BEL, a newline, U+2028) written as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _printable_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {printable(k): _printable_value(v) for k, v in pairs}


def _printable_value(v: Any) -> Any:
    if isinstance(v, str):
        return printable(v)
    if isinstance(v, list):
        return [_printable_value(x) for x in v]
    return v  # objects were cleaned by the hook already


def _open(path: Path, follow: bool = True) -> int:
    """A descriptor of ``path``, refused unless it is a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if not follow and exc.errno == 40:  # ELOOP: the last component is a link
            raise DumpError(
                f"{path}: is a link; nbdiff reads a dump's payloads only as the files in its folder."
            ) from None
        raise DumpError(f"{path}: cannot be read ({exc.strerror or exc}; check its permissions).") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DumpError(f"{path}: is not a regular file (a pipe, a device or a folder); a dump holds files only.")
    return fd


def read_text(path: Path) -> str:
    """The text of a regular file."""
    fd = _open(path)
    with os.fdopen(fd, "rb") as f:
        return f.read().decode()


def load_json(text: str) -> Any:
    """JSON with every string (keys too) made printable."""
    if text.isascii() and "\\" not in text and "\x7f" not in text:
        # Each string is then printable already: JSON refuses a raw control character in one, and
        # without a backslash none is escaped in (nbdiff writes ASCII: a name in another script is).
        # Checking each string cost a third of reading a statistics dump.
        return json.loads(text)
    return _printable_value(json.loads(text, object_pairs_hook=_printable_pairs))


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``), or ``None`` where not told."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _what(step: int | str) -> str:
    return f"step {step}'s tensors" if isinstance(step, int) else step


def read_payload(path: Path, step: int | str) -> dict[str, np.ndarray]:
    """The arrays of a safetensors payload, its header checked first: offsets inside the file and
    adding up, and no more bytes than memory holds (a sparse 16 GiB file claimed them honestly).
    ``step``: the dump step whose payload it is, or what it is, for the errors ("the saved tensors")."""
    fd = _open(path, follow=False)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise DumpError(
                f"{path}: cannot read {_what(step)}: the payload is {size} bytes, too short for a safetensors header."
            )
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise DumpError(
                f"{path}: cannot read {_what(step)}: the payload claims a {n}-byte header in a {size}-byte file."
            )
        raw_header = os.pread(fd, n, 8)
        header = _header(raw_header, path, step)
        begin = 8 + n
        data = size - begin
        ends = [e["data_offsets"][1] for e in header.values()]
        if max(ends, default=0) != data:
            raise DumpError(
                f"{path}: cannot read {_what(step)}: its header describes {max(ends, default=0)} bytes of data, the file holds {data}."
            )
        free = available_memory()
        if free is not None and data > free:
            raise DumpError(
                f"{path}: cannot read {_what(step)}: they are {data / 2**30:.1f} GiB, more than the "
                f"{free / 2**30:.1f} GiB of memory available; compare on a larger machine, or record fewer "
                "tensors (dump_type='statistics', tensors=[...])."
            )
        buffer = bytearray(data)
        view, got = memoryview(buffer), 0
        while got < data:
            k = os.preadv(fd, [view[got:]], begin + got)
            if k <= 0:
                raise DumpError(
                    f"{path}: cannot read {_what(step)}: the file ended early (read {got} of {data} bytes)."
                )
            got += k
    finally:
        os.close(fd)
    if any(e["dtype"] not in _NUMPY for e in header.values()):
        from safetensors.numpy import load

        return load(bytes(head) + raw_header + bytes(buffer))
    return {key: _array(buffer, e) for key, e in header.items() if not key.startswith("unused.")}


def _header(raw: bytes, path: Path, step: int | str) -> dict[str, dict[str, Any]]:
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise DumpError(
            f"{path}: cannot read {_what(step)}: the header is not valid JSON; the file was edited."
        ) from None
    if not isinstance(header, dict):
        raise DumpError(f"{path}: cannot read {_what(step)}: the header is not a JSON object.")
    header.pop("__metadata__", None)
    spans = []
    for key, e in header.items():
        try:
            dtype = _NUMPY.get(e["dtype"]) or _SAFETENSORS_ONLY[e["dtype"]]
            shape = [int(x) for x in e["shape"]]
            lo, hi = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise DumpError(
                f"{path}: cannot read {_what(step)}: entry {printable(str(key))!r} is malformed or of a type nbdiff does not write."
            ) from None
        # Exact (Python integers): numpy's int64 product of [2**32, 2**32] wrapped to 0, which an empty
        # span matched, and np.empty then raised a bare ValueError.
        count = math.prod(shape)
        if (
            min(shape, default=0) < 0
            or max(shape, default=0) >= _MAX_DIM
            or lo < 0
            or hi - lo != count * dtype.itemsize
        ):
            raise DumpError(
                f"{path}: cannot read {_what(step)}: entry {printable(str(key))!r}: its offsets do not fit its shape."
            )
        e["_dtype"], e["_shape"], e["_span"] = dtype, shape, (lo, hi)
        spans.append((lo, hi))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        raise DumpError(f"{path}: cannot read {_what(step)}: entries overlap; the file was edited.")
    return header


def _array(buffer: bytearray, e: dict[str, Any]) -> np.ndarray:
    lo, hi = e["_span"]
    if hi == lo:
        return np.empty(e["_shape"], e["_dtype"])
    return np.frombuffer(buffer, e["_dtype"], (hi - lo) // e["_dtype"].itemsize, lo).reshape(e["_shape"])
