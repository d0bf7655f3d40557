"""More real decoder pairs for the zoo (transformers <-> paddleformers, tiny configs, no downloads).

Gemma 3: query/key norms, a norm after each block's attention and MLP, q/k/v and gate/up fused on
paddleformers' side, and a rotary embedding per attention kind: transformers computes one for the
sliding-window layers (base 10,000) and one for the full ones (1,000,000); paddleformers 1.2 computes
the full layers' for all of them ("TODO: apply different RoPE settings based on 'layer_type'").
Phi-3: q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_proj`` on both sides.
Qwen3-MoE: experts stacked as 3-D weights on transformers' side (one grouped call for all of them),
a ``LayerList`` of expert MLPs on paddleformers'; no shared expert.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

BASE = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
)  # fmt: skip
PHI3 = dict(BASE, pad_token_id=0)
GEMMA3 = dict(BASE, sliding_window=4, query_pre_attn_scalar=8, layer_types=["full_attention"] * 2)
QWEN3_MOE = dict(
    BASE, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True
)


def _fleet_ops_stand_in() -> None:
    """paddleformers' MoE modules import ``paddlefleet_ops`` (GPU kernels, not on PyPI) for their fused
    all-to-all: an empty stand-in saying it is not there lets the plain model import."""
    if "paddlefleet_ops" not in sys.modules:
        stub = types.ModuleType("paddlefleet_ops")
        stub.is_deep_ep_available = lambda: False  # type: ignore[attr-defined]
        stub.deep_gemm = None  # type: ignore[attr-defined]
        sys.modules["paddlefleet_ops"] = stub


def _ported(cfg: dict[str, Any], bug: str | None) -> dict[str, Any]:
    """paddleformers' config: its fused RMSNorm kernel has no CPU build; ``eps``: the port's epsilon;
    ``act``: its activation is GELU."""
    return dict(
        cfg,
        fuse_rms_norm=False,
        **({"rms_norm_eps": 1e-5} if bug == "eps" else {}),
        **({"hidden_act": "gelu"} if bug == "act" else {}),
    )


def _pair(
    family: str, config: str, model: str, cfg: dict[str, Any], bug: str | None, deprecated: bool = False
) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """transformers' ``model`` of ``config`` against paddleformers' of the same names, in module
    ``family`` (``…Deprecated``: the plain model where the other builds the fleet one)."""

    def build() -> tuple[Any, Any, Any, dict[str, Any]]:
        import importlib

        import transformers

        from tests.zoo.pairs import _paddleformers_qwen2, _seed, _token_inputs

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _paddleformers_qwen2()  # the fleet-only stand-in
            _fleet_ops_stand_in()
            ours = f"paddleformers.transformers.{family}"
            p_config = getattr(importlib.import_module(f"{ours}.configuration"), config)
            p_model = getattr(importlib.import_module(f"{ours}.modeling"), model + ("Deprecated" if deprecated else ""))
            _seed()
            base = getattr(transformers, model)(getattr(transformers, config)(**cfg))
            raw = p_model(p_config(**_ported(cfg, bug)))
        return base, raw, _token_inputs(cfg["vocab_size"]), {}

    return build


def gemma3(bug: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    """``eps``: the port's RMSNorm epsilon; ``sliding``: sliding-window layers, where paddleformers
    hands them the full layers' rotary embedding."""
    cfg = dict(GEMMA3, layer_types=["sliding_attention"] * 2) if bug == "sliding" else GEMMA3
    return _pair("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", cfg, bug)


def qwen3_moe(bug: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    return _pair("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3_MOE, bug, deprecated=True)


def phi3(bug: str | None = None) -> Callable[[], tuple[Any, Any, Any, dict[str, Any]]]:
    return _pair("phi3", "Phi3Config", "Phi3ForCausalLM", PHI3, bug)
