"""Stacked experts (3-D tensors in one layer) against a list of expert layers: the copy both ways."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402

E, H, I = 3, 8, 4  # noqa: E741
X = np.random.RandomState(0).randn(5, H).astype("float32")


class TopKRouter(torch.nn.Module):
    """transformers 5's router: a Linear's weight, ``[experts, hidden]``, applied by ``F.linear``."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(E, H))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight).softmax(-1)


class StackedExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * I, H))
        self.down_proj = torch.nn.Parameter(torch.randn(E, H, I))

    def forward(self, x, weights):
        out = torch.zeros_like(x)
        for e in range(E):
            gate, up = torch.nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
            out = out + weights[:, e : e + 1] * torch.nn.functional.linear(
                torch.nn.functional.silu(gate) * up, self.down_proj[e]
            )
        return out


class TorchMoE(torch.nn.Module):
    """A projection, then a mixture of experts (every expert, weighted: no top-k, so nothing ties)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(H, H)
        self.gate = TopKRouter()
        self.experts = StackedExperts()

    def forward(self, x):
        x = self.proj(x)
        return self.experts(x, self.gate(x))


class PaddleExpert(paddle.nn.Layer):
    def __init__(self, act=paddle.nn.functional.silu):
        super().__init__()
        self.up_gate_proj = paddle.nn.Linear(H, 2 * I, bias_attr=False)
        self.down_proj = paddle.nn.Linear(I, H, bias_attr=False)
        self.act = act

    def forward(self, x):
        gate, up = self.up_gate_proj(x).chunk(2, axis=-1)
        return self.down_proj(self.act(gate) * up)


class PaddleMoE(paddle.nn.Layer):
    def __init__(self, wrong_act_in=None):
        super().__init__()
        self.proj = paddle.nn.Linear(H, H)
        self.gate = paddle.nn.Linear(H, E, bias_attr=False)
        acts = [paddle.nn.functional.gelu if e == wrong_act_in else paddle.nn.functional.silu for e in range(E)]
        self.experts = paddle.nn.LayerList([PaddleExpert(act) for act in acts])

    def forward(self, x):
        x = self.proj(x)
        weights = paddle.nn.functional.softmax(self.gate(x), -1)
        return sum(weights[:, e : e + 1] * expert(x) for e, expert in enumerate(self.experts))


def _out(model):
    if isinstance(model, torch.nn.Module):
        return model(torch.from_numpy(X)).detach().numpy()
    return model(paddle.to_tensor(X)).numpy()


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_stacked_experts_and_their_router_copy_into_a_list_of_experts_and_back(direction):
    # Nothing was copied into the list's experts or the router (neither runs as a call of its own there).
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = TorchMoE(), PaddleMoE()
    if direction == "paddle->torch":
        base, raw = raw, base
    wmap = nbdiff.assign_weight(base, raw, inputs=X)
    assert not [w for w in wmap.warnings if "nothing was copied" in w or "was not paired" in w], wmap.warnings
    np.testing.assert_allclose(_out(raw), _out(base), rtol=1e-5, atol=1e-5)
    assert "stacked experts" in {lw.rule for lw in wmap.layers}


def test_an_equivalent_stacked_port_passes_and_a_wrong_expert_activation_is_found():
    torch.manual_seed(0)
    paddle.seed(0)
    result = nbdiff.auto_diff(TorchMoE(), PaddleMoE(), X)
    assert result, result.report()
    d = nbdiff.auto_diff(TorchMoE(), PaddleMoE(wrong_act_in=1), X).first_divergence
    assert d is not None and (d.phase.value, d.base_path) == ("forward", ""), d  # the mixture, in the root's code


class TorchSharedExpert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(H, 2 * I, bias=False)
        self.up_proj = torch.nn.Linear(H, 2 * I, bias=False)
        self.down_proj = torch.nn.Linear(2 * I, H, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TorchSharedMoE(TorchMoE):
    """transformers' Qwen2-MoE block: the shared expert (gate and up apart) runs first, then the router
    and the stacked experts, then the shared expert's gate."""

    def __init__(self):
        super().__init__()
        self.shared_expert = TorchSharedExpert()
        self.shared_expert_gate = torch.nn.Linear(H, 1, bias=False)

    def forward(self, x):
        x = self.proj(x)
        shared = self.shared_expert(x)
        out = self.experts(x, self.gate(x))
        return out + torch.sigmoid(self.shared_expert_gate(x)) * shared


class PaddleSharedMoE(PaddleMoE):
    """paddleformers' block: the router's Linear, the experts one by one, then the shared expert (gate and
    up fused; its fused weight is as big as an expert's down projection is not, and as the shared
    expert's down projection is) and its gate."""

    def __init__(self, shared_act=paddle.nn.functional.silu):
        super().__init__()
        self.shared_expert = PaddleExpert(shared_act)
        self.shared_expert.up_gate_proj = paddle.nn.Linear(H, 4 * I, bias_attr=False)
        self.shared_expert.down_proj = paddle.nn.Linear(2 * I, H, bias_attr=False)
        self.shared_expert_gate = paddle.nn.Linear(H, 1, bias_attr=False)

    def forward(self, x):
        out = super().forward(x)
        x = self.proj(x)
        return out + paddle.nn.functional.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


@pytest.mark.parametrize("reverse", [False, True], ids=["stack is base", "list is base"])
def test_a_list_of_experts_with_a_shared_expert_pairs_each_call_with_its_own_both_ways(reverse):
    # The list as the reference paired its router's Linear with the shared expert's fused projection and
    # an expert's projection with the shared expert's down projection (same class, the weight shapes of a
    # merged gate+up call unknown): a WeightTransferError on an equivalent pair.
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = TorchSharedMoE(), PaddleSharedMoE()
    if reverse:
        base, raw = raw, base
    result = nbdiff.auto_diff(base, raw, X)
    assert result, result.report()
    paired = {(e.base.path, e.raw.path) for e in result.events if e.base.path.startswith("shared")}
    assert paired == {
        ("shared_expert", "shared_expert"),
        ("shared_expert_gate", "shared_expert_gate"),
        ("shared_expert.down_proj", "shared_expert.down_proj"),
        ("shared_expert.up_gate_proj" if reverse else "shared_expert.gate_proj+up_proj",)
        + ("shared_expert.gate_proj+up_proj" if reverse else "shared_expert.up_gate_proj",),
    }, paired


@pytest.mark.parametrize("reverse", [False, True], ids=["stack is base", "list is base"])
def test_a_wrong_shared_expert_activation_is_blamed_at_the_shared_expert_both_ways(reverse):
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = TorchSharedMoE(), PaddleSharedMoE(shared_act=paddle.nn.functional.gelu)
    if reverse:
        base, raw = raw, base
    d = nbdiff.auto_diff(base, raw, X).first_divergence
    assert d is not None and d.phase.value == "forward" and d.base_path == "shared_expert", d
