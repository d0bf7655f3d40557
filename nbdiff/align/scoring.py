"""How well one raw call does a base call's job: the score pairing ranks candidates by.

The class counts most, then output shapes, weight shapes and the attribute name; some pairs are never
made whatever they score (outputs that cannot be compared, a wrapper against a bare layer, a router
against a Linear, a weightless call far from where it ran). :mod:`nbdiff.align.pairing` searches with it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from nbdiff.align.typemap import canonical_type, type_affinity
from nbdiff.trace.events import Event, TensorRecord

__all__ = ["score", "unfounded", "same_shapes", "FULL_NAME", "MIN_SCORE", "STRONG"]


def _shapes(e: Event) -> tuple[tuple[int, ...], ...]:
    return tuple(t.shape for t in e.outputs)


def same_shapes(a: Event, b: Event) -> bool:
    sa, sb = _shapes(a), _shapes(b)
    if sa == sb:
        return True
    # A tuple on one side and its first tensor on the other (attention with and without weights),
    # or (1, S, D) against (B, S, D): the main output decides.
    return bool(sa and sb) and _broadcastable(sa[0], sb[0])


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or 1 in (x, y) for x, y in zip(a, b))


def _comparable(a: Event, b: Event) -> bool:
    """Whether the first inputs and main outputs can be compared at all: the same shape, broadcastable,
    or the same number of values (another layout)."""
    for x, y in ((a.outputs, b.outputs), (_floats(a.inputs), _floats(b.inputs))):
        # A container pairs only where its first input and its last output correspond.
        if x and y and not _fits(x[0].shape, y[0].shape):
            return False
    return True


def _fits(sa: tuple[int, ...], sb: tuple[int, ...]) -> bool:
    return sa == sb or _broadcastable(sa, sb) or math.prod(sa) == math.prod(sb)


def _floats(records: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
    return tuple(t for t in records if t.floating)


_CONTAINERS = frozenset({"sequential", "modulelist", "layerlist", "moduledict", "layerdict"})
"""Library classes that only hold other layers: never a user's layer in place of a library one."""


def _container(e: Event) -> bool:
    return e.library and any(canonical_type(n) in _CONTAINERS for n in (e.type_name, *e.bases))


def unfounded(a: Event, j: int, r_seq: list[Event], used: list[bool], cursor: int) -> bool:
    """Whether nothing but the class (and a name) ties ``a`` to ``r_seq[j]``, away from where it ran
    (``j`` is not the ``cursor``): neither holds weights nor has the other's path, and a call that
    holds weights is skipped, or the two take and give other shapes. Such a call pairs where it ran (a
    ReLU after a stem whose changed padding changed every shape), never leaping over work, ahead or
    back: GPT's embedding dropout is not the dropout of the first MLP (named alike), a Dropout after
    an FFN's first Linear is not the one after its second, and stacked experts' one activation of
    every token is not an expert's of its own tokens."""
    b = r_seq[j]
    if a.path == b.path and a.call == b.call:
        return False  # the same path: a port that kept the names, where independent work ran in another order
    leaps = any(r_seq[k].weights and not used[k] for k in range(cursor, j))
    if a.weights and b.weights:
        # Layers holding weights ran in another order (k before q): alike in weights and shapes, they
        # still pair. Only alike in class (an expert's projection against the shared expert's), not.
        return leaps and not (a.weights == b.weights and same_shapes(a, b))
    if a.weights or b.weights:
        return False
    if leaps:
        return True
    if same_shapes(a, b):
        return False
    x, y = _floats(a.inputs), _floats(b.inputs)
    return bool(x and y) and x[0].shape != y[0].shape


def _same_input(a: Event, b: Event) -> bool:
    """Whether both calls were handed the same values (weights copied, upstream agreeing): a
    sample of the first input, so it stays cheap."""
    if not a.inputs or not b.inputs or a.inputs[0].shape != b.inputs[0].shape:
        return False
    x, y = a.inputs[0].value, b.inputs[0].value
    if x is None or y is None or x.dtype.kind != "f" or y.dtype.kind != "f" or not x.size:
        return False
    x, y = x.reshape(-1)[:256].astype(np.float64), y.reshape(-1)[:256].astype(np.float64)
    return bool(np.allclose(x, y, rtol=1e-3, atol=1e-3 * float(np.abs(x).max() or 1.0)))


