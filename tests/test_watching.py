"""watch: the user's own loop, recorded and compared step by step."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402
from tests.dumps import CNN_X, momentum_pair  # noqa: E402


def _train_both(base, raw, x, steps, optimizer):
    """``steps`` steps of two torch models on ``x``, each stepped by its own ``optimizer`` (lr 1e-2)."""
    opts = [optimizer(m.parameters(), lr=1e-2) for m in (base, raw)]
    for _ in range(steps):
        for model, opt in zip((base, raw), opts):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()


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
        _train_both(base, raw, x, 2, torch.optim.Adam)
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


# -- long loops: compared while they run ---------------------------------------


class _Jitter(torch.nn.Module):
    """Draws from the global generator in forward (as a layer with its own noise does) and adds none of it."""

    def forward(self, x):
        return x + 0.0 * torch.rand_like(x)


def _paddle_jitter():
    import paddle

    class Jitter(paddle.nn.Layer):
        def forward(self, x):
            return x + 0.0 * paddle.rand(x.shape)

    return Jitter()


def _deep(fw, n, jitter=False):
    """``n`` small Linear+Tanh blocks, the same weights in either framework."""
    rng = np.random.RandomState(0)
    if fw == "torch":
        layers = []
        for _ in range(n):
            lin = torch.nn.Linear(8, 8)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(rng.randn(8, 8).astype("float32") * 0.3))
                lin.bias.zero_()
            layers += [lin, torch.nn.Tanh()] + ([_Jitter()] if jitter else [])
        return torch.nn.Sequential(*layers)
    paddle = pytest.importorskip("paddle")
    layers = []
    for _ in range(n):
        lin = paddle.nn.Linear(8, 8)
        lin.weight.set_value(rng.randn(8, 8).astype("float32").T * 0.3)
        lin.bias.set_value(np.zeros(8, "float32"))
        layers += [lin, paddle.nn.Tanh()] + ([_paddle_jitter()] if jitter else [])
    return paddle.nn.Sequential(*layers)


def _train(models, steps, *, accumulate=1, before_step=lambda k: None, after_update=lambda k, i, m: None):
    """The user's loop: each step base then raw on a batch drawn from torch's and paddle's global
    generators, SGD; with ``accumulate`` the gradients of that many calls are summed before one update.
    ``after_update(k, i, model)``: the user's code after model ``i``'s optimizer stepped in step ``k``."""
    paddle = _paddle() if any(fw == "paddle" for fw, _ in models) else None
    opts, losses = [], []
    for fw, m in models:
        if fw == "torch":
            opts.append(torch.optim.SGD(m.parameters(), lr=0.05))
        else:
            opts.append(paddle.optimizer.SGD(0.05, parameters=m.parameters()))
    pending = [0.0, 0.0]
    for k in range(steps):
        before_step(k)
        x = torch.randn(4, 8).numpy() + (paddle.randn([4, 8]).numpy() if paddle else 0.0)
        for i, ((fw, m), opt) in enumerate(zip(models, opts)):
            pending[i] = pending[i] + m(_tensor(fw, x)).square().mean()
            if (k + 1) % accumulate == 0:
                pending[i].backward()
                losses.append(float(pending[i].detach() if fw == "torch" else pending[i]))
                pending[i] = 0.0
                opt.step()
                opt.clear_grad() if fw == "paddle" else opt.zero_grad()
                after_update(k, i, m)
    return losses


def _paddle():
    import paddle

    return paddle


def _tensor(fw, x):
    if fw == "torch":
        return torch.from_numpy(x)
    import paddle

    return paddle.to_tensor(x)


def _params(fw, m):
    return [p.detach().numpy().copy() if fw == "torch" else p.numpy().copy() for p in m.parameters()]


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_long_watched_loop_computes_bit_for_bit_what_it_computes_alone(direction, accumulate):
    # Steps are compared while the loop runs (their old weights written into the models and back):
    # the loop's losses, final weights and random draws must be those of the loop without nbdiff,
    # also when gradients are accumulated over calls (a graph still to be backpropagated then).
    paddle = pytest.importorskip("paddle")
    bfw, rfw = direction.split("->")

    def run(watched):
        torch.manual_seed(3)
        paddle.seed(3)
        models = [(bfw, _deep(bfw, 4, jitter=True)), (rfw, _deep(rfw, 4, jitter=True))]
        if not watched:
            return _train(models, 9, accumulate=accumulate), [_params(fw, m) for fw, m in models], None
        with nbdiff.watch(models[0][1], models[1][1], layer_map=None) as w:
            losses = _train(models, 9, accumulate=accumulate)
        return losses, [_params(fw, m) for fw, m in models], w

    alone = run(False)
    losses, params, w = run(True)
    assert w.result and w.result.steps == 9, w.result.report()
    # The batches came from the user's generators, which nbdiff's own calls of a layer drawing from
    # them (the pairing probe, the replays) left alone.
    assert losses == alone[0]
    for a, b in zip(params, alone[1]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def _scaled_late(model, index, factor):
    """Layer ``index`` of ``model`` gives ``factor`` times its output (a port's bug)."""
    lin, inner = model[index], model[index].forward
    lin.forward = lambda x: inner(x) * factor


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_watched_loop_whose_steps_replay_computes_bit_for_bit_what_it_computes_alone(direction):
    # A step with a bug replays raw's layers on the weights the step ran with, written into the user's
    # models while the loop runs (from the second step on, raw's as base's updates would have left them):
    # the weights the loop holds go back, whole, before it goes on.
    paddle = pytest.importorskip("paddle")
    bfw, rfw = direction.split("->")

    def run(watched):
        torch.manual_seed(3)
        paddle.seed(3)
        models = [(bfw, _deep(bfw, 3)), (rfw, _deep(rfw, 3))]
        _scaled_late(models[1][1], 2, 1.01)
        if not watched:
            return _train(models, 6), [_params(fw, m) for fw, m in models], None
        with nbdiff.watch(models[0][1], models[1][1], layer_map=None) as w:
            losses = _train(models, 6)
        return losses, [_params(fw, m) for fw, m in models], w

    alone = run(False)
    losses, params, w = run(True)
    d = w.result.first_divergence
    assert d is not None and d.step == 0 and d.raw_path == "2", w.result.report()
    assert losses == alone[0]
    for a, b in zip(params, alone[1]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_a_watched_step_within_tolerance_replays_nothing_and_loads_no_weights(monkeypatch):
    # Only a step that fails replays its layers; loading the weights it ran with into both models (and
    # the loop's back after) cost a tenth of a watched step, every step.
    from nbdiff.trace.session import ModelSession

    loads = []
    real = ModelSession.load
    monkeypatch.setattr(ModelSession, "load", lambda self, weights: (loads.append(len(weights)), real(self, weights)))
    base, raw = _deep("torch", 3), _deep("torch", 3)
    torch.manual_seed(0)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([("torch", base), ("torch", raw)], 6)
    assert w.result.steps == 6 and w.result.first_divergence is None, w.result.report()
    assert loads == []
    _scaled_late(raw, 2, 1.01)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([("torch", base), ("torch", raw)], 3)
    d = w.result.first_divergence
    assert d is not None and d.step == 0 and d.raw_path == "2", w.result.report()
    assert loads, "a failing step replays on the weights it ran with"


def test_a_long_watch_holds_about_two_steps_of_its_recording():
    # A 100-layer model gained 2.7 MiB per step with memory_mib=0 (every step's records were held
    # until the block ended); now each step is compared once both models finished it, and let go.
    import gc
    import tracemalloc

    torch.manual_seed(0)
    base, raw = _deep("torch", 20), _deep("torch", 20)
    models = [("torch", base), ("torch", raw)]
    opts = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (base, raw)]
    x = torch.randn(4, 8)
    grown = {}
    tracemalloc.start()
    try:
        with nbdiff.watch(base, raw, memory_mib=0) as w:
            for k in range(40):
                for (_, m), opt in zip(models, opts):
                    opt.zero_grad()
                    m(x).square().mean().backward()
                    opt.step()
                if k in (9, 39):
                    gc.collect()
                    grown[k] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_step = (grown[39] - grown[9]) / 30
    assert per_step < 12 * 1024, f"{per_step / 1024:.1f} KiB per step"  # 40 layer calls a side: was ~130 KiB
    assert w.result and w.result.steps == 40, w.result.report()
    assert len(w.result.step_errors()) == 40  # the chart keeps every step
    # The events of the first 4 steps are kept, the rest summarised (and the note says how to keep them).
    assert {e.base.step for e in w.result.events} == {0, 1, 2, 3}
    assert any("keep_steps=40" in n for n in w.result.notes), w.result.notes


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_bug_that_starts_late_in_a_long_watch_is_blamed_at_its_step(direction):
    # Steps compared while the loop runs: the step the bug starts in is still the answer, with its events.
    pytest.importorskip("paddle")
    bfw, rfw = direction.split("->")
    base, raw = _deep(bfw, 3), _deep(rfw, 3)
    late = {"on": False}  # a code path the loop reaches from step 6 on (a cache past a length, a schedule)
    lin, inner = raw[2], raw[2].forward
    lin.forward = lambda x: inner(x) * 1.01 if late["on"] else inner(x)
    torch.manual_seed(0)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([(bfw, base), (rfw, raw)], 10, before_step=lambda k: late.update(on=k >= 6))
    d = w.result.first_divergence
    assert d is not None and d.step == 6 and d.raw_path == "2", w.result.report()
    assert any(e.base.step == 6 and e.raw.path == "2" for e in w.result.events)


def test_an_error_comparing_while_the_loop_runs_leaves_the_loop_alone_and_is_raised_at_the_end(monkeypatch):
    from nbdiff.engine.live.comparer import LiveComparer

    real = LiveComparer.compare
    seen = []

    def failing(self, *a, **k):
        seen.append(1)
        if len(seen) == 2:
            raise RuntimeError("comparing step 1 failed")
        return real(self, *a, **k)

    monkeypatch.setattr(LiveComparer, "compare", failing)
    base, raw = _deep("torch", 2), _deep("torch", 2)
    torch.manual_seed(0)
    w = nbdiff.watch(base, raw)
    with pytest.raises(RuntimeError, match="comparing step 1 failed"), w:
        losses = _train([("torch", base), ("torch", raw)], 6)
    assert len(losses) == 12  # the loop ran to its end
    assert len(seen) == 2  # nothing compared after the error
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in base.modules())


