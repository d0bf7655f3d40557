"""The one whole step every verb compares (``StepComparer.whole_step``)."""

import numpy as np
import pytest

from nbdiff.engine.comparer import BeforeCompare, StepComparer, StepComparison, WholeStep

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


class _Source:
    """A step source that says what it was asked, in order."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def before_compare(self, k, pairing, brec, rrec):
        self.asked.append("before")
        return BeforeCompare()

    def updates(self, k, pairing, brec, rrec, step):
        self.asked.append(f"updates after {len(step.diffs)} diffs")
        return StepComparison(notes=["u"])

    def state(self, k, brec, rrec):
        self.asked.append("state")
        return StepComparison(notes=["s"])


def test_a_whole_step_asks_its_source_in_the_order_every_verb_shares(monkeypatch):
    cmp = StepComparer(lambda a, b: None, "strict")
    seen = []
    monkeypatch.setattr(cmp, "pair", lambda b, r: ("pairing", ["paired"]))
    monkeypatch.setattr(cmp, "compare", lambda *a, **k: seen.append(a) or StepComparison(diffs=["d1", "d2"]))
    source = _Source()
    whole = cmp.whole_step(3, "brec", "rrec", source)
    assert source.asked == ["before", "updates after 2 diffs", "state"]
    assert whole.pairing == "pairing" and whole.notes == ["paired", "u", "s"] and whole.diffs == ["d1", "d2"]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("verb", ["auto_diff", "watch", "record + compare"])
def test_every_verb_compares_each_step_through_the_one_whole_step(verb, monkeypatch, tmp_path):
    calls = []
    whole_step = StepComparer.whole_step

    def counted(self, k, *args, **kwargs) -> WholeStep:
        whole = whole_step(self, k, *args, **kwargs)
        calls.append((k, [type(p).__name__ for p in whole.parts]))
        return whole

    monkeypatch.setattr(StepComparer, "whole_step", counted)
    base, raw = _net(), _net()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (base, raw)]
    xs = [np.random.RandomState(i).randn(6, 4).astype("float32") for i in range(3)]
    if verb == "auto_diff":
        result = nbdiff.auto_diff(base, raw, xs[0], optimizers=opts, steps=3)
    elif verb == "watch":
        with nbdiff.watch(base, raw) as w:
            for x in xs:
                for m, o in zip((base, raw), opts):
                    m(torch.tensor(x)).sum().backward()
                    o.step()
                    o.zero_grad()
        result = w.result
    else:
        for m, o, d in zip((base, raw), opts, ("a", "b")):
            with nbdiff.record(m, tmp_path / d):
                for x in xs:
                    m(torch.tensor(x)).sum().backward()
                    o.step()
                    o.zero_grad()
        result = nbdiff.compare(tmp_path / "a", tmp_path / "b")
    assert result, result.report()
    assert [k for k, _ in calls] == [0, 1, 2]


def _gated(fw: str):
    """Linear (the identity) -> ReLU -> Linear: a ReLU input is exactly the model's input."""
    import paddle

    nn = torch.nn if fw == "torch" else paddle.nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    if fw == "torch":
        with torch.no_grad():
            net[0].weight.copy_(torch.eye(8))
            net[0].bias.zero_()
    return net  # raw gets base's weights (auto_init)


@pytest.mark.parametrize("base_fw,raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_relu_mask_that_rounding_flipped_is_a_note_not_a_divergence(base_fw, raw_fw):
    # resnet adamw of the zoo failed on other CPUs: at step 1 a few ReLU inputs sat within rounding
    # of 0, their mask flipped, and every gradient behind them differed by whole values (190x), while
    # no layer's own error came near its tolerance ("inherited"). Base's own ReLU on raw's inputs gives
    # raw's gradients: rounding did it. Here raw's input is 1e-8 where base's is exactly 0.
    import paddle

    base, raw = _gated(base_fw), _gated(raw_fw)
    if base_fw == "paddle":
        base[0].weight.set_value(np.eye(8, dtype="float32"))
        base[0].bias.set_value(np.zeros(8, "float32"))
    x = np.tile(np.array([0, 0, 0, 0, 1, 2, 3, 4], "float32"), (2, 1))
    nudged = x + np.array([1e-8] * 4 + [0] * 4, "float32")
    tensor = lambda fw, a: torch.tensor(a) if fw == "torch" else paddle.to_tensor(a)  # noqa: E731
    result = nbdiff.auto_diff(base, raw, (tensor(base_fw, x), tensor(raw_fw, nudged)))
    assert result, result.report()
    assert any("not reported as a divergence" in w and "`1` (ReLU)" in w for w in result.warnings), result.warnings


def test_a_gate_with_its_own_wrong_backward_is_still_found():
    class Gate(torch.nn.Module):
        def forward(self, x):
            return x.clamp(min=0)  # at exactly 0, clamp hands the gradient on and ReLU does not

    base, raw = _gated("torch"), _gated("torch")
    raw[1] = Gate()
    result = nbdiff.auto_diff(base, raw, np.tile(np.array([0, 0, 0, 0, 1, 2, 3, 4], "float32"), (2, 1)))
    assert not result and result.first_divergence.raw_path == "1", result.report()
    assert not result.first_divergence.inherited
