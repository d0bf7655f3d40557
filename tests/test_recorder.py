"""The recorder: forward events, per-layer gradients, in-place layers, hook removal."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.recorder import Recorder  # noqa: E402


def _three_way(fw_name):
    """A layer that takes one tensor three times (self-attention style) with distinct weights."""
    if fw_name == "torch":

        class Mix(torch.nn.Module):
            def forward(self, q, k, v):
                return q * 1.0 + k * 2.0 + v * 3.0

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
                self.mix = Mix()

            def forward(self, x):
                h = self.lin(x)
                return self.mix(h, h, h)

        return Net(), lambda a: torch.tensor(a, requires_grad=True)

    class PMix(paddle.nn.Layer):
        def forward(self, q, k, v):
            return q * 1.0 + k * 2.0 + v * 3.0

    class PNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(4, 4)
            self.mix = PMix()

        def forward(self, x):
            h = self.lin(x)
            return self.mix(h, h, h)

    return PNet(), lambda a: paddle.to_tensor(a, stop_gradient=False)


def _record(model, x):
    fw = framework_of(model, "model")
    with Recorder(fw, model) as rec:
        out = model(x)
        loss = out.sum()
    fw.backward(loss)
    rec.remove_tensor_hooks()
    return rec.events(loss)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_same_tensor_passed_three_times_gets_each_inputs_own_gradient(fw_name):
    # Regression: paddle accumulated later contributions into the buffer handed to the first
    # hook, so the value input of attention read as the total gradient.
    model, tensor = _three_way(fw_name)
    _, backward, _ = _record(model, tensor(np.ones((2, 4), "float32")))
    mix = next(e for e in backward if e.path == "mix")
    grads = {t.name: t.value for t in mix.inputs}
    for name, factor in (("in[0]", 1.0), ("in[1]", 2.0), ("in[2]", 3.0)):
        np.testing.assert_allclose(grads[name], np.full((2, 4), factor))
    lin = next(e for e in backward if e.path == "lin")
    np.testing.assert_allclose(lin.outputs[0].value, np.full((2, 4), 6.0))


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_forward_events_are_preorder_with_parents_and_stacks(fw_name):
    model, tensor = _three_way(fw_name)
    forward, backward, warnings = _record(model, tensor(np.ones((2, 4), "float32")))
    layers = [e for e in forward if e.kind.value == "layer"]
    assert [e.path for e in layers] == ["", "lin", "mix"]
    assert [e.parent for e in layers] == [None, 0, 0]
    assert layers[2].inputs[0].shape == (2, 4) and len(layers[2].inputs) == 3
    assert any("test_recorder.py" in f.filename for f in layers[1].stack)
    assert [e.path for e in backward] == ["mix", "lin", ""]
    assert warnings == []


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_hooks_are_removed_when_the_model_raises(fw_name):
    model, tensor = _three_way(fw_name)
    fw = framework_of(model, "model")
    with pytest.raises(ValueError), Recorder(fw, model):
        model(tensor(np.ones((2, 4), "float32")))
        raise ValueError("boom")
    # A second recorder sees each call exactly once: nothing from the first one is left.
    _, backward, _ = _record(model, tensor(np.ones((2, 4), "float32")))
    assert [e.path for e in backward] == ["mix", "lin", ""]
    assert len(model._forward_pre_hooks) == 0


def test_inplace_layer_input_is_snapshotted():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.act = torch.nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.lin(x))

    model = Net()
    with torch.no_grad():
        model.lin.weight.copy_(torch.eye(3))
        model.lin.bias.zero_()
    x = torch.tensor(np.array([[-1.0, 2.0, -3.0]], "float32"))
    with torch.no_grad(), Recorder(framework_of(model, "m"), model, backward=False) as rec:
        model(x)
    forward, _, _ = rec.events()
    lin = next(e for e in forward if e.path == "lin")
    act = next(e for e in forward if e.path == "act")
    # The Linear output as it was, negative entries included, not the ReLU'd tensor.
    np.testing.assert_array_equal(lin.outputs[0].value, [[-1.0, 2.0, -3.0]])
    np.testing.assert_array_equal(act.inputs[0].value, [[-1.0, 2.0, -3.0]])
    np.testing.assert_array_equal(act.outputs[0].value, [[0.0, 2.0, 0.0]])


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_recorded_parameter_gradients_survive_clearing(fw_name):
    # to_numpy shares memory; paddle's clear_gradients zeroes gradients in place.
    model, tensor = _three_way(fw_name)
    _, backward, _ = _record(model, tensor(np.ones((2, 4), "float32")))
    framework_of(model, "model").zero_grad(model, None)
    lin = next(e for e in backward if e.path == "lin")
    weight_grad = next(t for t in lin.params if t.name == "weight")
    np.testing.assert_allclose(weight_grad.value, np.full((4, 4), 12.0))


def test_value_is_recorded_at_the_time_before_a_residual_add_in_place():
    # torchvision's BasicBlock: `out = bn2(out); out += identity; relu(out)` with ReLU(inplace=True).
    # A kept reference read bn2's output as bn2 + identity.
    class TB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.relu = torch.nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.fc(x)
            out += x
            return self.relu(out)

    model = TB()
    x = torch.tensor(np.random.RandomState(0).randn(3, 4).astype("float32"))
    expected = model.fc(x).detach().numpy().copy()
    with Recorder(framework_of(model, "m"), model, backward=True) as rec:
        model(x).sum().backward()
    forward, _, warnings = rec.events()
    fc = next(e for e in forward if e.path == "fc")
    relu = next(e for e in forward if e.path == "relu")
    np.testing.assert_allclose(fc.outputs[0].value, expected, rtol=1e-6)
    np.testing.assert_allclose(relu.inputs[0].value, expected + x.numpy(), rtol=1e-6)
    assert not warnings


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_backward_events_carry_the_stack_of_the_backward_call(fw_name):
    # They showed the forward call's stack: the user's backward() line is where backward starts.
    import inspect

    model, tensor = _three_way(fw_name)
    forward, backward, _ = _record(model, tensor(np.ones((2, 4), "float32")))
    src = inspect.getsource(_record).splitlines()
    line = inspect.getsourcelines(_record)[1] + next(i for i, s in enumerate(src) if "fw.backward(loss)" in s)
    lin = next(e for e in backward if e.path == "lin")
    assert any(f.lineno == line and f.function == "_record" for f in lin.stack), lin.stack
    assert all(f.lineno != line for f in next(e for e in forward if e.path == "lin").stack)


def test_an_in_place_add_on_a_hooked_paddle_output_leaves_no_warning_to_the_user():
    # Found by the fuzz: y.add_(x) on a recorded output drops paddle's hook, and removing ours
    # afterwards printed "The backward hook ... does not exist or has been removed".
    import warnings

    import nbdiff

    class Residual(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            y.add_(x)
            return y

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert nbdiff.auto_diff(Residual(), Residual(), x)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_a_container_passes_its_input_on_without_a_second_copy(fw_name):
    # The container's own input gradient needs a fresh view of its input; the sublayer it hands
    # that view to reads the same values, so it shares the copy instead of making another.
    nn = torch.nn if fw_name == "torch" else paddle.nn
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Tanh())
    x = np.ones((2, 4), "float32")
    tensor = torch.tensor(x, requires_grad=True) if fw_name == "torch" else paddle.to_tensor(x, stop_gradient=False)
    forward, _, _ = _record(model, tensor)
    inputs = [e.inputs[0].value for e in forward if e.kind.value == "layer"][:3]  # root, inner, Linear
    assert inputs[0] is inputs[1] is inputs[2]
    np.testing.assert_array_equal(inputs[2], x)


def test_a_gradient_handed_on_through_a_view_is_copied_once_and_is_right():
    # torch hands a layer's input gradient and the previous layer's output gradient as two views
    # of one buffer: one copy serves both, and it holds the true gradient.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 4, requires_grad=True)
    _, backward, _ = _record(model, x)
    by_path = {e.path: e for e in backward}
    tanh_in, lin_out = by_path["1"].inputs[0].value, by_path["0"].outputs[0].value
    assert tanh_in is lin_out
    h = model[0](x)
    (true,) = torch.autograd.grad(model[2](model[1](h)).sum(), h)
    np.testing.assert_allclose(lin_out, true.numpy(), rtol=1e-6)


def test_gradient_alias_keys_tell_views_apart_from_other_buffers_and_writes():
    fw = framework_of(torch.nn.Linear(1, 1), "m")
    g = torch.randn(4, 6)
    assert fw.gradient_alias_key(g) == fw.gradient_alias_key(g.view(4, 6)) is not None
    assert fw.gradient_alias_key(g) != fw.gradient_alias_key(g.view(6, 4))  # read another way
    assert fw.gradient_alias_key(g) != fw.gradient_alias_key(g.clone())  # other memory
    before = fw.gradient_alias_key(g)
    g.view(4, 6).add_(1.0)  # written through a view: the shared version counter moves
    assert fw.gradient_alias_key(g) != before
    assert framework_of(paddle.nn.Linear(1, 1), "m").gradient_alias_key(paddle.ones([2])) is None


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_an_output_the_model_lets_go_of_is_not_held_and_its_gradient_is_still_recorded(fw_name):
    # Holding every copied output till the step's end kept activations the model frees (a
    # Linear's output, once tanh has made its own): 16 MiB more peak on a 16-layer MLP.
    import weakref

    nn, tanh = (torch.nn, torch.tanh) if fw_name == "torch" else (paddle.nn, paddle.tanh)
    alive = []

    class Net(torch.nn.Module if fw_name == "torch" else paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            ref = weakref.ref(h)
            out = tanh(h)
            del h
            alive.append(ref() is not None)
            return out

    model = Net()
    x = np.ones((2, 4), "float32")
    forward, backward, _ = _record(model, torch.tensor(x) if fw_name == "torch" else paddle.to_tensor(x))
    assert alive == [False]
    lin = next(e for e in backward if e.path == "lin")
    assert lin.outputs and lin.outputs[0].value.shape == (2, 4)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_a_backward_after_the_hooks_are_removed_records_nothing(fw_name):
    # Paddle's hook on an output whose wrapper is gone stays in the graph, out of the handle's
    # reach: it must not write into a step that is over.
    nn, tanh = (torch.nn, torch.tanh) if fw_name == "torch" else (paddle.nn, paddle.tanh)

    class Net(torch.nn.Module if fw_name == "torch" else paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return tanh(self.lin(x) * 2.0)

    model = Net()
    fw = framework_of(model, "model")
    x = np.ones((2, 4), "float32")
    with Recorder(fw, model) as rec:
        out = model(torch.tensor(x) if fw_name == "torch" else paddle.to_tensor(x))
    rec.remove_tensor_hooks()
    fw.backward(out.sum())
    assert all(not c.grad_out for c in rec.calls)


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_a_ctrl_c_while_hooks_are_removed_removes_them_all_then_raises(fw_name):
    # A real SIGINT there left a hook on every layer, never removed later.
    import os
    import signal

    if fw_name == "torch":
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        hooked = lambda: [m for m in model.modules() if m._forward_pre_hooks or m._forward_hooks]  # noqa: E731
    else:
        model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Tanh(), paddle.nn.Linear(4, 2))
        hooked = lambda: [m for m in model.sublayers(True) if m._forward_pre_hooks or m._forward_post_hooks]  # noqa: E731
    rec = Recorder(framework_of(model, "m"), model)
    rec.__enter__()
    first = rec._handles[0]
    remove = first.remove

    def interrupted():
        os.kill(os.getpid(), signal.SIGINT)
        remove()

    first.remove = interrupted
    with pytest.raises(KeyboardInterrupt):
        rec.__exit__(None, None, None)
    assert not hooked()


@pytest.mark.parametrize("verb", ["auto_diff", "watch"])
@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_a_ctrl_c_while_hooks_go_on_leaves_none_of_them(fw_name, verb, monkeypatch):
    # A real SIGINT between registering a layer's hooks and keeping their handles left them on the user's
    # layer, and the unraisable hook set: 1 of 1,800 random SIGINTs (tests/test_chaos.py, 300 trials a case).
    import os
    import signal
    import sys

    import nbdiff

    if fw_name == "torch":
        make = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))  # noqa: E731
        hooked = lambda m: [x for x in m.modules() if x._forward_pre_hooks or x._forward_hooks]  # noqa: E731
        tensor = torch.tensor
    else:
        make = lambda: paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Tanh(), paddle.nn.Linear(4, 2))  # noqa: E731
        hooked = lambda m: [x for x in m.sublayers(True) if x._forward_pre_hooks or x._forward_post_hooks]  # noqa: E731
        tensor = paddle.to_tensor
    base, raw = make(), make()
    fw = framework_of(base, "m")
    real, calls = type(fw).hook_forward, []

    def hook_forward(self, layer, pre, post):
        handles = real(self, layer, pre, post)
        calls.append(layer)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # raised as soon as this returns from the kill
        return handles

    monkeypatch.setattr(type(fw), "hook_forward", hook_forward)
    unraisable = sys.unraisablehook
    x = np.ones((2, 4), "float32")
    with pytest.raises(KeyboardInterrupt):
        if verb == "auto_diff":
            nbdiff.auto_diff(base, raw, x)
        else:
            with nbdiff.watch(base, raw):
                for m in (base, raw):
                    m(tensor(x)).sum().backward()
    assert len(calls) >= 3 and not hooked(base) and not hooked(raw)
    assert sys.unraisablehook is unraisable


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_no_python_runs_when_a_recorded_tensor_dies_so_a_ctrl_c_is_never_dropped(fw_name):
    """A Ctrl-C that lands in a weak reference's callback is printed ("Exception ignored in:
    <function Recorder._remember.<locals>.<lambda>>") and dropped: an interrupted %%modeldiff loop
    ran on. The recorder's weak references have no callback; a dead entry whose id another tensor
    took is not mistaken for it."""
    import weakref

    fw, nn = (torch, torch.nn) if fw_name == "torch" else (paddle, paddle.nn)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    x = np.ones((2, 4), "float32")
    t = torch.tensor(x) if fw_name == "torch" else paddle.to_tensor(x)
    with Recorder(framework_of(model, "m"), model, backward=False) as rec:
        with fw.no_grad():
            model(t)
        refs = [held for held, _ in rec._copies.values() if isinstance(held, weakref.ref)]
        assert refs and all(r.__callback__ is None for r in refs)
        # A dead entry under a key a new tensor now has: a miss, and a fresh copy of the new values.
        key, (held, record) = next(iter(rec._copies.items()))
        other = torch.full((2, 4), 7.0) if fw_name == "torch" else paddle.full([2, 4], 7.0)
        rec._copies[(id(other), key[1])] = (weakref.ref(model), record)  # not `other`
        assert float(rec._keep("in[0]", other).value.max()) == 7.0


def _deep_calls(fw_name, roots):
    """Layers called from helpers, loops, a container and twice from different lines, five deep;
    each records, in its forward, the user frames above its own (what its call's stack must be)."""
    from nbdiff.trace.origin.stack import user_stack

    Base = torch.nn.Module if fw_name == "torch" else paddle.nn.Layer
    seen: dict[str, list] = {}

    class Leaf(Base):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, x):
            seen.setdefault(self.name, []).append(user_stack(roots, limit=13)[1:])
            return x * 2.0

    def through_helper(layer, x):
        return layer(x)

    class Block(Base):
        def __init__(self, name, depth):
            super().__init__()
            self.name = name
            self.a = Leaf(name + ".a")
            self.inner = Block(name + ".inner", depth - 1) if depth > 1 else Leaf(name + ".inner")

        def forward(self, x):
            seen.setdefault(self.name, []).append(user_stack(roots, limit=13)[1:])
            x = through_helper(self.a, x)
            for _ in range(2):
                x = self.inner(x)
            return self.a(x)  # the same layer again, from another line

    return Block("root", 5), seen


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
def test_each_calls_stack_is_the_user_frames_above_it_however_deep(fw_name):
    # A sublayer's walk stops at its running parent's frames and takes the frames found then: the
    # stacks must be what a full walk finds, line by line, past the 12-frame limit too.
    model, tensor = _three_way(fw_name)
    fw = framework_of(model, "model")
    recorder = Recorder(fw, model)
    model, seen = _deep_calls(fw_name, recorder.hidden_roots)
    recorder.model = model
    with recorder:
        model(tensor(np.ones((2, 4), "float32")))
    by_path: dict[str, list] = {}
    for call in recorder.calls:
        by_path.setdefault(call.layer.name, []).append(call.stack)
    assert by_path == seen
    assert max(len(s) for stacks in seen.values() for s in stacks) == 12  # the limit was reached
