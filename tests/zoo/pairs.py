"""Real model pairs for the zoo: libraries people port between, tiny configs, no downloads.

Each case builds ``(base, raw, inputs, options)`` fresh and says what must be blamed:
``None`` for an equivalent pair, else ``(phase, base path, parameter or None)``.
transformers is imported before paddleformers, which otherwise turns transformers'
torch support off in its process.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.zoo import decoders


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], tuple[Any, Any, Any, dict[str, Any]]]
    expect: tuple[str, str, str | None] | None = None
    """``(phase, base path, parameter)`` that must be blamed; ``None``: must pass."""
    tags: tuple[str, ...] = field(default=())


def _token_inputs(vocab: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same token ids for a transformers (torch) model and a paddleformers one."""
    import paddle
    import torch

    ids = np.random.RandomState(0).randint(0, vocab, (2, 8)).astype("int64")
    return {"input_ids": torch.from_numpy(ids), "use_cache": False}, {
        "input_ids": paddle.to_tensor(ids),
        "use_cache": False,
    }


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
        inputs = _token_inputs(LLAMA["vocab_size"])
        return base, raw, inputs, _training(train, base, raw)

    return build


# -- transformers Qwen2 <-> paddleformers Qwen2: fused qkv_proj (with bias) and up_gate_proj -----
QWEN2 = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000.0,
)  # fmt: skip


def _paddleformers_qwen2() -> Any:
    """paddleformers' plain Qwen2 (``Qwen2ForCausalLMDeprecated``; ``Qwen2ForCausalLM`` builds the
    fleet model). Its module imports a fleet-only provider module, whose ``paddlefleet`` is not on
    PyPI: an empty stand-in lets the plain model import; nothing of it is used."""
    import sys
    import types

    name = "paddleformers.transformers.gpt_provider"
    try:
        import importlib

        importlib.import_module(name)
    except ImportError:
        stub = types.ModuleType(name)
        stub.GPTModelProvider = type("GPTModelProvider", (), {})  # type: ignore[attr-defined]
        sys.modules[name] = stub
    from paddleformers.transformers.qwen2.modeling import Qwen2ForCausalLMDeprecated

    return Qwen2ForCausalLMDeprecated


def qwen2(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from paddleformers.transformers import Qwen2Config as PConfig

            PQwen2 = _paddleformers_qwen2()
        _seed()
        base = Qwen2ForCausalLM(Qwen2Config(**QWEN2))
        pcfg = dict(QWEN2, fuse_rms_norm=False)
        if bug == "eps":
            pcfg["rms_norm_eps"] = 1e-5
        raw = PQwen2(PConfig(**pcfg))
        inputs = _token_inputs(QWEN2["vocab_size"])
        return base, raw, inputs, _training(train, base, raw)

    return build


# -- transformers Qwen2-MoE <-> paddleformers Qwen2-MoE: stacked experts against a list of experts ---------
QWEN2_MOE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
    num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False, decoder_sparse_step=1,
    norm_topk_prob=False,
)  # fmt: skip


