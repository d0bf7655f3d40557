"""Offline local errors: a blamed layer rebuilt from its dump (class, arguments, weights at the
step) and run on the other side's inputs, as auto_diff's replay does live; "not measured" where
that cannot be done, and never called local then."""

import json
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.engine.recorded.rebuilt import RebuiltSide  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from tests.dumps import X, pair, train  # noqa: E402

BOTH = [("torch", "paddle"), ("paddle", "torch")]

# The user's own layers, one module for both frameworks: tanh scaled in forward (``ScaledTanh``), and
# tanh whose hand-written backward scales the gradient (``GradTanh``): a bug where scale is not 1.
_LAYER = """
class {Fw}ScaledTanh({base}):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return {fw}.tanh(x) * self.scale


class _{Fw}Tanh({function}):
    @staticmethod
    def forward(ctx, x, scale):
        y = {fw}.tanh(x)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.{saved}
        return {gradient}


class {Fw}GradTanh({Fw}ScaledTanh):
    def forward(self, x):
        return _{Fw}Tanh.apply(x, self.scale)
"""
_LAYERS = "import paddle\nimport torch\n" + "".join(
    _LAYER.format(Fw=fw.title(), fw=fw, base=base, function=function, saved=saved, gradient=gradient)
    for fw, base, function, saved, gradient in (
        ("torch", "torch.nn.Module", "torch.autograd.Function", "saved_tensors", "g * (1 - y * y) * ctx.scale, None"),
        ("paddle", "paddle.nn.Layer", "paddle.autograd.PyLayer", "saved_tensor()", "g * (1 - y * y) * ctx.scale"),
    )
)