def test_keep_steps_is_checked_at_the_door():
    base, raw = _deep("torch", 1), _deep("torch", 1)
    with pytest.raises(nbdiff.OptionError, match="keep_steps=-1"):
        nbdiff.watch(base, raw, keep_steps=-1)


def _watched_training(base, raw, steps=3):
    import paddle
    import torch

    x = CNN_X
    opts = {}
    for m in (base, raw):
        m.train()
        if isinstance(m, torch.nn.Module):
            opts[id(m)] = (torch.optim.SGD(m.parameters(), lr=0.05), torch.tensor)
        else:
            opts[id(m)] = (paddle.optimizer.SGD(learning_rate=0.05, parameters=m.parameters()), paddle.to_tensor)
    with nbdiff.watch(base, raw) as w:
        for _ in range(steps):
            for m in (base, raw):
                opt, tensor = opts[id(m)]
                m(tensor(x)).pow(2).mean().backward()
                opt.step()
                opt.clear_grad() if hasattr(opt, "clear_grad") else opt.zero_grad()
    return w.result


@pytest.mark.parametrize("bug_in", ["paddle", "torch"])
@pytest.mark.parametrize("base_fw", ["torch", "paddle"])
def test_a_batchnorm_momentum_bug_is_found_by_watch_at_the_running_statistics(bug_in, base_fw):
    # Running statistics were compared by auto_diff only: watch said SUCCESS, and the models' eval
    # outputs differed after the loop.
    t, p = momentum_pair(bug_in)
    base, raw = (t, p) if base_fw == "torch" else (p, t)
    result = _watched_training(base, raw)
    d = result.first_divergence
    assert d is not None and (d.step, d.phase.value, d.base_path) == (0, "state", "bn1"), result.report()
    assert (d.parameter or "").startswith("bn1."), d


