"""Which layer classes are the same thing in torch and paddle. Data, not code.

Names are compared lowercased, so ``Conv2d`` and ``Conv2D`` need no entry; only
names that differ in more than case are listed here.
"""

from __future__ import annotations

__all__ = ["TYPE_ALIASES", "canonical_type", "equivalent_types"]

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
)

_CANON: dict[str, str] = {}
for _torch, _paddle in TYPE_ALIASES:
    _CANON.setdefault(_paddle.lower(), _torch.lower())
    _CANON.setdefault(_torch.lower(), _torch.lower())


def canonical_type(type_name: str) -> str:
    """One name for a layer class across frameworks."""
    low = type_name.lower()
    return _CANON.get(low, low)


def equivalent_types(a: str, b: str) -> bool:
    """Whether two layer class names denote the same layer."""
    return canonical_type(a) == canonical_type(b)