def score(a: Event, b: Event, kids: dict[int, int] | None = None) -> float:
    """How well ``b`` does ``a``'s job; 0 when it cannot.

    The class counts most, then output shapes, weight shapes and the attribute name. A
    different class is accepted only where the shapes agree (a swapped activation).
    """
    if a.parent is None and b.parent is None and a.depth == 0 and b.depth == 0:
        return 2 * STRONG  # the two models the user handed in
    affinity = type_affinity(a.type_name, a.bases, b.type_name, b.bases)
    holds = kids is not None and (kids.get(id(a), 0) > 0 or kids.get(id(b), 0) > 0)
    if (holds or affinity < 2) and not _comparable(a, b):
        # Outputs that cannot be compared: a wrong pairing (a container against its first child, a
        # layer that concatenates inside itself against one that does not). Two layers of one class
        # stay paired: a changed padding changes every later shape, and blame must name it.
        return 0.0
    if kids is not None and _container(a) and _container(b) and kids.get(id(a), -1) != kids.get(id(b), -1):
        return 0.0  # Sequentials of different lengths hold different work (a flat branch against wrappers)
    if kids is not None and affinity < 3 and (_wrapper_of_leaf(a, b, kids) or _wrapper_of_leaf(b, a, kids)):
        return 0.0
    if _router(a) != _router(b):
        return 0.0  # routing probabilities (a softmax, a top-k) against a Linear's logits: another function
    shapes = same_shapes(a, b)
    same_input = False
    if affinity == 0:
        # A user's own layer in place of a library one (a custom activation, a PyLayer): class
        # names say nothing, so it pairs only by shapes and by where it sits or what it is given.
        if not (shapes and a.outputs) or (a.library and b.library) or _container(a) or _container(b):
            return 0.0
        if a.weights != b.weights:
            return 0.0  # a user's block of layers against one library layer
        same_input = _same_input(a, b)
        # Two user classes, or two blocks that both hold calls (torchvision's ShuffleNet unit against
        # paddle.vision's), pair by shapes; a leaf against a library leaf needs more evidence.
        either = a.library or b.library
        blocks = kids is not None and kids.get(id(a), 0) > 0 and kids.get(id(b), 0) > 0
        if either and not blocks and not same_input and a.path.rsplit(".", 1)[-1] != b.path.rsplit(".", 1)[-1]:
            return 0.0
    if affinity <= 1 and not shapes:
        return 0.0
    score = 4.0 * affinity + (4.0 if shapes else 0.0) + (4.0 if same_input else 0.0)
    if affinity == 0 and holds and shapes:
        score += 2.0  # two blocks that take and give the same shapes: their own calls decide the rest
    if a.weights and b.weights:
        score += 3.0 if a.weights == b.weights else -3.0
    elif a.weights or b.weights:
        score -= 1.0
    if a.path == b.path and a.call == b.call:
        # The same dotted path, same call: a port that kept the names. Worth more than the
        # exact class, so a swapped activation pairs where it is, not with the next of its class.
        score += FULL_NAME
    elif (leaf := a.path.rsplit(".", 1)[-1]) == b.path.rsplit(".", 1)[-1] and not leaf.isdigit():
        # The same attribute name; a Sequential's index says nothing where the nesting differs.
        score += 2.0
    return max(score, 0.1)


def _router(e: Event) -> bool:
    """An MoE router (transformers' ``*TopKRouter``): it holds a Linear's weight (copied as one, see
    :mod:`nbdiff.weights.plan`) but returns routing probabilities, not the Linear's output."""
    return _router_class(e.type_name, e.bases)


@functools.lru_cache(maxsize=4096)  # asked of every candidate pair, of a few classes
def _router_class(name: str, bases: tuple[str, ...]) -> bool:
    return any(n.endswith("Router") for n in (name, *bases))


def _wrapper_of_leaf(a: Event, b: Event, kids: dict[int, int]) -> bool:
    """Whether ``a`` holds calls but no weights of its own, and ``b`` is a call holding none with
    weights: ``a``'s weights are its calls', one of which is ``b``'s counterpart (torchvision's
    ``BasicConv2d``, conv-norm-ReLU, against a bare ``Conv2D``; the names say nothing)."""
    return kids.get(id(a), 0) > 0 and not a.weights and kids.get(id(b), 0) == 0 and bool(b.weights)


FULL_NAME = 10.0
"""Bonus for the same dotted path and call index on both sides."""
MIN_SCORE = 4.0
"""Below this a candidate is not a pair: a related class with nothing else in common."""
STRONG = 12.0
"""A match this good is taken even when the next base event would fit the raw one as well."""
