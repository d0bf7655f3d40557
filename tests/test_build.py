"""Events built from a step's recorded calls: forward in call order, backward only when asked."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.build import build_events, first_calls, step_groups  # noqa: E402
from nbdiff.trace.events import Kind, Phase  # noqa: E402
from nbdiff.trace.recorder import Recorder  # noqa: E402


def _recorded():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    fw = framework_of(model)
    rec = Recorder(fw, model)
    with rec:
        loss = model(torch.ones(3, 4)).sum()
        loss.backward()
    rec.remove_tensor_hooks()
    return fw, rec, loss


def test_backward_events_come_after_their_sublayers_with_each_parameter_once():
    fw, rec, loss = _recorded()
    forward, backward, warnings = build_events(fw, rec.calls, 0, loss, fw.grad_of, True)
    assert [e.path for e in forward] == ["", "0", "1", "2", "<loss>"] and forward[-1].kind is Kind.LOSS
    assert float(forward[-1].outputs[0].value) == pytest.approx(float(loss.detach()))
    assert [e.path for e in backward] == ["2", "1", "0", ""] and {e.phase for e in backward} == {Phase.BACKWARD}
    params = [p.name for e in backward for p in e.params]
    assert sorted(params) == ["bias", "bias", "weight", "weight"]  # the root does not repeat its layers'
    assert np.array_equal(backward[0].params[0].value, fw.grad_of(rec.model[2].weight))
    assert warnings == []


def test_no_backward_events_when_the_step_ran_forward_only():
    fw, rec, loss = _recorded()
    forward, backward, _ = build_events(fw, rec.calls, 3, None, fw.grad_of, False)
    assert backward == [] and [e.kind for e in forward] == [Kind.LAYER] * 4 and {e.step for e in forward} == {3}


def test_a_class_added_to_layer_like_is_seen_in_the_next_steps_bases(monkeypatch):
    # A layer class's bases are read once per class: an entry the user adds later still counts.
    from nbdiff.frameworks import base as base_module

    class MyDense(torch.nn.Module):
        def forward(self, x):
            return x * 2.0

    model = torch.nn.Sequential(MyDense())
    fw = framework_of(model)

    def bases():
        rec = Recorder(fw, model)
        with rec:
            model(torch.ones(2, 2))
        forward, _, _ = build_events(fw, rec.calls, 0, None, fw.grad_of, False)
        return forward[1].bases

    assert "Linear" not in bases()
    monkeypatch.setitem(base_module.LAYER_LIKE, f"{MyDense.__module__}.{MyDense.__qualname__}", "Linear")
    assert "Linear" in bases()


def test_steps_are_cut_at_root_calls_and_each_numbered_from_zero():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Tanh())
    rec = Recorder(framework_of(model), model, backward=False)
    with rec:
        for _ in range(4):
            model(torch.ones(3, 4))
    steps = step_groups(rec.calls)
    assert [len(g) for g in steps] == [4, 4, 4, 4]
    assert [len(g) for g in step_groups(rec.calls, roots_per_step=2)] == [8, 8]  # micro-batches
    fw = framework_of(model)

    def events(group):
        return build_events(fw, group, 3, None, fw.grad_of, False, first_call=first_calls(group))[0]

    last = events(steps[-1])
    assert [e.order for e in last] == [0, 1, 2, 3] and [e.parent for e in last] == [None, 0, 0, 0]
    assert [e.call for e in last] == [0, 0, 0, 0]  # each path's first call of the step
    pair = events(step_groups(rec.calls, roots_per_step=2)[1])
    assert [(e.path, e.call) for e in pair][4:] == [("", 1), ("0", 1), ("1", 1), ("2", 1)]
    assert steps[-1][0].order == 12 and steps[-1][0].call == 3  # the recording's own numbers are left as they were


def test_each_backward_event_points_at_the_backward_event_of_the_call_enclosing_its_own():
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), inner, torch.nn.Sequential(inner, torch.nn.Linear(4, 2)))
    fw = framework_of(model)
    rec = Recorder(fw, model)
    with rec:
        for _ in range(2):
            model(torch.ones(3, 4, requires_grad=True)).sum().backward()
    for group in step_groups(rec.calls):
        forward, backward, _ = build_events(fw, group, 0, None, fw.grad_of, True, first_call=first_calls(group))
        assert max(e.depth for e in backward) == 3  # the shared Sequential's layers, inside another one
        assert [e.order for e in backward] == list(range(len(backward)))
        by_call = {(e.path, e.call): e.order for e in backward}
        for e in backward:
            f = next(f for f in forward if (f.path, f.call) == (e.path, e.call))
            up = forward[f.parent] if f.parent is not None else None
            assert e.parent == (by_call[(up.path, up.call)] if up is not None else None), e.path