def qwen2_moe(bug: str | None = None, reverse: bool = False) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """transformers 5 keeps a layer's experts as 3-D ``gate_up_proj``/``down_proj`` beside a router holding
    ``[experts, hidden]``; paddleformers keeps a ``LayerList`` of expert MLPs (``up_gate_proj`` fused) and a
    ``Linear`` gate. ``topk``: the port renormalises the top-k routing weights; ``act``: its activation is GELU.
    ``reverse``: paddleformers is the reference and the bug is transformers'."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _paddleformers_qwen2()  # the same fleet-only stand-in
            from paddleformers.transformers import Qwen2MoeConfig as PConfig
            from paddleformers.transformers.qwen2_moe.modeling import Qwen2MoeForCausalLMDeprecated as PMoe
        _seed()
        buggy = dict(QWEN2_MOE, norm_topk_prob=bug == "topk", **({"hidden_act": "gelu"} if bug == "act" else {}))
        base = Qwen2MoeForCausalLM(Qwen2MoeConfig(**(buggy if reverse else QWEN2_MOE)))
        raw = PMoe(PConfig(**(QWEN2_MOE if reverse else buggy), fuse_rms_norm=False))
        inputs = _token_inputs(QWEN2_MOE["vocab_size"])
        return (raw, base, inputs[::-1], {}) if reverse else (base, raw, inputs, {})

    return build


# -- transformers Qwen3 <-> paddleformers Qwen3: q/k/v and gate/up fused on one side only ----------
QWEN3 = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
)  # fmt: skip


def _user_rmsnorm(weight: Any, eps: float, eps_outside: bool) -> Any:
    """A porter's own RMSNorm in place of paddleformers' (``eps_outside``: added after the square
    root, a real slip when porting by hand)."""
    import paddle

    class UserRMSNorm(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            init = paddle.nn.initializer.Assign(weight.numpy())
            self.weight = paddle.create_parameter(weight.shape, "float32", default_initializer=init)

        def forward(self, x: Any) -> Any:
            ms = (x * x).mean(-1, keepdim=True)
            return self.weight * (x / (paddle.sqrt(ms) + eps) if eps_outside else x * paddle.rsqrt(ms + eps))

    return UserRMSNorm()


def qwen3(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _paddleformers_qwen2()  # the same fleet-only stand-in
            from paddleformers.transformers import Qwen3Config as PConfig
            from paddleformers.transformers.qwen3.modeling import Qwen3ForCausalLMDeprecated as PQwen3
        _seed()
        base = Qwen3ForCausalLM(Qwen3Config(**QWEN3))
        pcfg = dict(QWEN3, fuse_rms_norm=False)
        if bug == "rope_theta":
            pcfg["rope_theta"] = 1e6  # Qwen3's released checkpoints use 1e6; this config's base keeps 1e4
        if bug == "act":
            pcfg["hidden_act"] = "gelu"
        raw = PQwen3(PConfig(**pcfg))
        if bug in ("custom norm", "custom norm eps"):
            for layer in raw.model.layers:
                q = layer.self_attn.q_norm
                layer.self_attn.q_norm = _user_rmsnorm(q.weight, 1e-6, eps_outside=bug == "custom norm eps")
        inputs = _token_inputs(QWEN3["vocab_size"])
        return base, raw, inputs, _training(train, base, raw)

    return build


# -- transformers Ernie 4.5 <-> paddleformers Ernie 4.5: fused qkv_proj and up_gate_proj ---------
ERNIE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, use_bias=True,
    tie_word_embeddings=False, rope_theta=500000.0,  # transformers' default; paddleformers' is 10000
)  # fmt: skip


def ernie(
    bug: str | None = None, train: str | None = None, reverse: bool = False
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """paddleformers fuses q/k/v into ``qkv_proj`` (laid out per kv head) and gate/up into
    ``up_gate_proj``; transformers keeps them apart. ``split``: the port reads qkv as
    ``[q | k | v]``; ``reshape``: it splits the query heads without the transpose.
    ``reverse``: paddleformers is the reference (base), transformers the port."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from paddleformers.transformers import Ernie4_5Config as PConfig
            from paddleformers.transformers import Ernie4_5ForCausalLM as PErnie
        _seed()
        base = Ernie4_5ForCausalLM(Ernie4_5Config(**dict(ERNIE, rms_norm_eps=1e-5 if bug == "torch eps" else 1e-6)))
        # paddleformers reads the MLP's bias from mlp_bias, transformers from use_bias.
        raw = PErnie(PConfig(**dict(ERNIE, fuse_rms_norm=False, mlp_bias=True)))
        if bug in ("split", "reshape", "none"):
            attn = raw.model.layers[0].self_attn
            attn.forward = types.MethodType(_ported_attention(bug), attn)
        inputs = _token_inputs(ERNIE["vocab_size"])
        if reverse:
            base, raw, inputs = raw, base, inputs[::-1]
        return base, raw, inputs, _training(train, base, raw)

    return build


