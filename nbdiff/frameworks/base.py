"""The small interface every framework adapter implements.

The rest of nbdiff talks to torch and paddle only through this Protocol, so the
core stays framework-free and is tested with plain numpy.
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Framework",
    "Handle",
    "LAYER_LIKE",
    "like_names",
    "framework_class_names",
    "own_entries",
    "plain_attr",
    "spread_around",
    "cores",
]

LAYER_LIKE: dict[str, str] = {
    # Third-party layer classes that compute what a framework class computes (qualified class
    # name -> the framework class), so pairing treats them as that class. Data: add entries.
    "transformers.pytorch_utils.Conv1D": "Linear",  # GPT-2's x @ W + b, W stored [in, out]
}


def like_names(layer: Any) -> list[str]:
    """Framework classes that ``layer``'s class stands for, by :data:`LAYER_LIKE`."""
    names = (f"{c.__module__}.{c.__qualname__}" for c in type(layer).__mro__)
    return [LAYER_LIKE[n] for n in names if n in LAYER_LIKE]


_CLASS_NAMES: dict[tuple[str, int], weakref.WeakKeyDictionary[type, tuple[str, ...]]] = {}
"""Per framework package (and size of :data:`LAYER_LIKE`, which users extend), each layer class's
names: read from the class alone, once, not for every layer call (the MRO walked with each class's
qualified name: events, dropout and pairing all ask)."""


def framework_class_names(package: str, layer: Any) -> list[str]:
    """Names of ``layer``'s classes from ``package`` (``"torch."``), most specific first, then the
    framework classes it stands for (:func:`like_names`)."""
    key = (package, len(LAYER_LIKE))
    known = _CLASS_NAMES.get(key)
    if known is None:  # not setdefault: its default, a new WeakKeyDictionary, was made at every call
        known = _CLASS_NAMES[key] = weakref.WeakKeyDictionary()
    cls = type(layer)
    found = known.get(cls)
    if found is None:
        own = [c.__name__ for c in cls.__mro__ if c.__module__.startswith(package)]
        found = known[cls] = tuple(own + like_names(layer))
    return list(found)


def plain_attr(layer: Any, name: str, default: Any = None) -> Any:
    """A plain attribute of a layer (not a parameter, buffer or sublayer), read without the layer
    class's ``__getattr__``: torch's and paddle's look through those dicts and then raise, 1.6 to
    1.8 µs for a name the layer does not have (against 0.1), asked of every layer call."""
    found = getattr(layer, "__dict__", {})
    if name in found:
        return found[name]
    if hasattr(type(layer), name):  # a class attribute or a property: found without __getattr__
        return getattr(layer, name, default)
    return default


def own_entries(entries: dict[str, Any]) -> list[tuple[str, Any]]:
    """A layer's own parameters (or buffers) from the dict the framework keeps them in: unset
    ones (``None``) left out, one held under two names listed once, as the framework's
    ``named_parameters`` lists them. Read directly: a plan, a state and a step's events ask this of
    every layer several times, and the public walk costs 1 to 3 µs a layer against 0.4."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for name, t in entries.items():
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


@functools.cache
def cores() -> int:
    """CPU cores this process may run on (read once: asked for every tensor a statistics dump records)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def spread_around(flat: Any, mean: float) -> float:
    """The sum of ``(x - mean)**2`` over a framework's flat float32 or float64 tensor, taken around
    the mean rounded to its dtype and corrected for that rounding, as
    :func:`nbdiff.trace.stats.tensor_stats` does: what :meth:`Framework.reduced` hands back."""
    around = float((np.float32 if str(flat.dtype).endswith("float32") else np.float64)(mean))
    shift = mean - around
    return float(((flat - around) ** 2).sum()) - math.prod(flat.shape) * shift * shift


class Handle(Protocol):
    """Anything with ``remove()``: a hook registration."""

    def remove(self) -> None: ...


