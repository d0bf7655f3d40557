"""What a recording holds: tensors, events and traces, as frozen dataclasses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

import numpy as np

from nbdiff.trace.origin.stack import Frame
from nbdiff.trace.stats import Stats, tensor_stats

__all__ = ["Phase", "Kind", "TensorRecord", "Event", "Trace", "changed", "new_event", "dtype_name"]

R = TypeVar("R")


class Phase(str, Enum):
    """Where in a training step an event happens."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    STATE = "state"
    """Running statistics (BatchNorm means and variances) after a training step."""
    WEIGHTS = "weights"
    """A layer's parameters and buffers as a step began (tensor dumps, at the first step of each run
    of recorded steps): what ``compare`` rebuilds a layer with to measure its local error."""


class Kind(str, Enum):
    """What produced an event."""

    LAYER = "layer"
    """A sublayer call (forward) or its gradient (backward)."""
    LOSS = "loss"
    """The loss value of a step."""
    PARAM = "param"
    """One parameter's update by the optimizer."""
    INPUT = "input"
    """The inputs the two models were given (compared before any layer)."""
    API = "api"
    """A framework function called by a layer's own code (``F.gelu``, ``x @ w``): API-level tracing."""


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of an event, with its values on the host."""

    name: str
    """Where the tensor sits in the event, e.g. ``out[0]``, ``in.x``, ``grad.weight``."""
    shape: tuple[int, ...]
    """Shape as the framework reports it."""
    dtype: str
    """Framework dtype name, e.g. ``float32``."""
    value: np.ndarray | None = field(repr=False, compare=False)
    """The values (float32 for bfloat16 sources); ``None`` when only statistics were kept."""
    stats: Stats | None = field(default=None, compare=False)
    """Summary statistics, when read from a dump (computed from ``value`` otherwise)."""
    layout: str = ""
    """How a tensor-parallel run spread it over its ranks, where the framework said so
    (``shard(d)``, ``replicate``, ``partial``); ``value`` and ``shape`` are this rank's own."""
    sample: np.ndarray | None = field(default=None, repr=False, compare=False)
    """A statistics dump's values at :func:`~nbdiff.trace.stats.sample_positions` of its size
    (activations and their gradients; ``None`` elsewhere and where the values were kept)."""

    @property
    def data(self) -> np.ndarray:
        """The values; for live recordings, which always keep them (a statistics-only dump does not)."""
        if self.value is None:
            raise ValueError(f"tensor {self.name!r} {self.shape} was kept as statistics only")
        return self.value

    @property
    def floating(self) -> bool:
        """Whether it holds floating values (``float32``, ``bfloat16``, ``paddle.float16``, complex)."""
        return "float" in self.dtype or self.dtype.startswith("complex")

    def statistics(self) -> Stats | None:
        return self.stats if self.stats is not None else (tensor_stats(self.value) if self.value is not None else None)