def _ported_attention(bug: str) -> Callable[..., Any]:
    """paddleformers' Ernie 4.5 attention forward (no cache, no sequence parallel), ported with one bug."""
    import paddle
    from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS
    from paddleformers.transformers.ernie4_5.modeling import apply_rotary_pos_emb

    def forward(self: Any, hidden_states: Any, attention_mask: Any = None, position_embeddings: Any = None,
                **_: Any) -> tuple[Any, None]:  # fmt: skip
        b, s = hidden_states.shape[:2]
        nh, nkv, hd = self.num_heads, self.num_key_value_heads, self.head_dim
        qkv = self.qkv_proj(hidden_states)
        if bug == "split":  # wrong: the weights are laid out per kv head, not [q | k | v]
            q, k, v = paddle.split(qkv, [nh * hd, nkv * hd, nkv * hd], axis=-1)
        else:
            q, k, v = paddle.split(qkv.reshape([b, s, nkv, -1]), [nh // nkv * hd, hd, hd], axis=-1)
        q, k, v = q.reshape([b, s, nh, hd]), k.reshape([b, s, nkv, hd]), v.reshape([b, s, nkv, hd])
        # wrong for "reshape": heads split off by a reshape instead of a transpose
        q = q.reshape([b, nh, s, hd]) if bug == "reshape" else q.transpose([0, 2, 1, 3])
        k, v = k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3])
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        attn = ALL_ATTENTION_FUNCTIONS[self.attn_implementation]
        out, _ = attn(self, query=q, key=k, value=v, attention_mask=attention_mask, dropout=0.0, scaling=self.scaling)
        return self.o_proj(out), None

    return forward


