"""Optimizer settings per parameter, in one meaning for torch and paddle, and the blame that names them."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.align.optimizer_settings import optimizer_diffs, optimizer_settings  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _torch(layer, **kw):
    return torch.optim.AdamW(layer.parameters(), lr=1e-2, **kw)


def _paddle(layer, cls="AdamW", **kw):
    return getattr(paddle.optimizer, cls)(learning_rate=1e-2, parameters=layer.parameters(), **kw)


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
@pytest.mark.parametrize(
    "make_paddle, param, expect",
    [
        (lambda p: _paddle(p, weight_decay=0.01), "bias", []),
        (lambda p: _paddle(p, weight_decay=0.1), "bias", [("weight_decay", 0.01, 0.1)]),
        (lambda p: _paddle(p, "Adam", weight_decay=0.01), "bias", [("decay style", "decoupled", "L2")]),
        # a decay filter that leaves biases out (paddlenlp's usual) against torch decaying everything
        (lambda p: _paddle(p, weight_decay=0.01, apply_decay_param_fun=lambda n: "w_" in n), "bias",
         [("weight_decay", 0.01, 0.0), ("decay style", "decoupled", "none")]),
        (lambda p: _paddle(p, weight_decay=0.01, apply_decay_param_fun=lambda n: "w_" in n), "weight", []),
        (lambda p: _paddle(p, weight_decay=0.01, epsilon=1e-6), "weight", [("eps", 1e-8, 1e-6)]),
    ],
)  # fmt: skip
def test_settings_for_one_parameter(direction, make_paddle, param, expect):
    t, p = torch.nn.Linear(2, 2), paddle.nn.Linear(2, 2)
    topt, popt = _torch(t, weight_decay=0.01), make_paddle(p)
    tp, pp = getattr(t, param), getattr(p, param)
    if direction == "torch->paddle":
        found = optimizer_diffs(topt, tp, popt, pp)
        assert [(d.name, d.base, d.raw) for d in found] == expect
    else:
        found = optimizer_diffs(popt, pp, topt, tp)
        assert [(d.name, d.raw, d.base) for d in found] == expect


def test_a_blamed_update_names_the_optimizer_settings():
    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    topt = torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01)
    popt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.1)
    result = nbdiff.auto_diff(tb, pb, inputs("mlp"), optimizers=[topt, popt], steps=2)
    d = result.first_divergence
    assert (d.phase.value, d.where) == ("optimizer", "parameter") and d.why() == "weight_decay: base 0.01, raw 0.1"
    assert "optimizer settings differ: weight_decay: base 0.01, raw 0.1" in result.report()


def test_watch_finds_the_optimizers_the_cell_steps():
    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    x = inputs("mlp")
    with nbdiff.watch(tb, pb) as w:
        topt = torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01)
        popt = paddle.optimizer.Adam(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.01)
        tb(torch.tensor(x)).pow(2).mean().backward()
        topt.step()  # base's step
        pb(paddle.to_tensor(np.asarray(x))).pow(2).mean().backward()
        popt.step()  # raw's step
    d = w.result.first_divergence
    assert d.why() == "decay style: base 'decoupled', raw 'L2'"
    # The update's stack is where each optimizer stepped, not the forward's.
    lines = open(__file__).read().splitlines()
    assert "base's step" in lines[d.base_stack[0].lineno - 1] and "raw's step" in lines[d.raw_stack[0].lineno - 1]
    # the hooks that found them are gone
    from nbdiff.frameworks.patching import active_patches

    assert active_patches() == 0


def test_the_learning_rate_is_the_one_of_the_blamed_step():
    # Schedules that agree at step 0 and part at step 1: the blame reads step 1's rates, not the last ones.
    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    x = inputs("mlp")
    with nbdiff.watch(tb, pb) as w:
        topt = torch.optim.SGD(tb.parameters(), lr=0.1)
        tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.5)
        psched = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.9)
        popt = paddle.optimizer.SGD(learning_rate=psched, parameters=pb.parameters())
        for _ in range(3):
            tb(torch.tensor(x)).pow(2).mean().backward()
            topt.step()
            topt.zero_grad()
            tsched.step()
            pb(paddle.to_tensor(np.asarray(x))).pow(2).mean().backward()
            popt.step()
            popt.clear_grad()
            psched.step()
    d = w.result.first_divergence
    assert (d.step, d.phase.value) == (1, "optimizer") and d.why() == "lr: base 0.05, raw 0.09", d.why()


def _grouped(fw, model, lr, head_lr):
    """An SGD whose last layer (``fc3``) is a parameter group of its own learning rate (``None``: one group)."""
    head = list(model.fc3.parameters())
    rest = [p for n, p in model.named_parameters() if not n.startswith("fc3.")]
    if fw == "torch":
        groups = [{"params": rest}, {"params": head, "lr": head_lr}] if head_lr else model.parameters()
        return torch.optim.SGD(groups, lr=lr)
    # paddle: a group's learning_rate scales the optimizer's
    groups = [{"params": rest}, {"params": head, "learning_rate": head_lr / lr}] if head_lr else model.parameters()
    return paddle.optimizer.SGD(learning_rate=lr, parameters=groups)


@pytest.mark.parametrize("grouped", ["torch", "paddle"])
@pytest.mark.parametrize("verb", ["auto_diff", "watch"])
def test_a_learning_rate_set_for_one_parameter_group_is_named_for_every_parameter_of_it(grouped, verb):
    # Only the optimizer's first group was read (torch), or no parameter was found in paddle's list of
    # groups: the update was blamed with why() empty and no settings table.
    t, p = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    topt = _grouped("torch", t, 0.1, 0.3 if grouped == "torch" else None)
    popt = _grouped("paddle", p, 0.1, 0.3 if grouped == "paddle" else None)
    (base, bopt), (raw, ropt) = ((t, topt), (p, popt)) if grouped == "paddle" else ((p, popt), (t, topt))
    x = inputs("mlp")
    if verb == "auto_diff":
        result = nbdiff.auto_diff(base, raw, x, optimizers=[bopt, ropt], steps=2)
    else:
        fws = {id(t): lambda a: torch.tensor(a), id(p): lambda a: paddle.to_tensor(a)}
        with nbdiff.watch(base, raw) as w:
            for model, opt in ((base, bopt), (raw, ropt)):
                model(fws[id(model)](x)).pow(2).mean().backward()
                opt.step()
        result = w.result
    d = result.first_divergence
    assert (d.phase.value, d.base_path) == ("optimizer", "fc3"), d
    assert d.why() == "lr: base 0.1, raw 0.3", d.why()
    rows = result.options["optimizer_settings"]
    assert ["lr", 0.1, 0.3] in [[k, round(a, 6), round(b, 6)] for k, a, b in rows["fc3"] if k == "lr"]
    assert ["lr", 0.1, 0.1] in [[k, round(a, 6), round(b, 6)] for k, a, b in rows["fc1"] if k == "lr"]


def test_a_setting_only_one_optimizer_has_differs_only_away_from_its_neutral_value():
    from nbdiff.align.optimizer_settings import setting_differs

    assert not setting_differs(0.0, None) and not setting_differs(None, "none") and not setting_differs(None, None)
    assert setting_differs(0.9, None) and setting_differs(None, "ClipGradByNorm")
    assert not setting_differs(0.1, 0.1 + 1e-12) and setting_differs(0.1, 0.3) and setting_differs("L2", "none")


def test_paddle_settings_are_read_per_parameter_group_even_after_a_step():
    # paddle writes each group's settings onto the optimizer while it steps: after a step, its attributes
    # held the last group's, so every parameter read as having the head group's weight decay and beta1.
    m = paddle.nn.Linear(4, 4)
    groups = [{"params": [m.weight]}, {"params": [m.bias], "weight_decay": 0.5, "beta1": 0.8}]
    opt = paddle.optimizer.AdamW(0.1, parameters=groups, weight_decay=0.01)
    m(paddle.ones([2, 4])).sum().backward()
    opt.step()
    body, head = optimizer_settings(opt, m.weight), optimizer_settings(opt, m.bias)
    assert (body["weight_decay"], body["betas"][0]) == (0.01, 0.9)
    assert (head["weight_decay"], head["betas"][0]) == (0.5, 0.8)
    momentum = paddle.optimizer.Momentum(
        0.1, 0.9, parameters=[{"params": [m.weight]}, {"params": [m.bias], "momentum": 0.5}]
    )
    momentum.step()
    assert (optimizer_settings(momentum, m.weight)["momentum"], optimizer_settings(momentum, m.bias)["momentum"]) == (
        0.9,
        0.5,
    )
