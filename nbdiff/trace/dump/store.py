"""The dump format: a JSON manifest plus one safetensors payload per step, per rank.

::

    dump_dir/
      rank0/
        manifest.json        format, framework, model, rank, options, layers; "complete" once closed
        step0.json           step 0's events + statistics (+ sampled values) + stacks
        step0.safetensors    tensor payloads of step 0 (a statistics dump: few-valued BatchNorms' only)
        step1.json
        step1.safetensors

Every reference inside is relative, so a dump can be moved or copied anywhere. A step's
JSON is written atomically after its payload (:mod:`nbdiff.trace.dump.writer`): a manifest
without ``"complete": true`` says the recording did not close, and a step cut short by an
exception is marked as such.
(Version 1 dumps, with every step inline in the manifest, are still read.)
Nothing is pickled, and reading never unpickles: JSON and safetensors only. A
truncated or hand-edited dump raises :class:`~nbdiff.errors.DumpError` naming the
file and what is wrong with it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.errors import DumpError
from nbdiff.trace.dump.codec import (
    event_from_json,
    load_dump_json,
)
from nbdiff.trace.dump.reading import read_payload
from nbdiff.trace.dump.schema import payload_path, validate_manifest, validate_step
from nbdiff.trace.events import Event
from nbdiff.trace.origin.cells import remember_cells

__all__ = ["FORMAT", "VERSION", "MANIFEST", "DUMP_TYPES", "RankDump", "read_dump", "rank_dirs", "manifest_of"]

FORMAT = "nbdiff-dump"
VERSION = 2
READS = (1, 2)
MANIFEST = "manifest.json"
DUMP_TYPES = ("tensor", "statistics", "stack")


@dataclass(frozen=True)
class RankDump:
    """What one rank of one model recorded."""

    path: Path
    meta: dict[str, Any]
    """Framework, version, model, rank, world size and the recording options."""
    layers: dict[str, list[str]]
    """Layer path to its class names, most specific first (for weight layout rules)."""
    steps: Sequence[list[Event]]
    """Per step: forward, then backward, then optimizer events (read on access when lazy)."""
    incomplete: frozenset[int] = frozenset()
    """Steps cut short (an exception in the user's code): never compared as agreement."""

    @property
    def closed(self) -> bool:
        """Whether the recording ended cleanly (``False`` after a crash or kill)."""
        return bool(self.meta.get("complete", True))

    @property
    def framework(self) -> str:
        return str(self.meta["framework"])


def rank_dirs(dump_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """``{rank: folder}`` of a dump (a folder with ``rank*/manifest.json``, or one rank's folder)."""
    root = Path(dump_dir)
    if (root / MANIFEST).is_file():
        return {int(_manifest(root)["rank"]): root}
    found: dict[int, Path] = {}
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            if not sub.name.startswith("rank") or not (sub / MANIFEST).is_file():
                continue
            if sub.is_symlink():
                raise DumpError(
                    f"{sub}: a link; nbdiff does not follow links inside a dump (a payload could be swapped). "
                    "Copy the rank folder in instead."
                )
            # The rank is the manifest's; the folder's name must say the same (rank0 and rank00 were one
            # rank, and rankfoo replaced rank2).
            rank = _manifest(sub)["rank"]
            if sub.name != f"rank{rank}":
                raise DumpError(f"{sub}: holds the dump of rank {rank}, so it must be named rank{rank}; rename it.")
            found[rank] = sub
    if not found:
        for folder in (root, *sorted(root.glob("rank*"))):
            _refuse_cut_off(folder)
        raise DumpError(f"{root}: no nbdiff dump here (expected rank*/{MANIFEST}, written by nbdiff.record).")
    return found


def _refuse_cut_off(folder: Path) -> None:
    """Step files without a manifest: a writer killed as it began, or while it deleted an older dump
    (the manifest goes first), not a dump anyone edited."""
    if folder.is_dir() and not (folder / MANIFEST).exists() and any(folder.glob("step*.json")):
        raise DumpError(
            f"{folder}: step files without a {MANIFEST}: a recording into it was cut off (killed) as it began, or "
            "while it replaced an older dump there, so neither is whole. Record again (overwrite=True)."
        )


def manifest_of(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """One rank folder's manifest, checked."""
    return _manifest(Path(folder))


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    _refuse_cut_off(folder)
    data = load_dump_json(path, "an nbdiff manifest")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DumpError(f'{path}: not an nbdiff dump manifest (no "format": "{FORMAT}").')
    if data.get("version") not in READS:
        raise DumpError(f"{path}: format version {data.get('version')!r}; this nbdiff reads versions {READS}.")
    for key in ("framework", "model", "rank", "steps", "dump_type"):
        if key not in data:
            raise DumpError(f"{path}: the manifest has no {key!r} field; the dump was edited or truncated.")
    validate_manifest(data, path)
    remember_cells(data.get("cells"), str(path))
    return data


def _step_entries(folder: Path, data: dict[str, Any], keep: bool = True) -> list[tuple[dict[str, Any], Path, str]]:
    """``(step entry, file it came from, key prefix)`` for every step, inline (version 1) or in files.

    Every step file is read and checked; with ``keep=False`` only its ``complete`` flag is kept, so
    that checking a long dump holds one step at a time."""
    if data["version"] == 1:
        return [(step, folder / MANIFEST, f"steps[{k}]") for k, step in enumerate(data["steps"])]
    entries = []
    while (folder / f"step{len(entries)}.json").is_file():
        path = folder / f"step{len(entries)}.json"
        step = load_dump_json(path, "an nbdiff step")
        validate_step(step, path)
        entries.append((step if keep else {"complete": step.get("complete")}, path, "the step"))
    if data["steps"] is not None and data["steps"] != len(entries):
        raise DumpError(
            f"{folder / MANIFEST}: says {data['steps']} steps, but {folder} holds {len(entries)} step files "
            "(step0.json, step1.json, ...); the dump was edited or is incomplete."
        )
    return entries


def read_dump(rank_dir: str | os.PathLike[str], lazy: bool = False) -> RankDump:
    """Read one rank's folder back into events, checking it as it goes.

    ``lazy``: every file is checked now, but a step's events and tensors are read only when
    that step is asked for, and not kept: comparing many steps holds one at a time.
    """
    folder = Path(rank_dir)
    data = _manifest(folder)
    entries = _step_entries(folder, data, keep=not lazy)
    meta = {k: v for k, v in data.items() if k not in ("steps", "layers")}
    incomplete = frozenset(k for k, (s, _, _) in enumerate(entries) if s.get("complete") is False)
    steps: Sequence[list[Event]]
    if lazy:
        inline = data["version"] == 1  # version 1 keeps its steps in the manifest, already in memory
        steps = _StepFiles(folder, [(s if inline else None, where, key) for s, where, key in entries])
    else:
        steps = [_load_step(folder, step, where, key, k) for k, (step, where, key) in enumerate(entries)]
    return RankDump(folder, meta, dict(data.get("layers", {})), steps, incomplete)


class _StepFiles(Sequence[list[Event]]):
    """The steps of a dump, each read from its files when asked for."""

    def __init__(self, folder: Path, entries: list[tuple[dict[str, Any] | None, Path, str]]) -> None:
        self._folder, self._entries = folder, entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, k: int) -> list[Event]:  # type: ignore[override]
        step, where, key = self._entries[k]
        if step is None:
            step = load_dump_json(where, "an nbdiff step")
            validate_step(step, where)
        return _load_step(self._folder, step, where, key, k)


def _load_step(folder: Path, step: dict[str, Any], where: Path, key: str, k: int) -> list[Event]:
    from safetensors import SafetensorError

    payload: dict[str, np.ndarray] = {}
    if step.get("payload"):
        file = payload_path(folder, step["payload"], f"{key}.payload", where)
        try:
            payload = read_payload(file, k)
        except (FileNotFoundError, SafetensorError, OSError) as exc:
            raise DumpError(f"{file}: cannot read step {k}'s tensors ({exc}).") from None
    try:
        # "number": the training step it was (a recording that keeps some steps); else its place.
        return [event_from_json(e, int(step.get("number", k)), payload, where) for e in step["events"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise DumpError(f"{where}: step {k} has a malformed event ({exc!r}); the dump was edited.") from None
