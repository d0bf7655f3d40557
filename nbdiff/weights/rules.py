"""Layout rules: how one framework's layer stores what the other's stores differently.

A rule converts a layer's tensors (parameters and buffers, by relative name) from
the ``base`` layout to the ``raw`` layout; ``inverse`` goes back, so every rule
works in both directions. The conversions are linear (renames, transposes,
splits), so they apply to gradients and updates as well as to weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbdiff.errors import OptionError

__all__ = ["WeightRule", "register_weight_rule", "find_rule", "covers_sublayers", "rename_rule", "RULES"]

Arrays = dict[str, np.ndarray]
Convert = Callable[[Arrays], Arrays]


@dataclass(frozen=True)
class WeightRule:
    """How to copy one layer class of a framework into another."""

    name: str
    base: tuple[str, str]
    """``(framework, class name)`` of the source layout."""
    raw: tuple[str, str]
    """``(framework, class name)`` of the destination layout."""
    convert: Convert
    """Source arrays (relative names) to destination arrays."""
    inverse: Convert
    """Destination arrays back to source arrays."""
    recursive: bool = False
    """The rule covers the tensors of the layer's sublayers too (names with dots)."""
    optional: tuple[str, ...] = ()
    """Destination tensors that may have no source (left as initialised)."""
    copy: Callable[[Any, Any], None] | None = None
    """``copy(base_layer, raw_layer)`` writes raw's weights itself (PaDiff-style special init);
    ``convert``/``inverse`` then only rename, for comparing gradients by name."""


RULES: dict[tuple[str, str, str, str], WeightRule] = {}


def register_weight_rule(
    base: tuple[str, str] | type,
    raw: tuple[str, str] | type,
    convert: Convert | None,
    inverse: Convert | None,
    *,
    name: str | None = None,
    recursive: bool = False,
    optional: tuple[str, ...] = (),
    copy: Callable[[Any, Any], None] | None = None,
) -> WeightRule:
    """Teach nbdiff how to copy ``base`` layers into ``raw`` layers (and back).

    ``base``/``raw`` are ``(framework, class name)`` such as ``("torch", "Linear")``,
    or the layer classes themselves. ``convert`` maps a dict of the base layer's
    arrays (``{"weight": ..., "bias": ...}``, names as in ``named_parameters`` /
    ``named_buffers`` of that layer) to the raw layer's; ``inverse`` goes back.
    Set ``recursive`` when the layer's sublayers' tensors are included (dotted names),
    and list in ``optional`` the tensors either side may have without a counterpart.
    ``copy(base_layer, raw_layer)`` instead copies the weights itself (pass ``convert``/``inverse``
    as ``None``); gradients of those layers are then compared by tensor name.
    """
    if convert is None or inverse is None:
        if copy is None:
            raise OptionError("register_weight_rule needs convert and inverse (or copy=...).")
        convert, inverse = rename_rule({})
    b, r = _key(base), _key(raw)
    rule = WeightRule(name or f"{b[0]}.{b[1]} -> {r[0]}.{r[1]}", b, r, convert, inverse, recursive, optional, copy)
    RULES[(*b, *r)] = rule
    return rule


def _key(x: tuple[str, str] | type) -> tuple[str, str]:
    if isinstance(x, tuple) and len(x) == 2:
        fw, cls = x
        if isinstance(cls, type):  # ("torch", Cls): the class's name is what is matched
            cls = cls.__name__
        if fw not in ("torch", "paddle") or not isinstance(cls, str) or not cls:
            raise OptionError(
                f"A weight rule side must be (framework, class name) with framework 'torch' or 'paddle', not "
                f"{x!r}: e.g. ('torch', 'Linear'), or the layer class itself."
            )
        return (fw, cls)
    if isinstance(x, type):
        for c in x.__mro__:
            root = c.__module__.split(".")[0]
            if root in ("torch", "paddle"):
                return (root, x.__name__)
        raise OptionError(f"{x.__name__} is neither a torch.nn.Module nor a paddle.nn.Layer subclass.")
    raise OptionError(f"A weight rule side must be (framework, class name) or a layer class, not {x!r}.")


def find_rule(
    base_fw: str, base_classes: list[str], raw_fw: str, raw_classes: list[str]
) -> tuple[WeightRule, bool] | None:
    """The most specific rule for these classes (MRO order), and whether to use its inverse."""
    for bc in base_classes:
        for rc in raw_classes:
            rule = RULES.get((base_fw, bc, raw_fw, rc))
            if rule is not None:
                return rule, False
            rule = RULES.get((raw_fw, rc, base_fw, bc))
            if rule is not None:
                return rule, True
    return None


def covers_sublayers(fw: str, classes: list[str]) -> bool:
    """Whether a recursive rule exists for one of these classes: the layer is copied as one unit."""
    return any(
        rule.recursive and ((fw, c) == rule.base or (fw, c) == rule.raw) for rule in RULES.values() for c in classes
    )


def rename_rule(
    mapping: dict[str, str],
    transpose: tuple[str, ...] = (),
    drop: tuple[str, ...] = (),
    drop_back: tuple[str, ...] = (),
) -> tuple[Convert, Convert]:
    """A rule that renames tensors and transposes some 2-D ones. Unlisted names pass through."""
    back = {v: k for k, v in mapping.items()}

    def convert(arrays: Arrays) -> Arrays:
        return {mapping.get(k, k): (v.T if k in transpose else v) for k, v in arrays.items() if k not in drop}

    def inverse(arrays: Arrays) -> Arrays:
        return {
            back.get(k, k): (v.T if back.get(k, k) in transpose else v) for k, v in arrays.items() if k not in drop_back
        }

    return convert, inverse


