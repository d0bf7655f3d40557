"""API-level pieces: op names, alignment of two call sequences, wrapping and custom ops."""

import types

import numpy as np
import pytest

from nbdiff.errors import OptionError
from nbdiff.trace import apis
from nbdiff.trace.apis import align_calls, canonical_op, register_api
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord


def _call(name, shape=(2, 3), order=0):
    out = (TensorRecord("out", shape, "float32", np.zeros(shape, "float32")),)
    return Event(0, Phase.FORWARD, Kind.API, order, f"::{name}", name, 0, 1, 0, False, (), out)


def test_canonical_names_bridge_the_two_frameworks():
    assert canonical_op("__matmul__") == canonical_op("mm") == canonical_op("matmul") == "matmul"
    assert canonical_op("__truediv__") == canonical_op("divide") == "divide"
    assert canonical_op("permute") == canonical_op("transpose")
    assert canonical_op("some_new_op") == "some_new_op"


def test_alignment_pairs_a_swap_and_skips_an_extra_call():
    base = [_call("linear", order=0), _call("gelu", order=1), _call("mul", order=2)]
    raw = [_call("linear", order=0), _call("reshape", (6,), order=1), _call("relu", order=2), _call("mul", order=3)]
    pairs = [(b.type_name, r.type_name) for b, r in align_calls(base, raw)]
    assert pairs == [("linear", "linear"), ("gelu", "relu"), ("mul", "mul")]
    assert align_calls(base, []) == []
    # Long sequences fall back to a greedy pass with the same strong matches.
    assert [(b.type_name, r.type_name) for b, r in align_calls(base, raw, max_cells=1)] == [
        ("linear", "linear"), ("mul", "mul"),
    ]  # fmt: skip


def test_register_api_pairs_and_intercepts_a_custom_op(monkeypatch):
    monkeypatch.setattr(apis, "CUSTOM_TARGETS", [])
    monkeypatch.setattr(apis, "CUSTOM_APIS", {})
    ops = types.SimpleNamespace(fused_gelu=lambda x: x)
    register_api("fused_gelu", "gelu", target=(ops, "fused_gelu"))
    assert canonical_op("fused_gelu") == "gelu"
    assert apis.CUSTOM_TARGETS == [(ops, "fused_gelu", "fused_gelu")]
    with pytest.raises(OptionError, match="no function 'missing'"):
        register_api("missing", target=(ops, "missing"))


def test_custom_op_is_traced_inside_a_torch_model(monkeypatch):
    torch = pytest.importorskip("torch")
    import nbdiff

    monkeypatch.setattr(apis, "CUSTOM_TARGETS", [])
    ops = types.SimpleNamespace(scale=lambda x: x * 2.0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return ops.scale(self.fc(x))

    register_api("scale", target=(ops, "scale"))
    x = np.ones((2, 4), "float32")
    result = nbdiff.auto_diff(Net(), Net(), x, api_level=True)
    assert result and any(e.base.path == "::scale" for e in result.events)


@pytest.mark.parametrize("raw_fill", [float("-inf"), -1e9])
def test_a_mask_of_minus_inf_and_one_of_minus_1e9_agree_at_api_level(raw_fill):
    """Base masks attention scores with ``-inf``, the port with ``-1e9`` or ``-inf`` (all common): the
    same mask. It was an infinite error at ``masked_fill`` (``inf`` on the group row), and a mask of
    ``-inf`` on both sides was blamed as making Inf from finite inputs: false alarms."""
    torch = pytest.importorskip("torch")
    import nbdiff

    class Attention(torch.nn.Module):
        def __init__(self, fill):
            super().__init__()
            self.fill = fill
            self.q, self.o = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            q = self.q(x)
            causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
            scores = (q @ q.transpose(-2, -1)).masked_fill(causal, self.fill)
            return self.o(scores.softmax(-1) @ q)

    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    result = nbdiff.auto_diff(Attention(float("-inf")), Attention(raw_fill), x, api_level=True)
    assert result, result.report()
    masked = [t for d in result.events if d.base.path.endswith("masked_fill") for t in d.tensors]
    assert masked and all(t.passed for t in masked)
    if raw_fill != float("-inf"):
        assert all("masked alike" in t.note for t in masked)


def test_a_code_blame_under_api_level_tracing_does_not_ask_for_api_level_tracing():
    # With api_level=True every recorded call agreed; the blame said "run again with api_level=True".
    torch = pytest.importorskip("torch")
    import nbdiff

    class Net(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.fc, self.scale = torch.nn.Linear(4, 4), scale

        def forward(self, x):
            y = torch.tanh(self.fc(x)).sum(-1)
            return y.mul_(self.scale)  # in place: API-level tracing leaves such writes out

    torch.manual_seed(0)
    base, raw = Net(1.0), Net(1.0)
    raw.load_state_dict(base.state_dict())
    raw.scale = 1.01
    x = np.random.RandomState(0).randn(2, 4).astype("float32")
    d = nbdiff.auto_diff(base, raw, x, api_level=True).first_divergence
    assert d.where == "between" and any("::" in (b or "") for b in d.between), d.describe()
    assert "api_level=True" not in d.why(), d.why()
    plain = nbdiff.auto_diff(base, raw, x).first_divergence
    assert plain.where == "between" and "api_level=True" in plain.why(), plain.why()
