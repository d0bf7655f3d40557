"""API-level events: the framework functions a layer's own code calls (``F.gelu``, ``x @ w``).

Layer hooks cannot see inside a ``forward``; these events can. Interception itself is
framework-specific (torch: a ``TorchFunctionMode``; paddle: wrappers installed on a
table of public functions and Tensor methods), in the adapters; this module holds
the framework-neutral parts: op names, the equivalence table, custom ops, and the
alignment of two sequences of calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbdiff.frameworks.patching import ApiCallback, patched
from nbdiff.trace.events import Event

__all__ = [
    "canonical_op",
    "register_api",
    "CUSTOM_APIS",
    "CUSTOM_TARGETS",
    "align_calls",
    "patched",
    "OP_ALIASES",
    "SKIPPED_OPS",
    "ApiCallback",
]

OP_ALIASES: dict[str, str] = {
    # torch or paddle name -> the name both are compared under (data, not code)
    "mm": "matmul", "bmm": "matmul", "matmul": "matmul", "rmatmul": "matmul",
    "add": "add", "radd": "add", "iadd": "add", "sub": "subtract", "rsub": "subtract", "subtract": "subtract",
    "mul": "multiply", "rmul": "multiply", "multiply": "multiply", "div": "divide", "truediv": "divide",
    "rtruediv": "divide", "divide": "divide", "true_divide": "divide", "pow": "pow", "rpow": "pow",
    "neg": "neg", "negative": "neg", "cat": "concat", "concat": "concat", "concatenate": "concat",
    "permute": "transpose", "transpose": "transpose", "view": "reshape", "reshape": "reshape",
    "softmax": "softmax", "log_softmax": "log_softmax", "layer_norm": "layer_norm", "batch_norm": "batch_norm",
    "clone": "assign", "assign": "assign", "sum": "sum", "mean": "mean", "amax": "max", "max": "max",
    "amin": "min", "min": "min", "sqrt": "sqrt", "rsqrt": "rsqrt", "exp": "exp", "log": "log",
    "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu",
    "scaled_dot_product_attention": "scaled_dot_product_attention", "linear": "linear", "conv2d": "conv2d",
    "dropout": "dropout", "embedding": "embedding", "getitem": "slice", "unsqueeze": "unsqueeze",
    "squeeze": "squeeze", "expand": "expand", "broadcast_to": "expand", "split": "split", "chunk": "split",
}  # fmt: skip
"""Operator names of both frameworks mapped to one comparison name."""

SKIPPED_OPS = frozenset(
    {
        "size", "dim", "numel", "shape", "dtype", "device", "is_floating_point", "requires_grad_", "detach",
        "detach_", "item", "tolist", "numpy", "cpu", "cuda", "to", "contiguous", "type", "data_ptr", "stride",
        "register_hook", "retain_grad", "backward", "grad", "format", "repr", "len", "bool", "float", "int",
        "get", "set_", "copy_", "zero_", "fill_", "uniform_", "normal_", "is_contiguous", "element_size",
        "setitem", "iter", "hash", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "invert",
    }
)  # fmt: skip
"""Calls that are bookkeeping, not computation: never recorded."""

CUSTOM_APIS: dict[str, str] = {}
"""Custom ops registered with :func:`register_api`, name -> comparison name."""


def canonical_op(name: str) -> str:
    """The comparison name of an op: dunder and in-place markers removed, then the table."""
    bare = name.strip("_")
    if bare.endswith("_") and bare[:-1] in OP_ALIASES:
        bare = bare[:-1]
    bare = bare.lstrip("i") if bare.startswith("i") and bare[1:] in ("add", "sub", "mul", "truediv") else bare
    return CUSTOM_APIS.get(bare) or OP_ALIASES.get(bare, bare)


CUSTOM_TARGETS: list[tuple[Any, str, str]] = []
"""``(owner, attribute, op name)`` of custom ops to intercept while tracing."""


def register_api(name: str, same_as: str | None = None, *, target: tuple[Any, str] | None = None) -> None:
    """Teach API-level tracing about a custom op.

    ``same_as`` pairs it with the other side's op (``register_api("fused_gelu", "gelu")``).
    ``target=(module_or_class, "attribute")`` also intercepts that function while
    tracing, for ops the framework does not dispatch through its own API (C++
    extension functions, custom kernels)::

        nbdiff.register_api("fused_gelu", "gelu", target=(my_ops, "fused_gelu"))
    """
    bare = name.strip("_")
    CUSTOM_APIS[bare] = same_as or bare
    if target is not None:
        owner, attr = target
        if not callable(getattr(owner, attr, None)):
            from nbdiff.errors import OptionError

            raise OptionError(f"register_api: {owner!r} has no function {attr!r} to intercept.")
        CUSTOM_TARGETS.append((owner, attr, bare))


def _shapes(e: Event) -> tuple[tuple[int, ...], ...]:
    return tuple(t.shape for t in e.outputs)


def _score(a: Event, b: Event) -> int:
    same_name = canonical_op(a.type_name) == canonical_op(b.type_name)
    same_shape = _shapes(a) == _shapes(b)
    if same_name:
        return 3 if same_shape else 2
    return 1 if same_shape and a.outputs else 0


def align_calls(base: Sequence[Event], raw: Sequence[Event], max_cells: int = 2_000_000) -> list[tuple[Event, Event]]:
    """Pair two sequences of API calls: most total similarity, order kept (sequence alignment).

    Same op and output shapes score 3, same op 2, same output shapes only (a swapped
    activation) 1; a pair that shares nothing is never made. Quadratic, so very long
    sequences are aligned greedily instead.
    """
    n, m = len(base), len(raw)
    if not n or not m:
        return []
    if n * m > max_cells:
        return _greedy(base, raw)
    score = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, nxt = score[i], score[i + 1]
        for j in range(m - 1, -1, -1):
            s = _score(base[i], raw[j])
            best = max(nxt[j], row[j + 1])
            if s and nxt[j + 1] + s > best:
                best = nxt[j + 1] + s
            row[j] = best
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        s = _score(base[i], raw[j])
        if s and score[i][j] == score[i + 1][j + 1] + s:
            pairs.append((base[i], raw[j]))
            i, j = i + 1, j + 1
        elif score[i][j] == score[i + 1][j]:
            i += 1
        else:
            j += 1
    return pairs


def _greedy(base: Sequence[Event], raw: Sequence[Event], lookahead: int = 16) -> list[tuple[Event, Event]]:
    pairs, j = [], 0
    for a in base:
        for k in range(j, min(len(raw), j + lookahead)):
            if _score(a, raw[k]) >= 2:
                pairs.append((a, raw[k]))
                j = k + 1
                break
    return pairs