@runtime_checkable
class Framework(Protocol):
    """Operations nbdiff needs from a deep-learning framework."""

    name: str
    """Short stable name: ``"torch"`` or ``"paddle"``."""
    version: str
    """The framework's own version string."""
    source_roots: tuple[str, ...]
    """Directories whose frames are hidden from user stacks."""

    def owns(self, obj: Any) -> bool: ...
    def is_layer(self, obj: Any) -> bool: ...
    def is_layer_class(self, cls: Any) -> bool: ...
    def is_tensor(self, obj: Any) -> bool: ...
    def is_optimizer(self, obj: Any) -> bool: ...

    def named_layers(self, model: Any) -> list[tuple[str, Any]]: ...
    def children(self, layer: Any) -> list[tuple[str, Any]]: ...
    def direct_params(self, layer: Any) -> list[tuple[str, Any]]: ...
    def direct_buffers(self, layer: Any) -> list[tuple[str, Any]]: ...
    def constant_buffers(self, layer: Any) -> set[str]:
        """Names of the layer's non-persistent buffers: constants its ``__init__`` computes
        (rotary ``inv_freq``, ``position_ids``), never saved, so never copied."""
        ...

    def is_trainable(self, param: Any) -> bool: ...
    def is_library_layer(self, layer: Any) -> bool: ...
    def class_names(self, layer: Any) -> list[str]: ...

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """The tensor's values; may share memory with it, so copy a value the framework will overwrite."""
        ...

    def from_numpy(self, array: np.ndarray, requires_grad: bool = False, device: Any = None) -> Any:
        """A tensor of ``array``'s values, on ``device`` (one :meth:`device_of` gave; ``None``: the host)."""
        ...

    def drop_forward_hooks(self, model: Any) -> None:
        """Every forward hook off ``model`` and its sublayers: a copy nbdiff runs on its own (the pairing
        probe) must not run the user's hooks, which run exactly as often as the user's code calls."""
        ...

    def device_of(self, obj: Any) -> Any:
        """Where a tensor, or a layer's first parameter or buffer, lies; ``None`` for the host (or no tensor):
        values nbdiff hands a model (base's inputs, gradients) must lie where its own do."""
        ...

    def set_value(self, tensor: Any, array: np.ndarray) -> None: ...
    def grad_of(self, param: Any) -> Any | None: ...
    def dtype_name(self, tensor: Any) -> str: ...
    def shape_of(self, tensor: Any) -> tuple[int, ...]:
        """Shape of the values this process holds (a tensor-parallel shard's own, not the whole's)."""
        ...

    def layout_of(self, tensor: Any) -> str:
        """How a distributed tensor is laid out over the ranks, as the framework says it
        (``shard(1)``, ``replicate``, ``partial``; several mesh dimensions comma-separated, each
        ``@name`` where the mesh names it; :mod:`nbdiff.trace.mesh`); ``""`` for a plain tensor,
        whose layout the framework does not say."""
        return ""

    def requires_grad(self, tensor: Any) -> bool: ...
    def is_floating(self, tensor: Any) -> bool: ...
    def has_values(self, tensor: Any) -> bool:
        """Whether the tensor holds values (a torch ``meta`` tensor holds none)."""
        return True

    def unhookable(self, layer: Any) -> str | None:
        """Why nbdiff cannot record the layer's calls through hooks (a compiled forward), with the fix."""
        return None

    def detach(self, tensor: Any) -> Any: ...
    def tensor_version(self, tensor: Any) -> int: ...
    def gradient_alias_key(self, grad: Any) -> Hashable | None:
        """Equal for two gradients a hook is handed when they are the same memory, read the
        same way and unwritten since (the version counter their views share); ``None`` where the
        framework writes into a handed gradient without counting it (paddle adds contributions)."""
        ...

    whole_gradients: bool
    """Whether a tensor's gradient hook is handed the whole gradient once (torch), not each
    contribution in turn (paddle)."""

    def reduced(
        self, tensor: Any, positions: np.ndarray
    ) -> tuple[list[float], np.ndarray, Callable[[float], float]] | None:
        """A float32/float64 tensor summarised by the framework itself (its threads, its device; no
        copy of the whole): ``[min, max, sum, sum of squares, sum of |x|]``, its flat values at
        ``positions``, and a function giving the sum of ``(x - m)**2`` for a mean ``m``. ``None`` for
        any other tensor (another dtype, empty, a distributed one): the caller copies it instead."""
        return None

    def prefers_reducing(self, tensor: Any) -> bool:
        """Whether :meth:`reduced` costs a recording less than copying the tensor for the writer's
        thread to reduce: on an accelerator (no copy of the whole to the host), or on a CPU whose
        every core the framework's threads take (the writer would compete with them for one)."""
        return False

    def cores_taken(self, tensor: Any) -> bool:
        """Whether the framework's own threads take every core while it computes with ``tensor`` (on a
        CPU, as many threads as cores): a thread of nbdiff's working beside them only slows both."""
        return False

    def identity(self, tensor: Any, copy: bool = False) -> Any: ...
    def with_value(self, tensor: Any, value: Any) -> Any: ...

    def hook_forward(self, layer: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> list[Handle]: ...
    def hook_tensor(self, tensor: Any, fn: Callable[[Any], Any]) -> Handle: ...
    def remove_tensor_hooks(self, handles: Sequence[Handle]) -> None:
        """Remove gradient hooks, including ones an in-place op already dropped."""

    def distributed_rank(self) -> tuple[int, int] | None:
        """``(rank, world size)`` when a distributed job is initialised, else ``None``."""
        ...

    def framework_probe(self) -> bool:
        """Whether the model is being called by the framework to learn its shapes, not by the
        user's step (torch's pipeline stages run once on empty tensors before the first step)."""
        return False

    def mesh_of(self, mesh: Any, model: Any) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]] | None:
        """``(shape, dimension names, this rank's coordinate)`` of the framework's device mesh
        ``mesh`` or, where ``mesh`` is ``None``, of the named mesh ``model``'s distributed
        parameters lie on; ``None`` where there is none."""
        return None

    def api_tracing(self, callback: Any) -> AbstractContextManager[Any]:
        """While active, ``callback(name, args, kwargs, output)`` follows each framework API call."""
        ...

    def no_grad(self) -> AbstractContextManager[Any]: ...
    def sequence(self, layers: Sequence[Any]) -> Any:
        """A layer calling ``layers`` one after another (each on the last one's output): a group of calls
        one layer of the other side does (a norm then its activation), to run again as that one does."""
        ...

    def optimizer_steps(
        self, callback: Callable[[Any], None], after: Callable[[Any], None] | None = None
    ) -> AbstractContextManager[Any]:
        """Report each optimizer whose ``step`` runs while the block does (to read its settings);
        ``after``: once that step has run (to see what it left)."""
        ...

    def grad_enabled(self) -> bool: ...
    def seed(self, seed: int) -> None: ...
    def rng_state(self) -> Any: ...
    def layer_internals(self) -> frozenset[str]: ...
    def set_rng_state(self, state: Any) -> None: ...
    def backward(self, loss: Any) -> None: ...
    def grad(self, outputs: Sequence[Any], inputs: Sequence[Any], grad_outputs: Sequence[Any]) -> list[Any | None]: ...
    def weighted_mean_of(self, tensors: Sequence[Any], weights: np.ndarray) -> Any: ...
    def optimizer_step(self, optimizer: Any) -> None: ...
    def zero_grad(self, model: Any, optimizer: Any | None) -> None: ...

    def is_training(self, layer: Any) -> bool: ...
    def set_training(self, layer: Any, training: bool) -> None: ...
    def dropout_attrs(self, layer: Any) -> Iterator[str]: ...