@pytest.mark.parametrize("base_fw", ["torch", "paddle"])
def test_a_watched_train_mode_batchnorm_keeps_to_the_framework_difference_over_steps(base_fw):
    # paddle's biased running_var is a framework difference: verified from raw's own value before each
    # step (a watched raw keeps its own statistics), it is noted, never a divergence, at every step.
    t, p = momentum_pair(None)
    base, raw = (t, p) if base_fw == "torch" else (p, t)
    result = _watched_training(base, raw, steps=4)
    assert result, result.report()
    noted = {(f.step, f.base_path) for f in result.findings if f.where == "framework"}
    assert {(0, "bn1"), (3, "bn1")} <= noted, result.report()


def test_framework_differences_fail_makes_a_watched_framework_difference_fail():
    # framework_differences= was auto_diff's only, while every verb's report told the user to set it.
    t, p = momentum_pair(None)
    import paddle
    import torch

    x = CNN_X
    with nbdiff.watch(t, p, framework_differences="fail") as w:
        t(torch.tensor(x)).pow(2).mean().backward()
        p(paddle.to_tensor(x)).pow(2).mean().backward()
    d = w.result.first_divergence
    assert not w.result and d is not None and d.where == "framework" and d.base_path == "bn1", w.result.report()
    with pytest.raises(nbdiff.OptionError, match="framework_differences"):
        nbdiff.watch(t, p, framework_differences="ignore")


