"""Single-step feeding: the guessed feed, its check against the pairing, and raw run once when right."""

import numpy as np
import pytest

from nbdiff.engine.live.feed import path_guess, same_feed
from nbdiff.engine.types import StepRecord
from nbdiff.trace.calls import Feed
from nbdiff.trace.events import Event, Kind, Phase


def test_path_guess_follows_renamed_layers_and_their_parents():
    guess = path_guess([("l0.fc", "m0.fc"), ("head", "classifier"), ("", "")])
    assert guess("l0.fc") == "m0.fc"
    assert guess("l0") == "m0" and guess("l0.act") == "m0.act"  # a parameter-free sibling moves with its parent
    assert guess("head.act") == "classifier.act"
    assert guess("norm") == "norm" and guess("") == ""


def _event(path, call=0):
    return Event(0, Phase.FORWARD, Kind.LAYER, 0, path, "L", call, 1, None, False, (), ())


def test_same_feed_compares_what_each_raw_call_was_given():
    a, b = np.ones(3), np.zeros(3)
    rrec = StepRecord([_event("x"), _event("y")], [], [])
    right = Feed({("x", 0): [a], ("y", 0): [b]}, {("x", 0): {"out": a}})
    assert same_feed(Feed({("x", 0): [a], ("y", 0): [b]}, {("x", 0): {"out": a}}), right, rrec)
    # Equal values in a new array (a fused group's concatenation) are the same feed.
    assert same_feed(Feed({("x", 0): [a.copy()], ("y", 0): [b]}, {("x", 0): {"out": a}}), right, rrec)
    assert not same_feed(Feed({("x", 0): [a]}, {("x", 0): {"out": a}}), right, rrec)  # y was not fed
    assert not same_feed(Feed({("x", 0): [b], ("y", 0): [b]}, {("x", 0): {"out": a}}), right, rrec)
    assert not same_feed(Feed({("x", 0): [a], ("y", 0): [b]}, {}), right, rrec)  # no gradient fed
    # A feed for a call raw never made does not matter.
    assert same_feed(Feed({("x", 0): [a], ("y", 0): [b], ("z", 0): [a]}, {("x", 0): {"out": a}}), right, rrec)


torch = pytest.importorskip("torch")
import nbdiff  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, act_name="act", act=torch.nn.Tanh):
        super().__init__()
        self.fc1, self.bn, self.fc2 = torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)
        self.act_name = act_name
        setattr(self, act_name, act())

    def forward(self, x):
        return self.fc2(getattr(self, self.act_name)(self.bn(self.fc1(x))))


X = np.random.default_rng(0).standard_normal((5, 6)).astype("float32")


@pytest.fixture()
def raw_steps(monkeypatch):
    """The steps raw is run for (not counting replays of single layers)."""
    import nbdiff.engine.live.steps as live_steps

    calls, run_step = [], live_steps.run_step

    def counted(*args, **kwargs):
        calls.extend([kwargs["step"]] if kwargs["side"] == "raw" else [])
        return run_step(*args, **kwargs)

    monkeypatch.setattr(live_steps, "run_step", counted)
    return calls


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("single_step", [True, False])
def test_raw_runs_once_per_step_when_the_guess_is_right(steps, single_step, raw_steps):
    torch.manual_seed(0)
    base, raw = Net(), Net()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (base, raw)]
    # Before: single-step fed steps after the first with the first step's base inputs (bn blamed at
    # step 1); and both modes ran step 0 twice, as the weight plan of torch's Tanh was not the copy's.
    result = nbdiff.auto_diff(base, raw, X, optimizers=opts, steps=steps, single_step=single_step)
    assert result, result.report()
    assert raw_steps == list(range(steps))  # and no first no-grad raw forward to pair the calls


@pytest.mark.parametrize("steps", [1, 3])
def test_a_wrong_guess_runs_raw_again_from_where_it_started(steps, raw_steps):
    torch.manual_seed(0)
    base, raw = Net(), Net(act_name="activation")  # a parameter-free layer renamed: the guess misses it
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (base, raw)]
    result = nbdiff.auto_diff(base, raw, X, optimizers=opts, steps=steps, single_step=True)
    assert result, result.report()
    assert raw_steps == [0, *range(steps)]  # step 0 twice, then once per step
    # Running statistics were updated once per step (restored before the second run), as base's.
    assert torch.allclose(base.bn.running_mean, raw.bn.running_mean, atol=1e-6)
    act = [d for d in result.events if d.raw.path == "activation" and d.base.phase is Phase.FORWARD]
    assert act and act[0].base.path == "act" and act[0].raw.given  # fed base's input


def test_a_bug_behind_a_wrong_guess_is_blamed_at_its_layer():
    base, raw = Net(), Net(act_name="activation", act=torch.nn.Sigmoid)
    d = nbdiff.auto_diff(base, raw, X, single_step=True).first_divergence
    assert (d.phase.value, d.raw_path, d.inherited) == ("forward", "activation", False)


class _Attention(torch.nn.Module):
    """Scores masked by a mask handed in: ``additive`` (0 and -inf, paddle's and GPT-2's convention) or
    boolean (True: attend, transformers' sliding-window masks)."""

    def __init__(self, additive):
        super().__init__()
        self.q, self.additive = torch.nn.Linear(6, 6), additive

    def forward(self, x, mask):
        scores = self.q(x) @ x.transpose(-1, -2)
        scores = scores + mask if self.additive else scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ x


class _Masked(torch.nn.Module):
    def __init__(self, additive):
        super().__init__()
        self.additive, self.attn = additive, _Attention(additive)

    def forward(self, x):
        keep = torch.ones(5, 5, dtype=torch.bool).tril()
        mask = torch.zeros(5, 5).masked_fill(~keep, float("-inf")) if self.additive else keep
        return self.attn(x, mask)


@pytest.mark.parametrize("base_additive", [False, True], ids=["bool into additive", "additive into bool"])
def test_a_mask_in_another_convention_is_not_fed_into_raws_layer(base_additive):
    # Single-step fed raw's attention base's boolean mask where raw adds a float one: paddleformers'
    # Gemma 3 raised "Type promotion ... float32, y: bool"; torch added True as 1.0 and blamed the layer.
    torch.manual_seed(0)
    base, raw = _Masked(base_additive), _Masked(not base_additive)
    raw.load_state_dict(base.state_dict())
    for single_step in (False, True):
        result = nbdiff.auto_diff(base, raw, X, single_step=single_step)
        assert result, result.report()
