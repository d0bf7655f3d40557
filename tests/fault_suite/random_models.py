"""Random paired architectures for the fuzz test, built from one spec in torch or paddle.

A spec is plain data (tuples), so hypothesis can draw and shrink it, and the same spec
builds the same network in either framework. ``build(spec, fw, bug)`` returns the model;
``bug`` is ``(index, kind)`` or None. ``expected_blame(spec, bug)`` says which layer the
injected bug must be blamed at: ``(phase, dotted path)``.

Layer kinds, on a vector (batch, width) or an image (batch, channels, 8, 8):
- ``("linear", width)`` / ``("conv", channels)``: 3x3, padding 1;
- ``("norm",)``: LayerNorm on vectors, BatchNorm on images;
- ``("act", name)``: relu, gelu, tanh, sigmoid, silu;
- ``("tanh_custom",)``: tanh with a hand-written backward (custom autograd function / PyLayer);
- ``("dropout", p)``;
- ``("residual", inplace)``: y = b(act(a(x))) + x, the add in place on y when ``inplace``.

Bug kinds: ``weight`` (the layer's weight is off by a fixed +-1% pattern when it runs),
``act`` (another activation), ``eps`` (norm epsilon 1e-3 instead of 1e-5), ``backward``
(the custom tanh's gradient scaled by 0.9: a backward-only bug).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.fault_suite.models import _ns, _pattern

ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid", "silu")
# The activation a swap bug puts in place of each one: always visibly different on N(0, 1) inputs.
SWAPPED = {"relu": "gelu", "gelu": "tanh", "tanh": "sigmoid", "sigmoid": "relu", "silu": "relu"}
BATCH, SIDE = 4, 8


def layer_names(spec: dict, prefix: str = "l") -> list[str]:
    return [f"{prefix}{i}" for i in range(len(spec["layers"]))]


def bug_sites(spec: dict) -> list[tuple[str, str]]:
    """Every (dotted path, bug kind) a bug can be injected at."""
    sites = []
    for name, layer in zip(layer_names(spec), spec["layers"]):
        kind = layer[0]
        if kind in ("linear", "conv"):
            sites.append((name, "weight"))
        elif kind == "norm":
            sites.append((name, "eps"))
        elif kind == "act":
            sites.append((name, "act"))
        elif kind == "tanh_custom":
            sites.append((name, "backward"))
        elif kind == "residual":
            sites += [(f"{name}.a", "weight"), (f"{name}.act", "act"), (f"{name}.b", "weight")]
    return sites


def expected_blame(bug: tuple[str, str]) -> tuple[str, str]:
    path, kind = bug
    return ("backward" if kind == "backward" else "forward", path)


def inputs(spec: dict) -> np.ndarray:
    rng = np.random.RandomState(spec["seed"])
    shape = (BATCH, spec["width"], SIDE, SIDE) if spec["image"] else (BATCH, spec["width"])
    return rng.randn(*shape).astype("float32")


def build(spec: dict, fw: str, bug: tuple[str, str] | None = None, prefix: str = "l") -> Any:
    """The network in ``fw``; its top layers are named ``{prefix}0``, ``{prefix}1``... (``bug``
    names base's, with ``l``): a port that renamed every layer pairs by order alone."""
    kit = _Kit(fw, spec["image"])
    bug_path, bug_kind = bug if bug else (None, None)
    if bug_path is not None:
        bug_path = prefix + bug_path[1:]

    def make(path: str, layer: tuple, width: int) -> tuple[Any, int]:
        wrong = bug_kind if path == bug_path else None
        kind = layer[0]
        if kind in ("linear", "conv"):
            return kit.weighted(width, layer[1], perturbed=wrong == "weight"), layer[1]
        if kind == "norm":
            return kit.norm(width, 1e-3 if wrong == "eps" else 1e-5), width
        if kind == "act":
            return kit.act(SWAPPED[layer[1]] if wrong == "act" else layer[1]), width
        if kind == "tanh_custom":
            return kit.custom_tanh(wrong == "backward"), width
        if kind == "dropout":
            return kit.dropout(layer[1]), width
        # A residual block keeps the width: a -> act -> b, plus the block's input.
        block = kit.residual(layer[1])
        block.a = make(f"{path}.a", (kit.weighted_kind, width), width)[0]
        block.act = make(f"{path}.act", ("act", "relu"), width)[0]
        block.b = make(f"{path}.b", (kit.weighted_kind, width), width)[0]
        return block, width

    model = kit.sequence()
    width = spec["width"]
    built = []
    for name, layer in zip(layer_names(spec, prefix), spec["layers"]):
        module, width = make(name, layer, width)
        built.append((name, module))
    # Registration order differs from call order on one side: pairing must follow execution.
    for name, module in reversed(built) if fw == spec["reversed_side"] else built:
        setattr(model, name, module)
    model.order = [name for name, _ in built]
    return model


class _Kit:
    """The layer constructors of one framework."""

    def __init__(self, fw: str, image: bool):
        self.fw, self.image = fw, image
        self.weighted_kind = "conv" if image else "linear"
        if fw == "torch":
            import torch

            self.nn, self.Base = torch.nn, torch.nn.Module
            self.to_tensor = torch.from_numpy
        else:
            import paddle

            self.nn, self.Base = paddle.nn, paddle.nn.Layer
            self.to_tensor = paddle.to_tensor

    def weighted(self, i: int, o: int, perturbed: bool) -> Any:
        torch_side = self.fw == "torch"
        if self.image:
            cls = self.nn.Conv2d if torch_side else self.nn.Conv2D
            op = self.nn.functional.conv2d
        else:
            cls = self.nn.Linear
            op = self.nn.functional.linear
        if not perturbed:
            return cls(i, o, 3, padding=1) if self.image else cls(i, o)
        to_tensor, image = self.to_tensor, self.image

        class Perturbed(cls):
            def forward(self, x):
                w = self.weight * to_tensor(_pattern(self.weight.shape))
                return op(x, w, self.bias, padding=1) if image else op(x, w, self.bias)

        return Perturbed(i, o, 3, padding=1) if image else Perturbed(i, o)

    def norm(self, width: int, eps: float) -> Any:
        if self.fw == "torch":
            return self.nn.BatchNorm2d(width, eps=eps) if self.image else self.nn.LayerNorm(width, eps=eps)
        if self.image:
            return self.nn.BatchNorm2D(width, epsilon=eps, momentum=0.9)
        return self.nn.LayerNorm(width, epsilon=eps)

    def act(self, name: str) -> Any:
        classes = {"relu": "ReLU", "gelu": "GELU", "tanh": "Tanh", "sigmoid": "Sigmoid", "silu": "SiLU"}
        if self.fw == "paddle" and name == "silu":
            return self.nn.Silu()
        return getattr(self.nn, classes[name])()

    def dropout(self, p: float) -> Any:
        return self.nn.Dropout(p)

    def custom_tanh(self, wrong: bool) -> Any:
        tanh_fn = _ns(self.fw)["tanh_fn"]  # the fault suite's custom autograd function / PyLayer

        class CustomTanh(self.Base):
            def forward(self, x):
                return tanh_fn(x, wrong)

        return CustomTanh()

    def residual(self, inplace: bool) -> Any:
        class Residual(self.Base):
            def forward(self, x):
                y = self.b(self.act(self.a(x)))
                if inplace:
                    # In place on the inner layer's output, which nbdiff has already recorded.
                    y.add_(x)
                    return y
                return y + x

        return Residual()

    def sequence(self) -> Any:
        image = self.image

        class Net(self.Base):
            def forward(self, x):
                for name in self.order:
                    x = getattr(self, name)(x)
                # An image net ends in a spatial mean, so the loss sees every pixel.
                return x.mean([2, 3]) if image else x

        return Net()
