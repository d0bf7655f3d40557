"""Which layer classes are the same thing in torch and paddle. Data, not code.

Names are compared lowercased, so ``Conv2d`` and ``Conv2D`` need no entry; only
names that differ in more than case are listed here.
"""

from __future__ import annotations

import functools

__all__ = ["TYPE_ALIASES", "ACTIVATION_KINDS", "canonical_type", "equivalent_types", "type_affinity", "activation_kind"]

TYPE_ALIASES: tuple[tuple[str, str], ...] = (
    # (torch name, paddle name)
    ("RNN", "SimpleRNN"),
    ("RNNCell", "SimpleRNNCell"),
    ("ModuleList", "LayerList"),
    ("ModuleDict", "LayerDict"),
    ("ConvTranspose1d", "Conv1DTranspose"),
    ("ConvTranspose2d", "Conv2DTranspose"),
    ("ConvTranspose3d", "Conv3DTranspose"),
    ("NonDynamicallyQuantizableLinear", "Linear"),
    ("BatchNorm2d", "BatchNorm"),
    ("SyncBatchNorm", "SyncBatchNorm"),
    ("Hardsigmoid", "Hardsigmoid"),
    ("Softmax2d", "Softmax2D"),
    ("CrossEntropyLoss", "CrossEntropyLoss"),
    ("Conv2dNormActivation", "ConvNormActivation"),
    ("SiLU", "Silu"),
    ("Linear", "LMHead"),  # paddleformers' output head: a Linear stored (vocab, hidden), as torch stores it
)

ACTIVATION_KINDS: tuple[tuple[str, str], ...] = (
    # (substring of a lowercased class name, kind); the first match wins, so longer names come first.
    ("relu6", "relu6"), ("leakyrelu", "leakyrelu"), ("hardswish", "hardswish"), ("hardsigmoid", "hardsigmoid"),
    ("relu", "relu"), ("gelu", "gelu"), ("silu", "silu"), ("swish", "silu"), ("sigmoid", "sigmoid"),
    ("tanh", "tanh"), ("mish", "mish"), ("softplus", "softplus"), ("elu", "elu"),
)  # fmt: skip
"""Activation classes of any library (torch, paddle, transformers' ``SiLUActivation``) by what they compute."""

_CANON: dict[str, str] = {}
for _torch, _paddle in TYPE_ALIASES:
    # Chains join: Linear ~ NonDynamicallyQuantizableLinear and Linear ~ LMHead share one name.
    _root = _CANON.setdefault(_torch.lower(), _CANON.get(_paddle.lower(), _torch.lower()))
    _CANON.setdefault(_paddle.lower(), _root)


def canonical_type(type_name: str) -> str:
    """One name for a layer class across frameworks."""
    low = type_name.lower()
    return _CANON.get(low, low)


def equivalent_types(a: str, b: str) -> bool:
    """Whether two layer class names denote the same layer."""
    return canonical_type(a) == canonical_type(b)


def activation_kind(names: tuple[str, ...]) -> str | None:
    """What an activation class computes (``gelu``, ``silu``...), from its own and base class names."""
    for name in names:
        low = name.lower()
        for key, kind in ACTIVATION_KINDS:
            if key in low:
                return kind
    return None


@functools.lru_cache(maxsize=4096)  # pairing scores every nearby pair: a deep model asks the same few again and again
def type_affinity(a: str, a_bases: tuple[str, ...], b: str, b_bases: tuple[str, ...]) -> int:
    """How surely two layer classes do the same job.

    3: the same class (up to the alias table), or one derives from the other's class
    (``GPTLayerNorm(paddle.nn.LayerNorm)`` ~ torch ``LayerNorm``: a subclass is its base, so
    it does not lose to a plain layer that ran elsewhere); 2: related: both derive from the
    same class, one name ends with the other (``LlamaRMSNorm`` ~ ``RMSNorm``), or both are
    activations of the same kind; 1: activations of different kinds (a swapped activation
    sits where the other was); 0: unrelated.
    """
    ca, cb = canonical_type(a), canonical_type(b)
    sa = {ca} | {canonical_type(x) for x in a_bases}
    sb = {cb} | {canonical_type(x) for x in b_bases}
    if ca == cb or ca in sb or cb in sa:
        return 3
    ka, kb = activation_kind((a, *a_bases)), activation_kind((b, *b_bases))
    if ka and kb:
        return 2 if ka == kb else 1
    if sa & sb:
        return 2
    short, long_ = sorted((ca, cb), key=len)
    if len(short) >= 3 and long_.endswith(short):
        return 2
    return 0
