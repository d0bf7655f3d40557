"""The device mesh a distributed run was laid out on, as a dump records it, and the per-dimension
layouts its tensors carry.

A rank's manifest holds ``"mesh": {"shape": [2, 2], "names": ["dp", "tp"], "coordinate": [1, 0],
"data_parallel": ["dp"], "reduce": "mean"}``: the mesh, this rank's place on it, the dimensions
along which the batch is split (data parallelism, FSDP included), and how their gradients are
reduced (``mean``: DDP and FSDP's default, the local loss a mean; ``sum``). The other dimensions are
tensor-parallel: their shards are gathered by layout (:mod:`nbdiff.gather.shards`).

A tensor's layout names one placement per mesh dimension it is laid out over, each optionally
with the dimension's name: ``shard(0)@dp,shard(1)@tp``. ``strided(d,k)`` is a shard of a tensor
already split ``k`` ways along ``d`` by a later dimension (FSDP over a tensor-parallel weight): its
pieces interleave with that dimension's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbdiff.errors import DumpError, OptionError

__all__ = ["Mesh", "Placement", "placements", "JobLayout", "DATA_PARALLEL_NAMES", "PIPELINE_NAMES", "REDUCTIONS"]

REDUCTIONS = ("mean", "sum")
DATA_PARALLEL_NAMES = re.compile(r"^(dp|fsdp|ddp|hsdp|data)(_.*)?$|data_parallel", re.IGNORECASE)
"""Mesh dimension names taken as data-parallel unless the user says otherwise (torchtitan's
``dp_replicate`` and ``dp_shard`` too)."""

PIPELINE_NAMES = re.compile(r"^(pp|pipe|pipeline|stages?)(_.*)?$", re.IGNORECASE)
"""Mesh dimension names of pipeline stages: each rank along one holds other layers."""

_PLACEMENT = re.compile(r"(shard)\((-?\d{1,3})\)|(strided)\((-?\d{1,3}),(\d{1,3})\)|(replicate)|(partial)")
"""One placement as read (an event built in memory may count dimensions from the end)."""
_WRITTEN = _PLACEMENT.pattern.replace("-?", "")
"""One placement as a dump writes it: dimensions counted from 0."""
_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,31}"
LAYOUT = re.compile(rf"(?:{_WRITTEN})(?:@{_NAME})?(?:,(?:{_WRITTEN})(?:@{_NAME})?){{0,7}}")
"""A layout as a dump writes it (the schema's check)."""
_READ = re.compile(rf"(?:{_PLACEMENT.pattern})(?:@{_NAME})?(?:,(?:{_PLACEMENT.pattern})(?:@{_NAME})?){{0,7}}")
_ENTRY = re.compile(rf"(?P<placement>{_PLACEMENT.pattern})(?:@(?P<name>{_NAME}))?")


@dataclass(frozen=True)
class Placement:
    """How one mesh dimension spreads a tensor."""

    kind: str
    """``shard``, ``strided``, ``replicate`` or ``partial``."""
    dim: int = 0
    """The tensor dimension a shard splits."""
    split: int = 1
    """``strided``: how many ways a later mesh dimension splits ``dim`` first."""
    name: str = ""
    """The mesh dimension's name, where the framework gave one."""

    def written(self) -> str:
        """The placement as a layout writes it, with its dimension's name."""
        text = f"strided({self.dim},{self.split})" if self.kind == "strided" else self.text()
        return f"{text}@{self.name}" if self.name else text

    def text(self) -> str:
        """The placement alone, as a shard rule writes it (``shard(d)``, ``replicate``, ``partial``)."""
        return f"shard({self.dim})" if self.kind in ("shard", "strided") else self.kind


def placements(layout: str) -> list[Placement]:
    """The placements of a recorded layout, one per mesh dimension it names (``[]`` for none)."""
    if layout and not _READ.fullmatch(layout):
        raise ValueError(f"not a layout: {layout!r}")
    out = []
    for entry in _ENTRY.finditer(layout):
        m, name = _PLACEMENT.fullmatch(entry["placement"]), entry["name"] or ""
        assert m is not None
        if m.group(1):
            out.append(Placement("shard", int(m.group(2)), 1, name))
        elif m.group(3):
            out.append(Placement("strided", int(m.group(4)), int(m.group(5)), name))
        else:
            out.append(Placement(m.group(6) or m.group(7), 0, 1, name))
    return out


@dataclass(frozen=True)
class Mesh:
    """One rank's mesh, as its manifest holds it."""

    shape: tuple[int, ...]
    names: tuple[str, ...]
    coordinate: tuple[int, ...]
    data_parallel: tuple[str, ...]
    reduce: str = "mean"

    @staticmethod
    def made(
        shape: Sequence[int], names: Sequence[str], coordinate: Sequence[int], data_parallel: Any, reduce: str
    ) -> Mesh:
        """A mesh from what ``record`` was told (an :class:`OptionError` naming the argument)."""
        names = tuple(str(n) for n in names)
        if len(set(names)) != len(names) or not all(re.fullmatch(_NAME, n) for n in names):
            raise OptionError(f"record(mesh=...): dimension names {names} must be distinct identifiers.")
        if data_parallel is None:
            dp = tuple(n for n in names if DATA_PARALLEL_NAMES.search(n))
        else:
            dp = (data_parallel,) if isinstance(data_parallel, str) else tuple(data_parallel)
            unknown = [n for n in dp if n not in names]
            if unknown:
                raise OptionError(f"record(data_parallel={data_parallel!r}): the mesh has no dimension {unknown[0]!r}; its "
                                  f"dimensions are {list(names)}.")  # fmt: skip
        if reduce not in REDUCTIONS:
            raise OptionError(f"record(dp_reduce={reduce!r}): expected one of {REDUCTIONS}.")
        return Mesh(tuple(int(n) for n in shape), names, tuple(int(c) for c in coordinate), dp, reduce)

    @staticmethod
    def of_sizes(sizes: Mapping[str, int], rank: int, world: int, data_parallel: Any, reduce: str) -> Mesh:
        """A mesh given as ``{"dp": 2, "tp": 2}``: ranks laid out row-major (the last dimension's
        ranks adjacent, as torch's ``init_device_mesh`` and paddle's fleet lay them)."""
        shape = [int(n) for n in sizes.values()]
        if any(n < 1 for n in shape) or math.prod(shape) != world:
            raise OptionError(
                f"record(mesh={dict(sizes)}): its {math.prod(shape)} places do not match the job's {world} ranks."
            )
        coordinate, left = [], rank
        for n in reversed(shape):
            coordinate.append(left % n)
            left //= n
        return Mesh.made(shape, list(sizes), coordinate[::-1], data_parallel, reduce)

    def to_json(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape), "names": list(self.names), "coordinate": list(self.coordinate),
            "data_parallel": list(self.data_parallel), "reduce": self.reduce,
        }  # fmt: skip

    @staticmethod
    def from_json(data: Mapping[str, Any], where: str) -> Mesh:
        try:
            mesh = Mesh(
                tuple(int(n) for n in data["shape"]), tuple(str(n) for n in data["names"]),
                tuple(int(c) for c in data["coordinate"]), tuple(str(n) for n in data["data_parallel"]),
                str(data.get("reduce", "mean")),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise DumpError(
                f"{where}: its mesh {dict(data)!r:.200} is not shape, names, coordinate, data_parallel."
            ) from e
        ok = len(mesh.shape) == len(mesh.names) == len(mesh.coordinate) and all(n >= 1 for n in mesh.shape)
        if not ok or not all(0 <= c < n for c, n in zip(mesh.coordinate, mesh.shape)):
            raise DumpError(f"{where}: its mesh {mesh.to_json()} puts the rank outside it (coordinate per dimension).")
        if mesh.reduce not in REDUCTIONS or any(n not in mesh.names for n in mesh.data_parallel):
            raise DumpError(f"{where}: its mesh {mesh.to_json()} names data-parallel dimensions it lacks.")
        return mesh

    @property
    def pipeline(self) -> tuple[str, ...]:
        """The dimensions of pipeline stages."""
        return tuple(n for n in self.names if PIPELINE_NAMES.search(n))

    @property
    def data_parallel_size(self) -> int:
        return math.prod(n for n, name in zip(self.shape, self.names) if name in self.data_parallel)

    def group(self) -> int:
        """This rank's data-parallel index (its data-parallel coordinates, row-major)."""
        return _row_major(self, self.data_parallel)

    def position(self) -> int:
        """This rank's place within its data-parallel group (the other coordinates, row-major)."""
        return _row_major(self, tuple(n for n in self.names if n not in self.data_parallel))

    def split(self, layout: str, where: str) -> tuple[str, list[Placement]]:
        """``layout`` as (the tensor-parallel dimensions' part, as a layout; the data-parallel
        dimensions' placements). A placement names its dimension, or the layout covers every
        dimension in order, or (unnamed, fewer) only the tensor-parallel ones."""
        found = placements(layout)
        if not found:
            return "", []
        tp = [n for n in self.names if n not in self.data_parallel and n not in self.pipeline]
        if all(p.name for p in found):
            stray = [p.name for p in found if p.name not in self.names]
            if stray:
                raise DumpError(f"{where}: laid out over mesh dimension {stray[0]!r}, which the run's mesh "
                                f"{dict(zip(self.names, self.shape))} has not; the dump was written by another job.")  # fmt: skip
            named = found
        elif len(found) == len(self.names):
            named = [Placement(p.kind, p.dim, p.split, n) for p, n in zip(found, self.names)]
        elif len(found) == len(tp):
            named = [Placement(p.kind, p.dim, p.split, n) for p, n in zip(found, tp)]
        else:
            raise DumpError(f"{where}: its layout {layout!r} names {len(found)} placements, but the run's mesh "
                            f"{dict(zip(self.names, self.shape))} has {len(self.names)} dimensions; it cannot be gathered.")  # fmt: skip
        tp_part = [p for p in named if p.name not in self.data_parallel]
        if len(tp_part) > 1:
            raise DumpError(f"{where}: laid out over {len(tp_part)} tensor-parallel dimensions ({layout}); nbdiff "
                            "gathers one tensor-parallel dimension beside the data-parallel ones.")  # fmt: skip
        return (tp_part[0].text() if tp_part else ""), [p for p in named if p.name in self.data_parallel]


def _row_major(mesh: Mesh, names: Sequence[str]) -> int:
    index = 0
    for name in names:
        i = mesh.names.index(name)
        index = index * mesh.shape[i] + mesh.coordinate[i]
    return index


@dataclass(frozen=True)
class JobLayout:
    """What ``record`` was told of the job's layout, checked as it is given."""

    given: Any
    """The mesh: the framework's, ``{name: size}``, or ``None`` (the parameters' own, if any)."""
    data_parallel: Any
    reduce: str
    micro_batches: int
    micro_batch_reduce: str

    def __post_init__(self) -> None:
        m = self.micro_batches
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise OptionError(f"record(micro_batches={m!r}): expected the model's calls per step, 1 or more.")
        if self.micro_batch_reduce not in REDUCTIONS:
            raise OptionError(f"record(micro_batch_reduce={self.micro_batch_reduce!r}): expected one of {REDUCTIONS}.")
        if self.reduce not in REDUCTIONS:
            raise OptionError(f"record(dp_reduce={self.reduce!r}): expected one of {REDUCTIONS}.")

    def mesh(self, fw: Any, model: Any, rank: int, world: int) -> Mesh | None:
        """The mesh the job runs on (given, or the one its parameters lie on); ``None`` for one
        tensor-parallel dimension, which needs none (every rank holds a shard)."""
        if isinstance(self.given, Mapping):
            return Mesh.of_sizes(self.given, rank, world, self.data_parallel, self.reduce)
        facts = fw.mesh_of(self.given, model)
        if facts is None:
            if self.data_parallel is not None:
                raise OptionError(f"record(data_parallel={self.data_parallel!r}) needs the mesh: mesh={{'dp': {world}}}, "
                                  "or the framework's device mesh.")  # fmt: skip
            return None
        mesh = Mesh.made(*facts, self.data_parallel, self.reduce)
        return mesh if self.given is not None or len(mesh.shape) > 1 or mesh.data_parallel else None
