"""Real model pairs for the zoo: libraries people port between, tiny configs, no downloads.

Each case builds ``(base, raw, inputs, options)`` fresh and says what must be blamed:
``None`` for an equivalent pair, else ``(phase, base path, parameter or None)``.
transformers is imported before paddleformers, which otherwise turns transformers'
torch support off in its process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], tuple[Any, Any, Any, dict[str, Any]]]
    expect: tuple[str, str, str | None] | None = None
    """``(phase, base path, parameter)`` that must be blamed; ``None``: must pass."""
    tags: tuple[str, ...] = field(default=())


def _seed() -> None:
    import paddle
    import torch

    torch.manual_seed(0)
    paddle.seed(0)


# -- transformers Llama <-> paddleformers Llama --------------------------------------------
LLAMA = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
)  # fmt: skip


def llama(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from paddleformers.transformers import LlamaConfig as PConfig
            from paddleformers.transformers import LlamaForCausalLM as PLlama
        _seed()
        base = LlamaForCausalLM(LlamaConfig(**LLAMA))
        pcfg = dict(LLAMA, fuse_rms_norm=False)  # the fused kernel has no CPU build
        if bug == "eps":
            pcfg["rms_norm_eps"] = 1e-5
        if bug == "rope_theta":
            pcfg["rope_theta"] = 500000.0
        if bug == "act":
            pcfg["hidden_act"] = "gelu"
        raw = PLlama(PConfig(**pcfg))
        ids = np.random.RandomState(0).randint(0, LLAMA["vocab_size"], (2, 8)).astype("int64")
        inputs = ({"input_ids": torch.from_numpy(ids), "use_cache": False},
                  {"input_ids": paddle.to_tensor(ids), "use_cache": False})  # fmt: skip
        return base, raw, inputs, _training(train, base, raw)

    return build


def _training(kind: str | None, base: Any, raw: Any) -> dict[str, Any]:
    """AdamW for 3 steps (``adamw``), or with one setting ported wrong."""
    if kind is None:
        return {}
    import paddle
    import torch

    wd_raw = 0.1 if kind == "adamw_wd" else 0.01
    topt = torch.optim.AdamW(base.parameters(), lr=1e-3, weight_decay=0.01)
    popt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=raw.parameters(), weight_decay=wd_raw)
    return {"optimizers": [topt, popt], "steps": 3}


# -- torch.nn.TransformerEncoder <-> paddle.nn.TransformerEncoder --------------------------
def encoder(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle
        import torch

        _seed()
        t_layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        base = torch.nn.TransformerEncoder(t_layer, 2, enable_nested_tensor=False)
        act = "gelu" if bug == "act" else "relu"
        raw = paddle.nn.TransformerEncoder(paddle.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation=act), 2)
        if bug == "eps":
            raw.layers[1].norm2._epsilon = 1e-3
        x = np.random.RandomState(0).randn(2, 6, 32).astype("float32")
        return base, raw, x, _training(train, base, raw)

    return build


# -- torchvision-style ResNet18 / MobileNetV2 <-> paddle.vision -----------------------------
def resnet(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import ResNet18

        _seed()
        base = ResNet18(10)
        raw = paddle.vision.models.resnet18(num_classes=10)
        if bug == "eps":
            raw.layer2[0].bn2._epsilon = 1e-3
        if bug == "padding":
            raw.conv1 = paddle.nn.Conv2D(3, 64, 7, 2, 2, bias_attr=False)
        if bug == "momentum":
            raw.layer1[0].bn1._momentum = 0.1  # torch's number copied: paddle's momentum is 1 - torch's
        if bug is None or bug == "momentum":
            pass
        x = np.random.RandomState(0).randn(4, 3, 64, 64).astype("float32")
        opts = _training(train, base, raw)
        if bug == "momentum":
            opts = _sgd(base, raw)
        return base, raw, x, opts

    return build


def _sgd(base: Any, raw: Any) -> dict[str, Any]:
    import paddle
    import torch

    return {
        "optimizers": [
            torch.optim.SGD(base.parameters(), lr=0.01),
            paddle.optimizer.SGD(learning_rate=0.01, parameters=raw.parameters()),
        ],
        "steps": 2,
    }


def mobilenet(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import MobileNetV2

        _seed()
        base = MobileNetV2(0.25, 10)
        raw = paddle.vision.models.mobilenet_v2(scale=0.25, num_classes=10)
        if bug == "act":
            raw.features[2].conv[1][2] = paddle.nn.Hardswish()  # a MobileNetV3 activation mixed in
        if bug == "eps":
            raw.features[3].conv[3]._epsilon = 1e-3
        x = np.random.RandomState(0).randn(4, 3, 64, 64).astype("float32")
        return base, raw, x, _training(train, base, raw)

    return build


CASES: list[Case] = [
    Case("llama", llama()),
    Case("llama eps", llama("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    Case("llama rope_theta", llama("rope_theta"), ("forward", "model.rotary_emb", None)),
    Case("llama act", llama("act"), ("forward", "model.layers.0.mlp.act_fn", None)),
    Case("llama adamw", llama(train="adamw"), tags=("train",)),
    Case("llama adamw wd", llama(train="adamw_wd"), ("optimizer", "model.embed_tokens", "model.embed_tokens.weight"), tags=("train",)),
    Case("encoder", encoder()),
    Case("encoder eps", encoder("eps"), ("forward", "layers.1.norm2", None)),
    Case("encoder act", encoder("act"), ("forward", "layers.0", None)),
    Case("encoder adamw", encoder(train="adamw"), tags=("train",)),
    Case("resnet", resnet()),
    Case("resnet eps", resnet("eps"), ("forward", "layer2.0.bn2", None)),
    Case("resnet padding", resnet("padding"), ("forward", "conv1", None)),
    Case("resnet momentum", resnet("momentum"), ("state", "layer1.0.bn1", None), tags=("train",)),
    # paddle updates running_var with the biased batch variance, torch with the unbiased one: real.
    Case("resnet adamw", resnet(train="adamw"), ("state", "layer2.0.bn1", None), tags=("train",)),
    Case("mobilenet", mobilenet()),
    Case("mobilenet act", mobilenet("act"), ("forward", "features.2.conv.1.2", None)),
    Case("mobilenet eps", mobilenet("eps"), ("forward", "features.3.conv.3", None)),
]  # fmt: skip