def _scaled(model, fw, factor):
    weight = model[2].weight  # the second Linear
    if fw == "torch":
        with torch.no_grad():
            weight.mul_(factor)
    else:
        weight.set_value(weight.numpy() * factor)


@pytest.mark.parametrize("written", ["base", "raw"])
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch", "torch->torch"])
def test_a_weight_written_outside_the_optimizer_is_that_write_not_an_update(direction, written):
    # The port scales one weight in place after step 1's update (weight clipping, an EMA or spectral norm
    # code do so): the optimizers agree, so no update and no optimizer setting is to blame.
    if "paddle" in direction:
        pytest.importorskip("paddle")
    fws = direction.split("->")
    side = 0 if written == "base" else 1
    base, raw = _deep(fws[0], 3), _deep(fws[1], 3)

    def clip(k, i, m):
        if k == 1 and i == side:
            _scaled(m, fws[i], 1.05)

    torch.manual_seed(0)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([(fws[0], base), (fws[1], raw)], 4, after_update=clip)
    d = w.result.first_divergence
    assert d is not None and d.step == 1 and d.where == "outside", w.result.report()
    assert d.parameter == "2.weight" and f"{written}'s `2.weight` changed outside the optimizer" in d.describe()
    assert "between step 1's update and step 2 (norm x1.05)" in d.describe(), d.describe()
    assert "no optimizer setting" in d.why() and not d.arguments, d.why()


def test_the_same_write_on_both_sides_is_not_a_finding():
    base, raw = _deep("torch", 3), _deep("torch", 3)

    def clip(k, i, m):
        if k == 1:
            _scaled(m, "torch", 1.05)

    torch.manual_seed(0)
    with nbdiff.watch(base, raw, layer_map=None) as w:
        _train([("torch", base), ("torch", raw)], 4, after_update=clip)
    assert w.result.first_divergence is None, w.result.report()


