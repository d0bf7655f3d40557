"""watch: the user's own loop, recorded and compared step by step."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


def test_raw_gets_base_weights_from_before_base_stepped():
    # Base's whole step (its optimizer included) runs before raw's first call. When the weights are
    # copied then (pairing by execution), they must be base's as its step 0 began, not its updated ones.
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    raw = copy.deepcopy(base)
    with torch.no_grad():
        for p in raw.parameters():
            p.add_(1.0)  # auto_init must replace these
    x = torch.tensor(np.random.RandomState(1).randn(32, 8).astype("float32"))
    with nbdiff.watch(base, raw) as w:
        opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (base, raw)]
        for _ in range(2):
            for model, opt in zip((base, raw), opts):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    assert w.result, w.result.report()
    for b, r in zip(base.parameters(), raw.parameters()):
        torch.testing.assert_close(b, r, rtol=0, atol=1e-6)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_decode_loop_with_a_kv_cache_calls_raw_only_as_often_as_the_loop(direction):
    # watch's pairing probe ran raw once more, which appended to raw's cache: an equivalent pair of
    # decode loops then failed at step 0 ("code of <root> between qkv and proj").
    paddle = pytest.importorskip("paddle")
    from tests.structure_models import decoders

    bfw, rfw = direction.split("->")
    base, raw = decoders(direction)
    tokens = np.random.RandomState(0).randn(8, 2, 1, 8).astype("float32")

    def tensor(fw, a):
        return torch.from_numpy(a) if fw == "torch" else paddle.to_tensor(a)

    with nbdiff.watch(base, raw) as w:
        for t in tokens:
            with torch.no_grad(), paddle.no_grad():
                base(tensor(bfw, t))
                raw(tensor(rfw, t))
    assert raw.calls == base.calls == 8 and len(raw.cache) == len(base.cache) == 8
    assert w.result and w.result.steps == 8, w.result.report()


class _Attention(torch.nn.Module):
    """Keeps its dropout rate as a float and applies it itself, as transformers' attention layers do."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_dropout = 0.25
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.dropout(self.proj(x), p=self.attention_dropout, training=self.training)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_watching_says_it_turned_dropout_off_and_puts_it_back(direction):
    paddle = pytest.importorskip("paddle")
    bfw, rfw = direction.split("->")

    def model(fw):
        if fw == "torch":
            return torch.nn.Sequential(_Attention(), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4))
        return paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Dropout(0.3), paddle.nn.Linear(8, 4))

    torch.manual_seed(0)
    base, raw = model(bfw), model(rfw)
    x = np.ones((2, 8), "float32")
    t = lambda fw: torch.from_numpy(x) if fw == "torch" else paddle.to_tensor(x)  # noqa: E731
    with nbdiff.watch(base, raw, layer_map=None) as w:
        for _ in range(2):
            base(t(bfw))
            raw(t(rfw))
    said = [m for m in w.result.warnings if m.startswith("dropout was off while watching")]
    assert len(said) == 1, w.result.warnings
    torch_side = "base" if bfw == "torch" else "raw"
    assert f"{torch_side} 0.attention_dropout=0.25" in said[0] and f"{torch_side} 1.p=0.3" in said[0]
    # Put back as the user had them.
    tm = base if bfw == "torch" else raw
    pm = raw if bfw == "torch" else base
    assert tm[0].attention_dropout == 0.25 and tm[1].p == 0.3 and pm[1].p == 0.3
    # Both ran deterministic while watched: the outputs agreed (no dropout mask drawn).
    assert w.result, w.result.report()


def test_a_ctrl_c_in_a_script_keeps_the_steps_both_models_completed():
    paddle = pytest.importorskip("paddle")
    from tests.fault_suite.models import BUILDERS, inputs

    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    x = inputs("mlp")
    w = nbdiff.watch(tb, pb)
    with pytest.raises(KeyboardInterrupt), w:
        for i in range(5):
            tb(torch.tensor(x)).mean().backward()
            if i == 3:
                raise KeyboardInterrupt  # in step 3, base's part done
            pb(paddle.to_tensor(x)).mean().backward()
    assert w.result is not None and w.result.steps == 3 and w.result, w.result.report()
    assert any(m.startswith("interrupted in step 3") for m in w.result.warnings)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in tb.modules())