def _register_builtin() -> None:
    def tp(
        torch_names: list[str],
        paddle_names: list[str],
        conv: tuple[Convert, Convert],
        name: str,
        recursive: bool = False,
        optional: tuple[str, ...] = (),
    ) -> None:
        for t in torch_names:
            for p in paddle_names:
                register_weight_rule(
                    ("torch", t), ("paddle", p), *conv, name=name, recursive=recursive, optional=optional
                )

    same = rename_rule({})
    tp(["Linear"], ["Linear"], rename_rule({}, transpose=("weight",)), "Linear (weight transposed)")
    for n in ("1", "2", "3"):
        tp([f"Conv{n}d"], [f"Conv{n}D"], same, f"Conv{n}D")
        tp([f"ConvTranspose{n}d"], [f"Conv{n}DTranspose"], same, f"Conv{n}DTranspose")
        tp(
            [f"BatchNorm{n}d"],
            [f"BatchNorm{n}D", "BatchNorm"] if n == "2" else [f"BatchNorm{n}D"],
            rename_rule({"running_mean": "_mean", "running_var": "_variance"}, drop=("num_batches_tracked",)),
            f"BatchNorm{n}D (running stats renamed)",
            optional=("num_batches_tracked",),
        )
        # torch's affine pair is weight/bias and off by default; paddle's is scale/bias and
        # always there (initialised to 1 and 0, which equals no affine).
        tp(
            [f"InstanceNorm{n}d"],
            [f"InstanceNorm{n}D"],
            rename_rule({"weight": "scale"}, drop=("running_mean", "running_var", "num_batches_tracked")),
            f"InstanceNorm{n}D (weight <-> scale)",
            optional=("scale", "bias", "weight"),
        )
    tp(["Linear"], ["LMHead"], same, "LMHead (paddleformers: (vocab, hidden), as torch Linear)")
    # transformers' Conv1D (GPT-2) is a Linear stored [in, out], as paddle stores it.
    tp(["Conv1D"], ["Linear"], same, "Conv1D (transformers, GPT-2) ~ Linear: both [in, out]")
    register_weight_rule(
        ("torch", "Conv1D"), ("torch", "Linear"), *rename_rule({}, transpose=("weight",)),
        name="Conv1D (transformers, GPT-2) ~ torch Linear (weight transposed)",
    )  # fmt: skip
    tp(["Embedding"], ["Embedding"], same, "Embedding")
    tp(["LayerNorm"], ["LayerNorm"], same, "LayerNorm")
    tp(["GroupNorm"], ["GroupNorm"], same, "GroupNorm")
    tp(["PReLU"], ["PReLU"], rename_rule({"weight": "_weight"}), "PReLU")
    # paddle's RNN layers hold per-direction cells as sublayers sharing the parent's
    # parameters, so the rule covers the whole subtree; names and gate order agree.
    rnn = rename_rule({}, drop_back=("_dropout_state",))
    tp(["LSTM"], ["LSTM"], rnn, "LSTM", recursive=True)
    tp(["GRU"], ["GRU"], rnn, "GRU", recursive=True)
    tp(["RNN"], ["SimpleRNN"], rnn, "RNN/SimpleRNN", recursive=True)
    tp(
        ["MultiheadAttention"],
        ["MultiHeadAttention"],
        (_mha_torch_to_paddle, _mha_paddle_to_torch),
        "MultiheadAttention (packed q/k/v <-> split, weights transposed)",
        recursive=True,
    )


def _mha_torch_to_paddle(a: Arrays) -> Arrays:
    if "in_proj_weight" in a:
        q, k, v = np.split(a["in_proj_weight"], 3, axis=0)
    else:
        q, k, v = a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"]
    out = {"q_proj.weight": q.T, "k_proj.weight": k.T, "v_proj.weight": v.T, "out_proj.weight": a["out_proj.weight"].T}
    if "in_proj_bias" in a:
        out["q_proj.bias"], out["k_proj.bias"], out["v_proj.bias"] = np.split(a["in_proj_bias"], 3)
    if "out_proj.bias" in a:
        out["out_proj.bias"] = a["out_proj.bias"]
    if "bias_k" in a or "bias_v" in a:
        raise OptionError(
            "torch MultiheadAttention(add_bias_kv=True) has no paddle counterpart; register a weight rule."
        )
    return out


def _mha_paddle_to_torch(a: Arrays) -> Arrays:
    q, k, v = a["q_proj.weight"].T, a["k_proj.weight"].T, a["v_proj.weight"].T
    out: Arrays = {}
    if q.shape == k.shape == v.shape:
        out["in_proj_weight"] = np.concatenate([q, k, v], axis=0)
    else:
        out["q_proj_weight"], out["k_proj_weight"], out["v_proj_weight"] = q, k, v
    out["out_proj.weight"] = a["out_proj.weight"].T
    if "q_proj.bias" in a:
        out["in_proj_bias"] = np.concatenate([a["q_proj.bias"], a["k_proj.bias"], a["v_proj.bias"]])
    if "out_proj.bias" in a:
        out["out_proj.bias"] = a["out_proj.bias"]
    return out


_register_builtin()
