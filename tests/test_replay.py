"""Local error by replay: layers that used to be unmeasurable are measured."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nbdiff.engine.replay import Replayer  # noqa: E402
from nbdiff.engine.stepping import run_step  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.judge.tolerance import resolve_tolerance  # noqa: E402
from nbdiff.trace.events import Kind  # noqa: E402
from nbdiff.trace.inputs import split_inputs  # noqa: E402
from nbdiff.weights.assign import plan_weights  # noqa: E402


def _recorded_bn_relu(backward):
    """A step of Linear, train-mode BatchNorm and ReLU(inplace=True), and a replayer of it against itself."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(inplace=True))
    fw = framework_of(model, "m")
    call, _ = split_inputs(np.random.RandomState(0).randn(8, 4).astype("float32"), fw, fw)
    rec = run_step(fw, model, call, None, side="base", step=0, backward=backward)
    tol = lambda a, b: resolve_tolerance(None, None, a, b)  # noqa: E731
    return rec, Replayer(fw, fw, plan_weights(model, model)[2].by_base_path(), tol, "strict")


@pytest.mark.parametrize("path", ["1", "2"])
def test_train_mode_batchnorm_and_inplace_layers_have_a_measured_backward(path):
    # BatchNorm in train mode: running statistics were restored before autograd.grad ran
    # ("modified by an inplace operation"); ReLU(inplace=True) could not write a leaf input.
    rec, replayer = _recorded_bn_relu(backward=True)
    fwd = next(e for e in rec.forward if e.path == path and e.kind is Kind.LAYER)
    bwd = next(e for e in rec.backward if e.path == path)
    local = replayer.backward(fwd, fwd, bwd)
    assert local is not None and all(t.passed for t in local)


def test_a_layer_whose_port_takes_an_extra_input_is_measured_and_blamed():
    # transformers passes attention_mask=None where paddleformers passes a mask tensor: the two calls
    # have different inputs, and the layer's local error could not be measured, so blame went elsewhere.
    import nbdiff

    class Attn(torch.nn.Module):
        def __init__(self, bug=False):
            super().__init__()
            self.proj, self.bug = torch.nn.Linear(4, 4), bug

        def forward(self, hidden_states, attention_mask=None):
            h = self.proj(hidden_states)
            if attention_mask is not None:
                h = h * attention_mask
            return h.tanh() * (1.1 if self.bug else 1.0)

    class Net(torch.nn.Module):
        def __init__(self, with_mask, bug=False):
            super().__init__()
            self.fc, self.attn, self.head, self.with_mask = (
                torch.nn.Linear(4, 4),
                Attn(bug),
                torch.nn.Linear(4, 2),
                with_mask,
            )

        def forward(self, x):
            h = self.fc(x)
            mask = torch.ones_like(h) if self.with_mask else None
            return self.head(self.attn(h, attention_mask=mask) if self.with_mask else self.attn(h))

    x = np.random.RandomState(0).randn(3, 4).astype("float32")
    assert nbdiff.auto_diff(Net(False), Net(True), x)
    d = nbdiff.auto_diff(Net(False), Net(True, bug=True), x).first_divergence
    assert d is not None and (d.base_path, d.where) in {("attn", "between"), ("attn", "layer")}
    assert d.local_error is not None and not d.local_error.passed


def test_a_pair_that_cannot_take_the_same_input_is_not_replayed_and_does_not_crash():
    # Found by the fuzz: a wrongly paired activation of another width had its input matched by
    # name ("input"), and numpy's broadcast raised inside the comparison.
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2), torch.nn.Tanh())
    fw = framework_of(model, "m")
    call, _ = split_inputs(np.random.RandomState(0).randn(3, 4).astype("float32"), fw, fw)
    rec = run_step(fw, model, call, None, side="base", step=0, backward=True)
    replayer = Replayer(
        fw, fw, plan_weights(model, model)[2].by_base_path(), lambda a, b: resolve_tolerance(None, None, a, b), "strict"
    )
    wide, narrow = (next(e for e in rec.forward if e.path == p and e.kind is Kind.LAYER) for p in ("1", "3"))
    assert replayer.forward(wide, narrow) is None
    assert replayer.forward(narrow, narrow) is not None


def test_magnitude_ignores_nan_and_measures_an_array_seen_again_once():
    from nbdiff.engine.replay import magnitude

    a = np.array([1.0, -3.0, np.nan], "float32")
    b = np.array([[2.0, 0.5]], "float32")
    assert magnitude([a, b, np.zeros(0, "float32"), np.arange(3)]) == 3.0
    cache: dict = {}
    assert magnitude([a, b], cache) == 3.0 and set(cache) == {id(a), id(b)}
    a[1] = 0.0  # the cache is for arrays nothing writes: what it measured stands
    assert magnitude([a], cache) == 3.0 and magnitude([a]) == 1.0
    for size in (8, (1 << 16) + 8):  # |a| made once, and max and -min for large ones
        big = np.zeros(size, "float32")
        big[3], big[5] = -7.0, 2.0
        assert magnitude([big]) == 7.0
        big[6], big[7] = np.nan, -np.inf
        assert magnitude([big]) == np.inf
        big[7] = 1.0
        assert magnitude([big]) == 7.0


