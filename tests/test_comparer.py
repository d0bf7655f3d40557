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


# -- pairing once per check: a step built as the last one takes its pairing --------------------------
def _pair_form(pairing):
    """What a pairing decided, by path and call (events are each step's own)."""
    at = lambda e: (e.path, e.call)  # noqa: E731
    return (
        [(at(p.base), at(p.raw), p.explicit, p.members) for p in pairing.pairs],
        [at(e) for e in pairing.unmatched_base],
        [at(e) for e in pairing.unmatched_raw],
        pairing.fused,
    )


def _spied_pairing(monkeypatch):
    """Each ``pair_step`` the comparer makes: whether it took the last step's pairing, and whether that
    equals what searching again finds."""
    import nbdiff.engine.comparer as comparer

    real, seen = comparer.pair_step, []

    def spied(brec, rrec, layer_map, blayers, rlayers, required=True, like=None):
        found = real(brec, rrec, layer_map, blayers, rlayers, required, like)
        searched = real(brec, rrec, layer_map, blayers, rlayers, required) if like is not None else found
        seen.append((like is not None, _pair_form(found) == _pair_form(searched), found))
        return found

    monkeypatch.setattr(comparer, "pair_step", spied)
    return seen


def _fused_pair(direction: str):
    """Separate q/k/v and gate/up projections against fused ones (``tests/test_fused.py``)."""
    from tests.test_fused import PAIRS

    make_base, make_raw = PAIRS[direction]
    return make_base(), make_raw()


def _train(fw_model, x):
    """One forward, backward and SGD step of a torch or paddle model."""
    import paddle

    m, opt = fw_model
    if isinstance(m, torch.nn.Module):
        out = m(torch.tensor(x))
        (out * out).mean().backward()
        opt.step()
        opt.zero_grad()
    else:
        out = m(paddle.to_tensor(x))
        (out * out).mean().backward()
        opt.step()
        opt.clear_grad()


def _sgd(m):
    import paddle

    if isinstance(m, torch.nn.Module):
        return torch.optim.SGD(m.parameters(), lr=0.05)
    return paddle.optimizer.SGD(0.05, parameters=m.parameters())


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
@pytest.mark.parametrize("verb", ["auto_diff", "watch", "record + compare"])
def test_steps_built_alike_are_paired_once_as_searching_again_would_pair_them(verb, direction, monkeypatch, tmp_path):
    seen = _spied_pairing(monkeypatch)
    # Weights of one draw: paddle's were the global generator's, as earlier tests left it, and some draws
    # made SGD at this rate blow up by step 2 (paddle's silu then gives NaN where torch's stays finite).
    import paddle

    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = _fused_pair(direction)
    xs = [np.random.RandomState(i).randn(3, 5, 8).astype("float32") for i in range(4)]
    if verb == "auto_diff":
        result = nbdiff.auto_diff(base, raw, xs[0], optimizers=[_sgd(base), _sgd(raw)], steps=4)
    elif verb == "watch":
        pairs = [(base, _sgd(base)), (raw, _sgd(raw))]
        with nbdiff.watch(base, raw) as w:
            for x in xs:
                for side in pairs:
                    _train(side, x)
        result = w.result
    else:
        nbdiff.assign_weight(base, raw)
        for m, d in zip((base, raw), ("a", "b")):
            side = (m, _sgd(m))
            with nbdiff.record(m, tmp_path / d):
                for x in xs:
                    _train(side, x)
        result = nbdiff.compare(tmp_path / "a", tmp_path / "b")
    assert result, result.report()
    taken = [taken for taken, _, _ in seen]
    # Searched once (twice for watch, whose first raw step runs on the probe's copy) and taken after.
    assert len(taken) >= 4 and taken[-2:] == [True, True] and taken.count(False) == (2 if verb == "watch" else 1)
    assert all(same for _, same, _ in seen)
    assert all(p.fused for _, _, p in seen)  # the fused groups came along


class _Sometimes(torch.nn.Module):
    """A model that runs an extra layer every other call (its own counter: state the user keeps)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.extra, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.tanh(self.fc(x))
        if self.calls % 2 == 0:
            h = self.extra(h)
        return self.head(h)


def test_a_step_whose_calls_differ_from_the_last_ones_is_paired_again(monkeypatch):
    seen = _spied_pairing(monkeypatch)
    base, raw = _Sometimes(), _Sometimes()
    sides = [(base, _sgd(base)), (raw, _sgd(raw))]
    with nbdiff.watch(base, raw) as w:
        for i in range(4):
            for side in sides:
                _train(side, np.random.RandomState(i).randn(3, 4).astype("float32"))
    assert w.result, w.result.report()
    assert base.calls == raw.calls == 4  # called as often as the loop calls it
    assert not any(taken for taken, _, _ in seen)
    extra = [any(p.base.path == "extra" and p.raw.path == "extra" for p in pairing.pairs) for _, _, pairing in seen]
    assert extra[-4:] == [False, True, False, True], extra  # the four steps (watch pairs its probe first)