@pytest.fixture
def user_layers(tmp_path, monkeypatch):
    """A module of the user's own layers, imported as a notebook would (``import my_layers``)."""
    (tmp_path / "my_layers.py").write_text(textwrap.dedent(_LAYERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_layers", raising=False)
    import my_layers

    yield my_layers
    sys.modules.pop("my_layers", None)


def _scaled_model(fw, layers, scales, kind="ScaledTanh"):
    """Linear(16, 32), then per scale: the user's ``kind`` layer and a Linear(32, 32); Linear(32, 4)."""
    import paddle
    import torch

    (torch.manual_seed if fw == "torch" else paddle.seed)(0)
    nn = torch.nn if fw == "torch" else paddle.nn
    own = getattr(layers, ("Torch" if fw == "torch" else "Paddle") + kind)
    blocks = [m for scale in scales for m in (own(scale), nn.Linear(32, 32))]
    return nn.Sequential(nn.Linear(16, 32), *blocks, nn.Linear(32, 4))


def _scaled_dumps(tmp_path, layers, base_fw, raw_fw, raw_scales=(1.02,), kind="ScaledTanh"):
    base = _scaled_model(base_fw, layers, [1.0] * len(raw_scales), kind)
    raw = _scaled_model(raw_fw, layers, raw_scales, kind)
    nbdiff.assign_weight(base, raw, inputs=X)
    return [train(model, tmp_path / name, steps=2).parent for name, model in (("a", base), ("b", raw))]


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_a_layers_own_bug_offline_is_local_with_the_error_measured_on_a_rebuilt_layer(tmp_path, base_fw, raw_fw):
    # Offline used to judge it from what the layer received and say "local" without running anything.
    base, raw = pair("eps", base_fw, raw_fw)
    a, b = train(base, tmp_path / "a", steps=2), train(raw, tmp_path / "b", steps=2)
    result = nbdiff.compare(a.parent, b.parent)
    d = result.first_divergence
    assert (d.phase.value, d.base_path, d.where, d.local_by) == ("forward", "norm", "layer", "rebuilt")
    assert d.local_error is not None and d.local_error.ratio > 1 and d.unmeasured == ""
    assert "rebuilt from its dump" in result.report()
    verdict = json.loads(result.to_json())["findings"][0]
    assert (verdict["blame"], verdict["local_by"], verdict["not_measured"]) == ("local", "rebuilt", None)
    assert verdict["local_error"]["ratio"] > 1


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_a_statistics_dump_says_not_measured_and_never_local(tmp_path, base_fw, raw_fw):
    base, raw = pair("eps", base_fw, raw_fw)
    a = train(base, tmp_path / "a", steps=1, dump_type="statistics")
    b = train(raw, tmp_path / "b", steps=1, dump_type="statistics")
    result = nbdiff.compare(a.parent, b.parent)
    d = result.first_divergence
    assert (d.base_path, d.local_by) == ("norm", "received")
    assert "statistics dump holds no values" in d.unmeasured
    assert "local        not measured (a statistics dump" in result.report()
    verdict = json.loads(result.to_json())["findings"][0]
    assert (verdict["blame"], verdict["local_by"], verdict["local_error"]) == ("not measured", None, None)
    assert "statistics dump" in verdict["not_measured"]


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_the_users_own_layer_is_rebuilt_when_its_module_is_imported_and_not_measured_when_not(
    tmp_path, monkeypatch, user_layers, base_fw, raw_fw
):
    a, b = _scaled_dumps(tmp_path, user_layers, base_fw, raw_fw)
    d = nbdiff.compare(a, b).first_divergence
    assert (d.base_path, d.where, d.local_by) == ("1", "layer", "rebuilt")
    assert d.local_error.ratio > 1
    monkeypatch.delitem(sys.modules, "my_layers")  # the compare runs where the module is not imported
    d = nbdiff.compare(a, b).first_divergence
    assert (d.base_path, d.where, d.local_by) == ("1", "layer", "received")
    assert "my_layers is not imported here" in d.unmeasured


def test_a_layer_changed_on_its_instance_is_not_measured_since_its_rebuild_does_not_give_its_outputs(tmp_path):
    # From step 2 on, fc2's forward is replaced on the instance; its class rebuilt does not do that.
    base, raw = pair()
    a, b = train(base, tmp_path / "a"), train(raw, tmp_path / "b", late_bug_at=2)
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert (d.step, d.base_path, d.where, d.local_by) == (2, "fc2", "layer", "received")
    assert "does not give back its own recorded outputs" in d.unmeasured


@pytest.mark.parametrize("fw", ["torch", "paddle"])
@pytest.mark.parametrize("record_steps", [None, [0, 2, 3]])
def test_the_weights_at_a_later_step_are_the_first_weights_plus_the_updates(tmp_path, fw, record_steps):
    # Exact at the first step of each run of recorded steps; after it, to a rounding unit per step (an
    # update kept as ``after - before`` in float32 is not always exact).
    model, _ = pair(base_fw=fw, raw_fw="paddle" if fw == "torch" else "torch")
    seen = []

    def at_start(module, *args):
        seen.append({n: np.array(p.detach().numpy() if fw == "torch" else p.numpy()) for n, p in _params(model)})

    hook = model.register_forward_pre_hook(at_start)
    path = train(model, tmp_path / "a", steps=4, record_steps=record_steps)
    hook.remove()
    dump = read_dump(path)
    side = RebuiltSide(dump)
    numbers = [events[0].step for events in dump.steps]
    assert numbers == (record_steps or [0, 1, 2, 3])
    starts = [side_starts(dump, k) for k in range(len(numbers))]
    assert starts == ([True, True, False] if record_steps else [True, False, False, False])
    for k, number in enumerate(numbers):
        side.saw(k, dump.steps[k])
        weights = side.weights_at(k)
        for name, value in seen[number].items():
            layer, _, param = name.rpartition(".")
            ulps = 0 if side_starts(dump, k) else number
            np.testing.assert_allclose(
                weights[layer][param],
                value,
                rtol=2 * ulps * 2**-23,
                atol=ulps * 2**-30,
                err_msg=f"step {number}: {name}",
            )


def _params(model):
    return model.named_parameters()


def side_starts(dump, k):
    """Whether step position ``k`` holds weights of its own (the first of a run of recorded steps)."""
    return any(e.phase.value == "weights" for e in dump.steps[k])


def test_a_dump_naming_a_class_that_is_not_a_layer_builds_nothing(tmp_path, monkeypatch):
    # A dump is untrusted: its layer_init must not make nbdiff construct arbitrary classes.
    import subprocess

    base, raw = pair("eps")
    a, b = train(base, tmp_path / "a", steps=1), train(raw, tmp_path / "b", steps=1)
    manifest = b / "manifest.json"
    data = json.loads(manifest.read_text())
    data["layer_init"]["norm"] = {"class": "subprocess:Popen", "kwargs": {"args": "touch /tmp/nbdiff-pwned"}}
    manifest.write_text(json.dumps(data))
    built = []
    monkeypatch.setattr(subprocess, "Popen", type("Popen", (), {"__init__": lambda self, **kw: built.append(kw)}))
    d = nbdiff.compare(a.parent, b.parent).first_divergence
    assert built == [] and d.local_by == "received" and "is not a paddle layer class" in d.unmeasured


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_a_second_bug_behind_the_first_is_found_offline_on_its_rebuilt_layer(tmp_path, user_layers, base_fw, raw_fw):
    # Its inputs already differ, so judged from what it received it was only "inherited": only running
    # it again tells (auto_diff's replay, live).
    a, b = _scaled_dumps(tmp_path, user_layers, base_fw, raw_fw, raw_scales=(1.02, 1.0, 1.02))
    result = nbdiff.compare(a, b)
    forward = [(f.base_path, f.where, f.local_by) for f in result.findings if f.phase.value == "forward"]
    assert forward == [("1", "layer", "rebuilt"), ("5", "layer", "rebuilt")], result.report()


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_a_backward_only_bug_offline_is_measured_on_its_rebuilt_layer(
    tmp_path, monkeypatch, user_layers, base_fw, raw_fw
):
    a, b = _scaled_dumps(tmp_path, user_layers, base_fw, raw_fw, raw_scales=(1.05,), kind="GradTanh")
    result = nbdiff.compare(a, b)
    d = result.first_divergence
    assert (d.step, d.phase.value, d.base_path, d.where, d.local_by) == (0, "backward", "1", "layer", "rebuilt")
    assert d.local_error.ratio > 1 and d.local_error.name == "in[0]"
    monkeypatch.delitem(sys.modules, "my_layers")
    d = nbdiff.compare(a, b).first_divergence
    assert (d.phase.value, d.base_path, d.local_by) == ("backward", "1", "received")
    assert "my_layers is not imported here" in d.unmeasured


def _made_inside(fw, grad_scale=1.0, out_scale=1.0):
    """A ReLU whose class is made inside a function, with a hand-written backward (``grad_scale``,
    ``out_scale``: bugs where not 1): compare cannot import it to rebuild it."""
    if fw == "torch":
        import torch

        class Rectify(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x.clamp(min=0) * out_scale

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * (x > 0).to(g.dtype) * out_scale * grad_scale

        layer_base = torch.nn.Module
    else:
        import paddle

        class Rectify(paddle.autograd.PyLayer):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return paddle.clip(x, min=0) * out_scale

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensor()
                return g * (x > 0).astype(g.dtype) * out_scale * grad_scale

        layer_base = paddle.nn.Layer

    class Rectifier(layer_base):
        def forward(self, x):
            return Rectify.apply(x)

    return Rectifier()


def _relu_model(fw, acts):
    import paddle
    import torch

    (torch.manual_seed if fw == "torch" else paddle.seed)(0)
    nn = torch.nn if fw == "torch" else paddle.nn
    return nn.Sequential(nn.Linear(16, 32), acts[0], nn.Linear(32, 32), acts[1], nn.Linear(32, 4))


@pytest.mark.parametrize("base_fw,raw_fw", BOTH)
def test_a_layer_that_cannot_be_rebuilt_is_judged_against_base_run_on_its_data(tmp_path, base_fw, raw_fw):
    # Raw's activations are classes made inside a function. Behind a second bug (the last one's
    # output scaled), the gradients arriving at the first already differed: judged from what it
    # received, its wrong gradient was "inherited" and never found. Base's ReLU, rebuilt and run on
    # raw's inputs and arriving gradients, gives what raw's should have (torch's in place: a rebuilt
    # layer ran on a leaf tensor, which that refuses, and was "not measured").
    import paddle
    import torch

    relu = (lambda: torch.nn.ReLU(inplace=True)) if base_fw == "torch" else paddle.nn.ReLU
    base = _relu_model(base_fw, [relu(), relu()])
    raw = _relu_model(raw_fw, [_made_inside(raw_fw, grad_scale=1.5), _made_inside(raw_fw, out_scale=1.02)])
    nbdiff.assign_weight(base, raw, inputs=X)
    a, b = (train(model, tmp_path / name, steps=1).parent for name, model in (("a", base), ("b", raw)))
    result = nbdiff.compare(a, b)
    found = {(f.phase.value, f.base_path): f.local_by for f in result.findings}
    assert found.get(("forward", "3")) == "recomputed" and found.get(("backward", "1")) == "recomputed", result.report()
    assert "base's layer recomputed from the dump and run on the raw side's inputs" in result.report()


@pytest.mark.parametrize("base_fw,raw_fw", BOTH[:1])
def test_a_rebuilt_layers_backward_judges_rounding_at_the_gradients_arriving_as_a_replay_does(
    tmp_path, monkeypatch, user_layers, base_fw, raw_fw
):
    # A long recorded torch/paddle run false-alarmed on GELU at step 248: its rebuilt backward was judged
    # relative to its own input gradient only, which GELU's slope (near 0 around -0.75) can make far smaller
    # than the gradient arriving, whose rounding it carries. auto_diff's replay judges it at the arriving one.
    from nbdiff.engine.recorded.comparer import RecordedComparer
    from nbdiff.engine.replay import magnitude

    a, b = _scaled_dumps(tmp_path, user_layers, base_fw, raw_fw, raw_scales=(1.05,), kind="GradTanh")
    hints: list[tuple[float, float]] = []
    real = RecordedComparer._rebuilt_backward

    def measured(self, d, bf, rf):
        compare = self._compare
        arriving = magnitude([t.value for t in d.base.outputs if t.value is not None])

        def noted(got, like, scale_hint=0.0):
            hints.append((scale_hint, arriving))
            return compare(got, like, scale_hint)

        monkeypatch.setattr(self, "_compare", noted)
        try:
            return real(self, d, bf, rf)
        finally:
            monkeypatch.setattr(self, "_compare", compare)

    monkeypatch.setattr(RecordedComparer, "_rebuilt_backward", measured)
    d = nbdiff.compare(a, b).first_divergence
    assert (d.phase.value, d.base_path, d.local_by) == ("backward", "1", "rebuilt")
    # The rebuilt layer's own check against its recording (hint 0), then its measurement on base's data.
    assert hints and all(arriving > 0 for _, arriving in hints)
    assert any(hint >= arriving for hint, arriving in hints)