def _late_wrapper(fw, inner):
    """The port's wrapper around the whole model, 1% off on the batches a long run reaches late."""
    base = torch.nn.Module if fw == "torch" else _paddle().nn.Layer

    class Late(base):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            out = self.inner(x)
            return out * 1.01 if float(x[0, 0, 0, 0]) == 7.0 else out

    return Late()


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_code_after_every_sublayer_that_goes_wrong_late_is_placed_after_them_though_the_weights_drifted(direction):
    # From step 2 on, raw's wrapper scales the output; by then Adam has moved the two sides' weights
    # apart by rounding, so conv1 makes another output from the same inputs: the blame said "before
    # `conv1`". A sublayer handed what base's was, whose own error passes, is not where the code went wrong.
    pytest.importorskip("paddle")
    from tests.fault_suite.models import BUILDERS

    bfw, rfw = direction.split("->")
    torch.manual_seed(0)
    _paddle().seed(0)
    base, inner = BUILDERS["cnn"](bfw), BUILDERS["cnn"](rfw)
    nbdiff.assign_weight(base, inner)
    raw = _late_wrapper(rfw, inner)
    adam = {"torch": lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
            "paddle": lambda m: _paddle().optimizer.Adam(1e-3, parameters=m.parameters())}  # fmt: skip
    opts = [adam[bfw](base), adam[rfw](raw)]
    rng = np.random.RandomState(0)
    with nbdiff.watch(base, raw) as w:
        for k in range(4):
            x = rng.randn(4, 3, 8, 8).astype("float32")
            x.flat[0] = 7.0 if k >= 2 else x.flat[0]
            for (fw, m), opt in zip(((bfw, base), (rfw, raw)), opts):
                m(_tensor(fw, x)).pow(2).mean().backward()
                opt.step()
                opt.clear_grad() if fw == "paddle" else opt.zero_grad()
    d = w.result.first_divergence
    assert d is not None and (d.step, d.where, d.between) == (2, "between", ("fc", None)), w.result.report()


@pytest.mark.parametrize("raw_fw", ["torch", "paddle"])
def test_the_users_own_forward_hooks_run_as_often_as_the_loop_calls_raw(raw_fw):
    # The pairing probe runs a copy of raw: the copy kept the user's hooks (4 runs for 3 calls), and a
    # hook of nbdiff's that copy could not take made it probe raw itself (one call more, and a warning).
    import paddle

    nn = torch.nn if raw_fw == "torch" else paddle.nn
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    raw = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    runs = []
    hook = lambda *a: runs.append(len(a))  # noqa: E731
    if raw_fw == "torch":
        raw[0].register_forward_pre_hook(hook)
        raw.register_forward_hook(hook)
    else:
        raw[0].register_forward_pre_hook(hook)
        raw.register_forward_post_hook(hook)
    x = np.ones((2, 4), "float32")
    with nbdiff.watch(base, raw) as w:
        for _ in range(3):
            base(torch.tensor(x)).sum().backward()
            raw(torch.tensor(x) if raw_fw == "torch" else paddle.to_tensor(x)).sum().backward()
    assert w.result, w.result.report()
    assert sorted(runs) == [2, 2, 2, 3, 3, 3]  # each hook once a call (pre: 2 arguments, post: 3)
    assert not [m for m in w.result.warnings if "could not be copied" in m]


def test_a_watch_let_go_of_frees_its_result_at_once_without_the_collector():
    # The watch held itself through its comparer (its tolerance, a bound method), and the comparer held the
    # watched steps (the last step's weight loader): a cell run again kept the last result, and every tensor
    # it recorded, till the collector's next full pass.
    import gc
    import weakref

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    raw = copy.deepcopy(base)
    x = torch.tensor(np.random.RandomState(1).randn(32, 8).astype("float32"))
    with nbdiff.watch(base, raw) as w:
        _train_both(base, raw, x, 4, torch.optim.SGD)
    assert w.result, w.result.report()
    result, events = weakref.ref(w.result), weakref.ref(w.result.events[-1])
    gc.disable()
    try:
        del w
        assert result() is None and events() is None
    finally:
        gc.enable()