def _training(kind: str | None, base: Any, raw: Any) -> dict[str, Any]:
    """AdamW for 3 steps (``adamw``), or with one setting ported wrong."""
    if kind is None:
        return {}
    import paddle
    import torch

    def adamw(model: Any, wd: float) -> Any:
        if isinstance(model, torch.nn.Module):
            return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=wd)
        return paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(), weight_decay=wd)

    wd_raw = 0.1 if kind == "adamw_wd" else 0.01
    return {"optimizers": [adamw(base, 0.01), adamw(raw, wd_raw)], "steps": 3}


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
def resnet(
    bug: str | None = None, train: str | None = None, shape: tuple[int, ...] = (4, 3, 64, 64)
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """``shape (2, 3, 32, 32)``: layer4's train-mode BatchNorms see two values per channel and
    amplify rounding past any fixed tolerance (conditioning, not a port difference)."""

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
        x = np.random.RandomState(0).randn(*shape).astype("float32")
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


# -- torchvision-style ShuffleNetV2 <-> paddle.vision: trees built differently ---------------------
def _user_relu(wrong_grad: bool) -> Any:
    """A porter's own activation in place of ``paddle.nn.ReLU`` (a PyLayer; with ``wrong_grad``, a
    gradient scaled by 1.5: a backward-only bug)."""
    import paddle

    class _Rectify(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            ctx.save_for_backward(x)
            return paddle.clip(x, min=0)

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            (x,) = ctx.saved_tensor()
            return g * (x > 0).astype(g.dtype) * (1.5 if wrong_grad else 1.0)

    class Rectifier(paddle.nn.Layer):
        def forward(self, x: Any) -> Any:
            return _Rectify.apply(x)

    return Rectifier()


def _concat_swapped(unit: Any) -> None:
    """A unit whose port concatenates its two halves in the wrong order (a bug in its own code)."""
    import paddle
    from paddle.vision.models.shufflenetv2 import channel_shuffle

    def forward(inputs: Any) -> Any:
        x1, x2 = paddle.split(inputs, num_or_sections=[inputs.shape[1] // 2] * 2, axis=1)
        x2 = unit._conv_linear(unit._conv_dw(unit._conv_pw(x2)))
        return channel_shuffle(paddle.concat([x2, x1], axis=1), 2)

    unit.forward = forward


def shufflenet(bug: str | None = None, train: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """torchvision keeps stages in Sequentials and each branch as one flat Sequential; paddle.vision
    keeps the units as siblings of the stem and wraps each conv in a Conv-Norm-Activation."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import ShuffleNetV2

        _seed()
        base = ShuffleNetV2()
        raw = paddle.vision.models.shufflenet_v2_x0_25(num_classes=10)
        if bug == "concat":
            _concat_swapped(raw._block_list[1])
        if bug == "maxpool":
            raw._max_pool = paddle.nn.MaxPool2D(3, 2, 0)  # torchvision's padding=1 dropped
        if bug in ("custom", "custom grad"):
            raw._conv1[2] = _user_relu(wrong_grad=bug == "custom grad")
        x = np.random.RandomState(0).randn(4, 3, 64, 64).astype("float32")
        return base, raw, x, _training(train, base, raw)

    return build


# -- transformers BERT <-> paddlenlp-style BERT: blocks of other spans ------------------------------
BERT = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.1,
)  # fmt: skip


def bert_pair(bug: str | None = None) -> tuple[Any, Any, Any]:
    """transformers' ``BertModel`` and the paddlenlp-style one of :mod:`tests.zoo.nlp` (LayerNorm
    eps 1e-5 on both: paddlenlp's). ``act``: the port's FFN activation is ReLU; ``eps``: one norm's
    epsilon is paddle's 1e-3 cap instead of 1e-5."""
    import paddle
    import torch
    from transformers import BertConfig, BertModel

    from tests.zoo.nlp import BertModel as PBert

    _seed()
    base = BertModel(BertConfig(**BERT, layer_norm_eps=1e-5, attention_probs_dropout_prob=0.1))
    raw = PBert(**BERT, hidden_act="relu" if bug == "act" else "gelu")
    if bug == "eps":
        raw.encoder.layers[1].norm2._epsilon = 1e-3
    ids = np.random.RandomState(0).randint(1, BERT["vocab_size"], (2, 8)).astype("int64")  # no padding
    return base, raw, ({"input_ids": torch.from_numpy(ids)}, {"input_ids": paddle.to_tensor(ids)})


def _either_way(
    pair: Callable[[str | None], tuple[Any, Any, Any]], bug: str | None, train: str | None, reverse: bool
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """A case from ``pair(bug)`` (base, raw, both inputs), the other way round with ``reverse``."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        base, raw, inputs = pair(bug)
        if reverse:
            base, raw, inputs = raw, base, inputs[::-1]
        return base, raw, inputs, _training(train, base, raw)

    return build


def bert(
    bug: str | None = None, train: str | None = None, reverse: bool = False
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    return _either_way(bert_pair, bug, train, reverse)


# -- transformers GPT-2 <-> paddlenlp-style GPT: one fused Conv1D c_attn against separate q/k/v ----------
GPT = dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64)


def gpt_pair(bug: str | None = None) -> tuple[Any, Any, Any]:
    """transformers' ``GPT2Model`` (erf GELU, eps 1e-5) and the paddlenlp-style GPT of :mod:`tests.zoo.nlp`.
    ``act``: the port's MLP activation is ReLU; ``eps``: one norm's epsilon is 1e-3."""
    import paddle
    import torch
    from transformers import GPT2Config, GPT2Model

    from tests.zoo.nlp import GPTModel

    _seed()
    base = GPT2Model(GPT2Config(**GPT, activation_function="gelu", layer_norm_epsilon=1e-5))
    raw = GPTModel(96, 32, 2, 4, 64, 64)
    if bug == "act":
        for layer in raw.layers:
            layer.activation = paddle.nn.functional.relu
    if bug == "eps":
        raw.layers[1].norm2._epsilon = 1e-3
    ids = np.random.RandomState(0).randint(0, GPT["vocab_size"], (2, 8)).astype("int64")
    return base, raw, ({"input_ids": torch.from_numpy(ids), "use_cache": False}, {"input_ids": paddle.to_tensor(ids)})


def gpt(
    bug: str | None = None, train: str | None = None, reverse: bool = False
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    return _either_way(gpt_pair, bug, train, reverse)


# -- torchvision-style MobileNetV3 <-> paddle.vision: one `block` Sequential against the block's own layers --
def mobilenet_v3(bug: str | None = None, reverse: bool = False) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """torchvision keeps each inverted residual's layers in one ``block`` Sequential (expansion, depthwise,
    squeeze-excitation, projection); paddle.vision keeps them as the block's own. ``se``: the port's
    squeeze-excitation gate is a Sigmoid, not a Hardsigmoid; ``eps``: one norm's epsilon is torch's default."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import MobileNetV3Small

        _seed()
        base, raw = MobileNetV3Small(10), paddle.vision.models.mobilenet_v3_small(num_classes=10)
        if bug == "se":
            raw.blocks[3].mid_se.scale_activation = paddle.nn.Sigmoid()
        if bug == "eps":
            raw.blocks[5].bottleneck_conv[1]._epsilon = 1e-5
        x = np.random.RandomState(0).randn(4, 3, 64, 64).astype("float32")
        if reverse:
            base, raw = raw, base
        return base, raw, x, {}

    return build


# -- torchvision-style Inception-A blocks <-> paddle.vision's: BasicConv2d (a wrapper, ReLU as a function)
# against ConvNormActivation (conv, norm and ReLU modules) ----------------------------------------------
def _paddle_inception_net() -> Any:
    """paddle.vision's own ``InceptionA`` blocks and ``ConvNormActivation``, as :class:`~tests.zoo.vision.InceptionNet` is built."""
    import paddle
    from paddle.vision.models.inceptionv3 import InceptionA
    from paddle.vision.ops import ConvNormActivation

    class InceptionNet(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.stem = ConvNormActivation(3, 32, 3, stride=2, padding=0)
            self.mixed_5b = InceptionA(32, 32)
            self.mixed_5c = InceptionA(256, 64)
            self.fc = paddle.nn.Linear(288, 10)

        def forward(self, x: Any) -> Any:
            x = self.mixed_5c(self.mixed_5b(self.stem(x)))
            return self.fc(paddle.flatten(paddle.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return InceptionNet()


def inception(bug: str | None = None, reverse: bool = False) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """``pool``: the port's pooling branch leaves the padding out of its averages (``exclusive=True``, where
    torchvision counts it); ``eps``: one norm's epsilon is 1e-3."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import InceptionNet

        _seed()
        base, raw = InceptionNet(10), _paddle_inception_net()
        if bug == "pool":
            raw.mixed_5b.branch_pool = paddle.nn.AvgPool2D(3, 1, 1, exclusive=True)
        if bug == "eps":
            raw.mixed_5c.branch5x5_2[1]._epsilon = 1e-3
        x = np.random.RandomState(0).randn(4, 3, 32, 32).astype("float32")
        if reverse:
            base, raw = raw, base
        return base, raw, x, {}

    return build


# -- torchvision-style DenseNet121 <-> paddle.vision: norms with their activation fused --------------
def densenet(bug: str | None = None, reverse: bool = False) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """paddle.vision fuses each ReLU into ``BatchNorm(act="relu")``; torchvision keeps norm and ReLU
    modules, and calls its last ReLU as a function after ``features.norm5``. ``eps``: one norm's
    epsilon is 1e-3; ``relu``: the port's last norm applies no activation. Forward only: the backward
    of 120 concatenating layers at this batch flips ReLU masks by rounding (an inherited error that no
    layer makes; see the issue note)."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import paddle

        from tests.zoo.vision import DenseNet121

        _seed()
        base, raw = DenseNet121(10), paddle.vision.models.densenet121(num_classes=10)
        if bug == "eps":
            raw.dense_block_func_list[1].dense_layer_func[2].bn_ac_func2._batch_norm._epsilon = 1e-3
        if bug == "relu":
            raw.batch_norm._act = None
        x = np.random.RandomState(0).randn(2, 3, 64, 64).astype("float32")
        if reverse:
            base, raw = raw, base
        return base, raw, x, {"diff_phase": "forward"}

    return build


CASES: list[Case] = [
    Case("llama", llama()),
    Case("llama eps", llama("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    Case("llama rope_theta", llama("rope_theta"), ("forward", "model.rotary_emb", None)),
    Case("llama act", llama("act"), ("forward", "model.layers.0.mlp.act_fn", None)),
    Case("llama adamw", llama(train="adamw"), tags=("train",)),
    Case("llama adamw wd", llama(train="adamw_wd"), ("optimizer", "model.embed_tokens", "model.embed_tokens.weight"), tags=("train",)),
    Case("qwen2", qwen2()),
    Case("qwen2 eps", qwen2("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    Case("qwen2 adamw", qwen2(train="adamw"), tags=("train",)),
    # Naming the diverging parameter crashed where the update that diverged was a fused layer's.
    Case("qwen2 adamw wd", qwen2(train="adamw_wd"), ("optimizer", "model.embed_tokens", "model.embed_tokens.weight"), tags=("train",)),
    Case("qwen2 moe", qwen2_moe()),
    Case("qwen2 moe topk", qwen2_moe("topk"), ("forward", "model.layers.0.mlp", None)),
    Case("qwen2 moe act", qwen2_moe("act"), ("forward", "model.layers.0.mlp.shared_expert.act_fn", None)),
    Case("qwen2 moe reversed", qwen2_moe(reverse=True)),
    Case("qwen2 moe reversed topk", qwen2_moe("topk", True), ("forward", "model.layers.0.mlp", None)),
    Case("qwen2 moe reversed act", qwen2_moe("act", True), ("forward", "model.layers.0.mlp.shared_expert.act_fn", None)),
    Case("qwen3", qwen3()),
    Case("qwen3 rope_theta", qwen3("rope_theta"), ("forward", "model.rotary_emb", None)),
    Case("qwen3 act", qwen3("act"), ("forward", "model.layers.0.mlp.act_fn", None)),
    Case("qwen3 custom norm", qwen3("custom norm")),
    Case("qwen3 custom norm eps", qwen3("custom norm eps"), ("forward", "model.layers.0.self_attn.q_norm", None)),
    Case("qwen3 adamw", qwen3(train="adamw"), tags=("train",)),
    Case("phi3", decoders.phi3()),
    Case("phi3 eps", decoders.phi3("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    Case("phi3 act", decoders.phi3("act"), ("forward", "model.layers.0.mlp.activation_fn", None)),
    Case("qwen3 moe", decoders.qwen3_moe()),
    Case("qwen3 moe eps", decoders.qwen3_moe("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    # The experts' activation: transformers runs it once on every routed row, (32, 16), inside the
    # stacked experts' one call (grouped_mm), paddleformers once per expert on its rows; neither those
    # nor the routers (softmax and top-k inside transformers', after paddleformers' Linear gate) pair,
    # so the block holding them is blamed, with its own error.
    Case("qwen3 moe act", decoders.qwen3_moe("act"), ("forward", "model.layers.0.mlp", None)),
    Case("gemma3", decoders.gemma3()),
    Case("gemma3 eps", decoders.gemma3("eps"), ("forward", "model.layers.0.input_layernorm", None)),
    # paddleformers 1.2 hands sliding-window layers the full layers' rotary embedding (a library gap):
    # its one rotary call pairs with transformers' sliding one, which the layers read.
    Case("gemma3 sliding layers", decoders.gemma3("sliding"), ("forward", "model.rotary_emb", None)),
    Case("ernie", ernie()),
    Case("ernie split", ernie("split"), ("forward", "model.layers.0.self_attn", None)),
    Case("ernie reshape", ernie("reshape"), ("forward", "model.layers.0.self_attn", None)),
    Case("ernie equivalent port", ernie("none")),
    Case("ernie adamw", ernie(train="adamw"), tags=("train",)),
    Case("ernie reversed", ernie(reverse=True)),
    Case("ernie reversed eps", ernie("torch eps", reverse=True), ("forward", "model.layers.0.input_layernorm", None)),
    Case("ernie reversed adamw", ernie(train="adamw", reverse=True), tags=("train",)),
    Case("encoder", encoder()),
    Case("encoder eps", encoder("eps"), ("forward", "layers.1.norm2", None)),
    Case("encoder act", encoder("act"), ("forward", "layers.0", None)),
    Case("encoder adamw", encoder(train="adamw"), tags=("train",)),
    Case("resnet", resnet()),
    Case("resnet batch 2 at 32 px", resnet(shape=(2, 3, 32, 32))),
    Case("resnet eps", resnet("eps"), ("forward", "layer2.0.bn2", None)),
    Case("resnet padding", resnet("padding"), ("forward", "conv1", None)),
    Case("resnet momentum", resnet("momentum"), ("state", "layer1.0.bn1", None), tags=("train",)),
    # paddle updates running_var with the biased batch variance, torch with the unbiased one: a
    # verified framework difference (a finding that does not fail), not the port's bug.
    Case("resnet adamw", resnet(train="adamw"), tags=("train",)),
    Case("mobilenet", mobilenet()),
    Case("mobilenet act", mobilenet("act"), ("forward", "features.2.conv.1.2", None)),
    Case("mobilenet eps", mobilenet("eps"), ("forward", "features.3.conv.3", None)),
    Case("shufflenet", shufflenet()),
    Case("shufflenet concat", shufflenet("concat"), ("forward", "stage2.1", None)),
    Case("shufflenet maxpool", shufflenet("maxpool"), ("forward", "maxpool", None)),
    Case("shufflenet custom layer", shufflenet("custom")),
    Case("shufflenet custom layer grad", shufflenet("custom grad"), ("backward", "conv1.2", None)),
    Case("shufflenet adamw", shufflenet(train="adamw"), tags=("train",)),
    Case("bert", bert()),
    Case("bert act", bert("act"), ("forward", "encoder.layer.0", None)),
    Case("bert eps", bert("eps"), ("forward", "encoder.layer.1.output.LayerNorm", None)),
    Case("bert adamw", bert(train="adamw"), tags=("train",)),
    Case("bert reversed", bert(reverse=True)),
    Case("bert reversed act", bert("act", reverse=True), ("forward", "encoder.layers.0", None)),
    Case("bert reversed eps", bert("eps", reverse=True), ("forward", "encoder.layers.1.norm2", None)),
    Case("gpt", gpt()),
    Case("gpt act", gpt("act"), ("forward", "h.0", None)),
    Case("gpt eps", gpt("eps"), ("forward", "h.1.ln_2", None)),
    Case("gpt adamw", gpt(train="adamw"), tags=("train",)),
    Case("gpt reversed", gpt(reverse=True)),
    Case("gpt reversed act", gpt("act", reverse=True), ("forward", "layers.0", None)),
    Case("gpt reversed eps", gpt("eps", reverse=True), ("forward", "layers.1.norm2", None)),
    Case("gpt reversed adamw", gpt(train="adamw", reverse=True), tags=("train",)),
    Case("mobilenet v3", mobilenet_v3()),
    Case("mobilenet v3 se", mobilenet_v3("se"), ("forward", "features.4.block.2.scale_activation", None)),
    Case("mobilenet v3 eps", mobilenet_v3("eps"), ("forward", "features.6.block.1.1", None)),
    Case("mobilenet v3 reversed", mobilenet_v3(reverse=True)),
    Case("mobilenet v3 reversed se", mobilenet_v3("se", reverse=True), ("forward", "blocks.3.mid_se.scale_activation", None)),
    Case("inception", inception()),
    Case("inception pool", inception("pool"), ("forward", "mixed_5b", None)),
    Case("inception eps", inception("eps"), ("forward", "mixed_5c.branch5x5_2.bn", None)),
    Case("inception reversed", inception(reverse=True)),
    Case("inception reversed pool", inception("pool", reverse=True), ("forward", "mixed_5b", None)),
    Case("inception reversed eps", inception("eps", reverse=True), ("forward", "mixed_5c.branch5x5_2.1", None)),
    Case("densenet", densenet()),
    Case("densenet eps", densenet("eps"), ("forward", "features.denseblock2.denselayer3.norm2+relu2", None)),
    Case("densenet relu", densenet("relu"), ("forward", "", None)),
    Case("densenet reversed", densenet(reverse=True)),
    Case("densenet reversed eps", densenet("eps", reverse=True), ("forward", "db_conv_3.conv3_3.bn_ac_func2._batch_norm", None)),
]  # fmt: skip