def test_a_parents_local_error_reads_what_an_inplace_sublayer_was_handed_before_it_ran():
    # ReLU(inplace=True) writes its output over its input: read after it ran, the input it was
    # handed looked like the ReLU's output, and the parent's own code was blamed (torchvision's
    # ShuffleNetV2 against paddle.vision's, 8,000x "between" two sublayers of an equivalent port).
    rec, replayer = _recorded_bn_relu(backward=False)
    layers = [e for e in rec.forward if e.kind is Kind.LAYER]
    root = next(e for e in layers if e.path == "")
    kids = [(e, e) for e in layers if e.parent == root.order]
    local = replayer.forward(root, root, kids)
    assert local is not None and all(t.passed for t in local), [(t.name, t.ratio) for t in local]


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_replays_leave_a_stateful_models_python_state_as_they_found_it(direction):
    # Measuring the root's own error ran it again: its KV cache grew and its call counter moved, and the
    # replay itself attended over a cache one entry longer than the step's (a wrong local error).
    import nbdiff
    from tests.structure_models import decoders

    pytest.importorskip("paddle")
    base, raw = decoders(direction, bug=True)
    result = nbdiff.auto_diff(base, raw, np.random.RandomState(0).randn(2, 1, 8).astype("float32"))
    assert not result
    assert (base.calls, raw.calls, len(base.cache), len(raw.cache)) == (1, 1, 1, 1)
    root = next(d for d in result.select(0, "forward") if d.base.path == "")
    assert root.local is None  # not measurable by running it again: never blamed on a wrong replay
    # The error first appears in what the root's own code hands `proj`, and `qkv` before it agrees.
    d = result.first_divergence
    assert (d.where, d.base_path, d.between, d.inherited) == ("between", "", ("qkv", "proj"), False), result.report()


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_a_stateful_roots_own_error_after_its_last_sublayer_is_its_own_not_inherited(direction):
    # The root keeps a KV cache, so it is not run again; its code scales what its last sublayer returned.
    # Every sublayer and the inputs agree: the error is the root's own, after `head` (it was "inherited").
    import json

    import nbdiff
    from tests.structure_models import decoders

    pytest.importorskip("paddle")
    x = np.random.RandomState(0).randn(2, 1, 8).astype("float32")
    base, raw = decoders(direction, bug_after=True)
    result = nbdiff.auto_diff(base, raw, x)
    d = result.first_divergence
    assert (d.where, d.base_path, d.between, d.inherited) == ("between", "", ("head", None), False), result.report()
    assert d.local_by == "received" and "keeps state" in d.unmeasured
    assert "inherited" not in result.report().split("Tree")[0]
    blames = [f["blame"] for f in json.loads(result.to_json())["findings"]]
    assert blames and "inherited" not in blames, blames
    # A sublayer's own bug inside the same root is still that sublayer's; the root's code is not blamed too.
    base, raw = decoders(direction)
    lin = raw.head
    with_bug = lin.forward
    lin.forward = lambda h: with_bug(h) * 1.01
    result = nbdiff.auto_diff(base, raw, x)
    assert [(f.where, f.raw_path) for f in result.findings if f.phase.value == "forward"] == [("layer", "head")], (
        result.report()
    )


def _hf_model(fw: str, gelu: bool):
    """A decoder as ported models write it: the model computes the position embeddings (cos, sin) and
    hands them to its block, which hands them to its attention with other arguments on each side, as
    transformers' and paddleformers' Qwen3 do: base by keyword with integer positions, raw by place
    with a float mask. ``gelu``: the block's activation is GELU instead of ReLU."""
    if fw == "torch":
        import torch

        nn, lib = torch.nn, torch
    else:
        import paddle

        nn, lib = paddle.nn, paddle
    module = nn.Module if fw == "torch" else nn.Layer

    class Attention(module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, hidden_states, attention_mask=None, position_embeddings=None, position_ids=None):
            cos, sin = position_embeddings
            return self.proj(hidden_states) * cos + sin

    class Block(module):
        def __init__(self):
            super().__init__()
            self.attn, self.act = Attention(), (nn.GELU() if gelu else nn.ReLU())

        def forward(self, x, attention_mask=None, position_embeddings=None, position_ids=None):
            return self.act(self.attn(x, attention_mask, position_embeddings, position_ids))

    class Model(module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            n = x.shape[1]
            angle = (
                lib.arange(n * 8).reshape([1, n, 8]).astype("float32") / 10.0
                if fw == "paddle"
                else (lib.arange(n * 8).reshape(1, n, 8).float() / 10.0)
            )
            cos, sin = lib.cos(angle), lib.sin(angle)
            if fw == "torch":
                return self.block(x, position_embeddings=(cos, sin), position_ids=lib.arange(n)[None])
            return self.block(x, lib.zeros([1, 1, n, n]), (cos, sin))

    return Model()


@pytest.mark.parametrize("base_fw, raw_fw", [("torch", "paddle"), ("paddle", "torch")])
def test_a_block_given_other_arguments_on_each_side_is_not_blamed_for_a_sublayers_bug(base_fw, raw_fw):
    # Inputs were fed by place: raw's cosine slot got base's sine, and base's integer positions were
    # compared with raw's float mask; the block read as having an error of its own, a second finding.
    import nbdiff

    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    result = nbdiff.auto_diff(_hf_model(base_fw, False), _hf_model(raw_fw, True), x)
    assert [(f.phase.value, f.base_path, f.where) for f in result.findings if f.phase.value == "forward"] == [
        ("forward", "block.act", "layer")
    ]
    assert nbdiff.auto_diff(_hf_model(base_fw, False), _hf_model(raw_fw, False), x)