@dataclass(frozen=True)
class Event:
    """One recorded call or update."""

    step: int
    """Training step index, from 0."""
    phase: Phase
    """Forward, backward or optimizer."""
    kind: Kind
    """Layer call, loss or parameter update."""
    order: int
    """Position in the model's execution order within ``(step, phase)``."""
    path: str
    """Stable dotted path of the layer (``""`` is the root), or of the parameter."""
    type_name: str
    """Class name of the layer (or ``Parameter``/``Loss``)."""
    call: int
    """Which call of this path within the step (0 for the first)."""
    depth: int
    """Nesting depth of the call: 0 for the root model."""
    parent: int | None
    """``order`` of the enclosing layer call's event in the same phase, if any."""
    library: bool
    """Whether the layer class comes from the framework itself (not user code)."""
    inputs: tuple[TensorRecord, ...]
    """Forward: tensors passed in. Backward: gradients flowing back out of the inputs.
    Optimizer: parameter value before the step."""
    outputs: tuple[TensorRecord, ...]
    """Forward: tensors returned. Backward: gradients arriving at the outputs.
    Optimizer: the update (after minus before)."""
    params: tuple[TensorRecord, ...] = ()
    """Backward: gradients of the layer's own parameters, by parameter name. Optimizer: the parameters
    written outside the optimizer after it stepped, before the next step began (clipping, an EMA),
    each a scalar: its norm after the write over its norm as the optimizer left it."""
    args: tuple[str, ...] = ()
    """Reprs of the non-tensor arguments."""
    stack: tuple[Frame, ...] = ()
    """User-code frames of the call, innermost first."""
    template: Any = field(default=None, repr=False, compare=False)
    """Forward: the ``(args, kwargs)`` structure with tensor placeholders, for replay."""
    layer: Any = field(default=None, repr=False, compare=False)
    """The layer object itself (not saved to disk), for local replay."""
    rank: int = 0
    """Distributed rank that recorded the event (0 outside distributed jobs)."""
    bases: tuple[str, ...] = ()
    """Framework classes the layer's class derives from, most specific first (``LayerNorm``
    for a library's ``GPTLayerNorm(paddle.nn.LayerNorm)``), for pairing."""
    given: tuple[TensorRecord, ...] = ()
    """Single-step forward: the inputs raw's own code computed, where base's were fed instead
    (named as in ``inputs``). Compared with base's inputs, they show the code between layers."""
    weights: tuple[tuple[int, ...], ...] = ()
    """Shapes of the layer's own parameters, each sorted (layouts may be transposed), for pairing."""

    def tensor(self, name: str) -> TensorRecord | None:
        """The tensor named ``name`` among the outputs, inputs and parameters, in that order."""
        return next((t for ts in (self.outputs, self.inputs, self.params) for t in ts if t.name == name), None)

    @property
    def key(self) -> tuple[int, str, str, int]:
        """Identity of the call across phases: ``(step, kind, path, call)``."""
        return (self.step, self.kind.value, self.path, self.call)


_EVENT_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Event) if f.default is not dataclasses.MISSING
}  # what new_event sets a field it is not given to


@dataclass(frozen=True)
class Trace:
    """Everything recorded from one model."""

    framework: str
    """Adapter name, ``torch`` or ``paddle``."""
    model_name: str
    """Class name of the root model."""
    events: tuple[Event, ...]
    """All events, grouped by step then phase, each in execution order."""

    def select(self, step: int, phase: Phase) -> list[Event]:
        """Events of one step and phase, in order."""
        return [e for e in self.events if e.step == step and e.phase == phase]


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(a: Any) -> str:
    """``str(a.dtype)`` of a numpy array (``"float32"``), remembered per dtype: numpy's own takes 3 µs,
    asked of every parameter gradient a comparison pairs."""
    name = _DTYPE_NAMES.get(a.dtype)
    if name is None:
        name = _DTYPE_NAMES[a.dtype] = str(a.dtype)
    return name


def new_event(**values: Any) -> Event:
    """An :class:`Event` of these field values (the rest their defaults), made without the frozen
    dataclass's ``__init__``, which sets every one of its 21 fields through ``object.__setattr__``
    (2.5 µs against 1.0): a recorded step makes an event per layer call and side, each step."""
    event = object.__new__(Event)
    state = event.__dict__
    state.update(_EVENT_DEFAULTS)
    state.update(values)
    return event


def changed(record: R, **fields: Any) -> R:
    """A copy of the dataclass ``record`` with ``fields`` set: ``dataclasses.replace`` without
    running ``__init__`` again over every field (18 µs for an :class:`Event`; a recorded step
    makes dozens of these copies)."""
    new = object.__new__(type(record))
    state = new.__dict__
    state.update(record.__dict__)
    for name, value in fields.items():
        if name not in state:
            raise TypeError(f"{type(record).__name__} has no field {name!r}")
        state[name] = value
    return new
