"""A result's recorded tensors moved from memory to a file once they are large.

A result keeps every tensor it compared, so that the view can show any of them: about
what both models' activations and gradients take (+200 MiB for the benchmark
transformer), held for as long as the result lives, and a notebook keeps every result
in ``Out``. Above a size, the tensors still in memory go to a :class:`~nbdiff.trace.spool.Spool`
file (those a check spooled while it ran are there already) and each value becomes a
read-only view of its map: the same array to every reader (view, plots, ``save``), read
from disk only when looked at, its pages the operating system's to drop. The file is
unlinked as soon as it is made: the maps keep it readable, and the disk space comes back
when the result is gone, however the process ends. A thread does the move, so the check
returns without waiting for the disk."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Iterator

import numpy as np

from nbdiff.judge.blame import EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.result import DiffResult
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.spool import Spool, in_file, spoolable

__all__ = ["SPILL_ABOVE_MIB", "spilled", "spill_tensors", "event_tensors", "wait_for_spills"]

SPILL_ABOVE_MIB = 64.0
"""Default: a result whose tensors take more than this many MiB keeps them on disk."""


def spilled(result: DiffResult, above_mib: float | None) -> DiffResult:
    """``result``, its tensors moved to disk when they take more than ``above_mib`` MiB.

    The move runs in a thread, so the result is back at once; each value is either the array
    or its map, equal, whenever it is read. A failed write leaves the values in memory and warns.
    """
    chosen = _choose(event_tensors(result.events, result.unmatched_base + result.unmatched_raw), above_mib)
    if chosen is not None:
        _pending[:] = [t for t in _pending if t.is_alive()]
        # The comparisons that passed keep arrays for their deferred metrics: they move too.
        comparisons = [t for d in result.events for t in d.tensors]
        # Not a daemon: a script that ends right after the check waits for the move (a daemon thread
        # stopped inside the write at exit aborted the process: "FATAL: exception not rethrown").
        args = (*chosen, comparisons)
        thread = threading.Thread(target=_move_or_warn, args=args, name="nbdiff-spill", daemon=False)
        _pending.append(thread)
        thread.start()
    return result


def wait_for_spills() -> None:
    """Wait until every move started so far has finished."""
    while _pending:
        _pending.pop().join()


def _move_or_warn(
    arrays: dict[int, np.ndarray], holders: dict[int, list[TensorRecord]], comparisons: list[TensorDiff]
) -> None:
    why = _move(arrays, holders, None, comparisons)
    if why is not None:
        warnings.warn(f"nbdiff: {why}.", RuntimeWarning, stacklevel=1)


_pending: list[threading.Thread] = []


def event_tensors(events: Iterable[EventDiff], extra: Iterable[Event] = ()) -> Iterator[TensorRecord]:
    """Every tensor record a result holds, both sides, with its values."""
    for d in events:
        yield from _records(d.base)
        yield from _records(d.raw)
        yield from (t for t in d.evidence if t.value is not None)
    for e in extra:
        yield from _records(e)


def _records(e: Event) -> Iterator[TensorRecord]:
    for t in (*e.inputs, *e.outputs, *e.params, *e.given):
        if t.value is not None:
            yield t


def spill_tensors(records: Iterable[TensorRecord], above_mib: float | None, folder: str | None = None) -> str | None:
    """Move the values of ``records`` to a file when they take more than ``above_mib`` MiB, now.

    Records sharing an array share its map. Returns why nothing was moved when a write
    failed (the values stay in memory), else ``None``.
    """
    chosen = _choose(records, above_mib)
    return None if chosen is None else _move(*chosen, folder)


def _choose(
    records: Iterable[TensorRecord], above_mib: float | None
) -> tuple[dict[int, np.ndarray], dict[int, list[TensorRecord]]] | None:
    """The arrays to move and the records holding each, or ``None`` when they stay."""
    if above_mib is None:
        return None
    records = list(records)
    # Sized first, each array once: most results stay in memory, and this reads every record.
    arrays: dict[int, np.ndarray] = {}
    for t in records:
        arrays[id(t.value)] = t.value
    # The Spool's own rule: small arrays stay, a map costs a page.
    movable = {k: a for k, a in arrays.items() if spoolable(a) and not in_file(a)}
    if sum(a.nbytes for a in movable.values()) <= above_mib * 2**20:
        return None
    holders: dict[int, list[TensorRecord]] = {}
    for t in records:
        if id(t.value) in movable:
            holders.setdefault(id(t.value), []).append(t)
    return movable, holders


def _move(
    arrays: dict[int, np.ndarray],
    holders: dict[int, list[TensorRecord]],
    folder: str | None,
    comparisons: Iterable[TensorDiff] = (),
) -> str | None:
    spool = Spool(0, folder)  # the file a check's recording goes to past its limit, here for all of them
    maps = {}
    try:
        for key, a in arrays.items():
            maps[key] = spool.keep(a)
            if spool.failure:
                return f"the result's tensors stay in memory: {spool.failure}"
        for key, records in holders.items():
            for t in records:
                object.__setattr__(t, "value", maps[key])  # frozen: every holder of the record sees the map
        written: list[np.ndarray] = []
        for c in comparisons:
            c.rebind_arrays(lambda x: _from_file(x, maps, spool, written))
    finally:
        spool.close()
    return None


def _from_file(
    x: np.ndarray, maps: dict[int, np.ndarray], spool: Spool, written: list[np.ndarray] | None = None
) -> np.ndarray:
    """``x``'s values read from the file: the map of a moved array, the same view of a moved array's
    map, or (an array of the comparison's own: a layout converted, a dtype widened) a map of its own,
    added to ``maps``. ``written`` then holds ``x``: once its comparison lets go of it, its id could
    be another array's, and ``maps`` would hand that one ``x``'s values."""
    if in_file(x) or not spoolable(x):
        return x
    if id(x) in maps:
        return maps[id(x)]
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    mapped = maps.get(id(root))
    if mapped is not None and root.flags.c_contiguous:  # laid out in the map as in memory
        offset = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return np.ndarray(x.shape, x.dtype, buffer=mapped, offset=offset, strides=x.strides)
    if spool.failure:
        return x
    y = maps[id(x)] = spool.keep(x)
    if written is not None:
        written.append(x)
    return y if in_file(y) else x
