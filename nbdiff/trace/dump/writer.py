"""Writing a dump (the format is :mod:`nbdiff.trace.dump.store`'s): step by step, by a writer thread.

Nothing of a written step stays in memory: a crash or ``kill -9`` loses at most the step in
progress and the one being written. Each step's JSON is written atomically, after its payload.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.trace.capture import amplifies
from nbdiff.trace.dump.codec import (
    event_json,
    write_json_atomic,
)
from nbdiff.trace.dump.payload import PayloadFile, header_room
from nbdiff.trace.dump.store import DUMP_TYPES, FORMAT, MANIFEST, VERSION
from nbdiff.trace.events import Event
from nbdiff.trace.origin.cells import cells_of
from nbdiff.trace.stats import Stats, tensor_stats

__all__ = ["DumpWriter", "write_rank"]

_LOCK = ".nbdiff-writing"
"""Held by the recording writing a rank folder: the process id of its writer."""


def _lock(folder: Path) -> Path:
    """Take the folder for this writer, or say who has it (a lock left by a killed writer is taken over)."""
    path = folder / _LOCK
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and _alive(holder):
                raise DumpError(
                    f"{folder}: another recording (process {holder}) is writing this folder; record into another "
                    f"folder, or wait for it to end (if none runs, delete {path})."
                ) from None
            path.unlink(missing_ok=True)  # its writer was killed
            continue
        except OSError as exc:
            raise DumpError(f"{folder}: cannot write a dump here ({exc.strerror or exc}).") from None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return path
    raise DumpError(f"{folder}: could not take the folder for this recording; record into another folder.")


def _holder(path: Path) -> int | None:
    try:
        text = path.read_text()[:32]
    except OSError:
        return None
    return int(text) if text.strip().isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class DumpWriter:
    """Writes one rank's dump step by step: the manifest first, each step's files as it completes,
    the manifest again (marked complete) at the end.

    With ``background`` (the default) a writer thread computes the statistics and writes each
    step while the training code runs the next one; ``add_step`` waits only when the step before
    is still being written, so at most two steps are held and one is unwritten. ``close`` waits
    for the last one. Arrays given to :meth:`prepare` as they are recorded get their
    statistics then, on the writer thread, and in ``tensor`` dumps their bytes go to the step's
    payload (:class:`~nbdiff.trace.dump.payload.PayloadFile`), so the last step's wait is mostly its JSON. A failed
    write is raised, as a :class:`~nbdiff.errors.DumpError` naming the step, by the next
    ``add_step`` or by ``close``.
    """

    def __init__(
        self,
        rank_dir: str | os.PathLike[str],
        meta: dict[str, Any],
        layers: dict[str, list[str]],
        dump_type: str,
        overwrite: bool = False,
        background: bool = True,
    ) -> None:
        if dump_type not in DUMP_TYPES:
            raise DumpError(f"dump_type={dump_type!r} is not one of {DUMP_TYPES}.")
        self.path = Path(rank_dir)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            old = [p for p in self.path.iterdir() if _is_dump_file(p.name)]
        except OSError as exc:
            raise DumpError(f"{self.path}: cannot write a dump here ({exc.strerror or exc}).") from None
        if old and not overwrite:
            raise DumpError(
                f"{self.path} already holds an nbdiff dump. A new recording is never mixed with an old one: "
                "record into a new folder, or pass overwrite=True to replace it."
            )
        self._lock: Path | None = _lock(self.path)  # one writer per folder: two would mix their steps
        try:
            # The manifest first: a writer killed while deleting leaves step files without one (said as a
            # recording cut off), never the old manifest over a few of its steps (said as an edited dump).
            for p in sorted(old, key=lambda p: p.name != MANIFEST):
                p.unlink()
            self._start(meta, layers, dump_type, background)
        except BaseException:
            self._release()
            raise

    def _start(self, meta: dict[str, Any], layers: dict[str, list[str]], dump_type: str, background: bool) -> None:
        self.meta, self.layers, self.dump_type = meta, layers, dump_type
        self.keeps_values: Callable[[Event], bool] | None = None
        """In a ``tensor`` dump, the events whose values are written (``None``: all; the rest keep statistics)."""
        self.steps = 0
        self._last: dict[str, Any] | None = None
        self._files: set[str] = set()
        """Files the steps' frames point into: its notebook cells go into the manifest (trace/origin/cells)."""
        self._write_manifest(complete=False)
        self._failure: tuple[int, BaseException] | None = None
        self._ahead: dict[int, tuple[np.ndarray, Stats]] = {}
        """``id`` of an array -> (the array, held; its statistics), computed before its step came."""
        self._payload: PayloadFile | None = None
        """The next step's payload, written as its arrays come (``tensor`` dumps)."""
        self._last_header: int | None = None
        self._queue: queue.SimpleQueue[np.ndarray | tuple[int, list[Event]] | None] | None = None
        self._written = 0
        self._done = threading.Condition()
        if background:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, name="nbdiff-dump-writer", daemon=True)
            self._thread.start()

    def prepare(self, a: np.ndarray) -> None:
        """Work on ``a``, an array of the step being recorded, now, on the writer thread: its
        statistics, and in ``tensor`` dumps its bytes (``a`` is never written to again)."""
        if self._queue is not None and self.dump_type != "stack":
            self._queue.put(a)

    def add_step(self, events: list[Event]) -> None:
        if self._queue is not None:
            # The step before must be on disk first: a queue alone let one step wait behind the one
            # being written, and a kill then lost three steps (under load, every step written so far).
            with self._done:
                self._done.wait_for(lambda: self._written == self.steps)
        self._raise_failure()
        k, self.steps = self.steps, self.steps + 1
        if self._queue is None:
            self._write_step(k, events)
        else:
            self._queue.put((k, events))

    def abandon(self, release: bool = True) -> None:
        """Wait for the steps queued, and end the writer thread (the manifest stays as it is);
        ``release``: let another writer have the folder."""
        if release:
            self._release()
        if self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = None
        if self._payload is not None:  # arrays of a step that never came
            self._payload.discard()
            self._payload = None

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:  # type: ignore[union-attr]
            if isinstance(item, np.ndarray):
                self._prepare(item)
                continue
            if self._failure is None:
                try:
                    self._write_step(*item)
                except BaseException as exc:  # raised in the user's thread, by add_step or close
                    self._failure = (item[0], exc)
            # Every array queued before this step was one of its own (or an earlier step's).
            self._ahead.clear()
            if self._payload is not None:  # not taken by the step: its write failed
                self._payload.discard()
                self._payload = None
            with self._done:
                self._written += 1
                self._done.notify()

    def _prepare(self, a: np.ndarray) -> None:
        """Work on an array of the step being recorded: its statistics, and its bytes for the payload."""
        try:
            self._ahead[id(a)] = (a, tensor_stats(a))
            if self.dump_type == "tensor" and self._failure is None:
                if self._payload is None:  # arrays queued before a step's item are that step's own
                    room = header_room(self._last_header)
                    self._payload = PayloadFile(self.path / f"step{self._written}.safetensors", room)
                self._payload.add(a)
        except Exception:  # noqa: S110 - the step's own write does it again, and reports what fails
            pass

    def _raise_failure(self) -> None:
        if self._failure is not None:
            k, exc = self._failure
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise DumpError(f"{self.path}: writing step {k} failed ({detail}).") from exc

    def _write_step(self, k: int, events: list[Event]) -> None:
        from safetensors.numpy import save_file

        payload: dict[str, np.ndarray] = {}
        # The arrays in ``_ahead`` are held, so their ids are not another array's.
        seen: dict[int, Stats | None] = {i: st for i, (_, st) in self._ahead.items()}
        keys: dict[int, str] = {}
        samples: dict[int, dict[str, str] | None] = {}
        keep_values, keep_stats = self.dump_type == "tensor", self.dump_type != "stack"
        kept = self.keeps_values or (lambda e: True)
        # A statistics dump keeps the few values a BatchNorm amplifies the rounding of, for compare to recompute.
        ev_json = [
            event_json(
                e, payload, (keep_values and kept(e)) or (keep_stats and amplifies(e)), keep_stats, seen, keys, samples
            )
            for e in events
        ]
        file = f"step{k}.safetensors" if payload else None
        ahead, self._payload = self._payload, None
        if ahead is not None and ahead.path.name != file:
            ahead.discard()
            ahead = None
        if ahead is not None:
            ahead.finish(payload)
            self._last_header = ahead.header_size or self._last_header
        elif file is not None:
            save_file(payload, str(self.path / file))
        self._files.update(f.filename for e in events for f in e.stack)
        number = events[0].step if events else k  # the training step, where a recording keeps some
        self._last = {"step": k, "number": number, "payload": file, "events": ev_json, "complete": True}
        write_json_atomic(self.path / f"step{k}.json", self._last)  # after its payload: never a dangling name

    def close(self, interrupted: bool = False) -> Path:
        """The final manifest, once every step is written. ``interrupted``: an exception cut the
        last step short."""
        try:
            self.abandon(release=False)
            self._raise_failure()
            if interrupted and self._last is not None:
                self._last["complete"] = False
                write_json_atomic(self.path / f"step{self._last['step']}.json", self._last)
            self._last = None
            cells = cells_of(self._files)  # read back elsewhere, a cell's frame has its label and source
            if cells:
                self.meta["cells"] = cells
            self._write_manifest(complete=True)
        finally:
            self._release()
        return self.path

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
            self._lock = None

    def _write_manifest(self, complete: bool) -> None:
        manifest = {"format": FORMAT, "version": VERSION, **self.meta, "dump_type": self.dump_type}
        manifest.update(complete=complete, layers=self.layers, steps=self.steps if complete else None)
        try:
            write_json_atomic(self.path / MANIFEST, manifest)
        except OSError as exc:  # a full disk, a folder made read-only: say where
            raise DumpError(f"{self.path / MANIFEST}: cannot be written ({exc.strerror or exc}).") from None


def _is_dump_file(name: str) -> bool:
    # A JSON file being written is ``<name>.<12 hex>.tmp`` (write_json_atomic); older dumps left ``<name>.tmp``.
    if name.endswith(".tmp"):
        json_name = re.sub(r"\.[0-9a-f]{12}$", "", name[: -len(".tmp")])
        return json_name == MANIFEST or (json_name.startswith("step") and json_name.endswith(".json"))
    return name == MANIFEST or (name.startswith("step") and name.endswith((".safetensors", ".json")))


def write_rank(
    rank_dir: str | os.PathLike[str],
    meta: dict[str, Any],
    layers: dict[str, list[str]],
    steps: list[list[Event]],
    dump_type: str,
) -> Path:
    """Write one rank's manifest and payloads (payload files first, the manifest last)."""
    writer = DumpWriter(rank_dir, meta, layers, dump_type)
    for events in steps:
        writer.add_step(events)
    return writer.close()
