"""Pairing by execution order: definition order, one-sided wrappers, substitutions, leftovers."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.align.pairing import pair_forward  # noqa: E402
from nbdiff.frameworks import framework_of  # noqa: E402
from nbdiff.trace.inputs import split_inputs  # noqa: E402
from nbdiff.trace.structure import forward_structure  # noqa: E402

X = np.random.RandomState(0).randn(4, 8).astype("float32")


def _pairing(base, raw):
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(X, bfw, rfw)
    return pair_forward(forward_structure(bfw, base, bcall, "base"), forward_structure(rfw, raw, rcall, "raw"))


def _paths(pairing):
    return [(p.base.path, p.raw.path) for p in pairing.pairs]


class TorchMLP(torch.nn.Module):
    def __init__(self, act=torch.nn.GELU):
        super().__init__()
        self.act = act()  # defined first
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PaddleMLP(paddle.nn.Layer):
    def __init__(self, wrap=False):
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Sequential(paddle.nn.Linear(16, 8)) if wrap else paddle.nn.Linear(16, 8)
        self.act = paddle.nn.GELU()  # defined last

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_pairs_follow_execution_not_definition_order():
    pairing = _pairing(TorchMLP(), PaddleMLP())
    assert _paths(pairing) == [("", ""), ("fc1", "fc1"), ("act", "act"), ("fc2", "fc2")]
    assert not pairing.unmatched_base and not pairing.unmatched_raw


def test_a_wrapper_on_one_side_is_left_unpaired_not_fatal():
    pairing = _pairing(TorchMLP(), PaddleMLP(wrap=True))
    assert ("fc2", "fc2.0") in _paths(pairing)
    assert [e.path for e in pairing.unmatched_raw] == ["fc2"]


def test_a_different_class_in_the_same_place_is_paired():
    pairing = _pairing(TorchMLP(act=torch.nn.ReLU), PaddleMLP())
    assert ("act", "act") in _paths(pairing)


def test_nothing_in_common_is_reported_as_unmatched():
    conv = paddle.nn.Sequential(paddle.nn.Conv1D(1, 1, 3))
    bfw, rfw = framework_of(TorchMLP(), "b"), framework_of(conv, "r")
    b = forward_structure(bfw, TorchMLP(), split_inputs(X, bfw, rfw)[0], "base")
    r = forward_structure(rfw, conv, ((paddle.to_tensor(X.reshape(4, 1, 8)),), {}), "raw")
    pairing = pair_forward(b, r)
    assert {e.path for e in pairing.unmatched_base} >= {"fc1", "fc2"}
    assert "0" in {e.path for e in pairing.unmatched_raw}


def test_independent_work_in_another_order_pairs_by_weights():
    # HF BertEmbeddings looks up token types before positions; paddlenlp does the reverse.
    class TEmb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token_type = torch.nn.Embedding(2, 8)
            self.position = torch.nn.Embedding(64, 8)

        def forward(self, x):
            ids = torch.zeros(x.shape, dtype=torch.long)
            return x.unsqueeze(-1) + self.token_type(ids) + self.position(ids)

    class PEmb(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.position = paddle.nn.Embedding(64, 8)
            self.token_type = paddle.nn.Embedding(2, 8)

        def forward(self, x):
            ids = paddle.zeros(x.shape, dtype="int64")
            return x.unsqueeze(-1) + self.position(ids) + self.token_type(ids)

    assert set(_paths(_pairing(TEmb(), PEmb()))) == {("", ""), ("token_type", "token_type"), ("position", "position")}


def test_library_subclasses_and_activation_classes_pair_with_the_framework_type():
    # A library's LayerNorm subclass against paddle's own, and an activation class of another
    # library (transformers' SiLUActivation derives from nn.Module only) against paddle's Silu.
    class GPTLayerNorm(paddle.nn.LayerNorm):
        pass

    class SiLUActivation(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x)

    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.act = SiLUActivation()
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.act(self.fc(x)))

    class PNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(8, 8)
            self.block = paddle.nn.Sequential(paddle.nn.Silu())  # one level deeper
            self.norm = GPTLayerNorm(8)

        def forward(self, x):
            return self.norm(self.block(self.fc(x)))

    pairs = set(_paths(_pairing(TNet(), PNet())))
    assert {("act", "block.0"), ("norm", "norm"), ("fc", "fc")} <= pairs


def test_roots_always_pair_and_a_changed_stem_is_paired_not_fatal():
    # A stem whose padding changes every later shape: the layers still pair, so blame can name the stem.
    t = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3))
    p = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=2), paddle.nn.ReLU(), paddle.nn.Conv2D(4, 4, 3))
    bfw, rfw = framework_of(t, "base"), framework_of(p, "raw")
    x = np.random.RandomState(0).randn(1, 3, 8, 8).astype("float32")
    bcall, rcall = split_inputs(x, bfw, rfw)
    got = pair_forward(forward_structure(bfw, t, bcall, "base"), forward_structure(rfw, p, rcall, "raw"))
    assert set(_paths(got)) == {("", ""), ("0", "0"), ("1", "1"), ("2", "2")}


def test_a_subclass_pairs_where_it_ran_not_with_a_plain_layer_that_ran_later():
    # Found by the fuzz: raw's first Linear is a user subclass; a plain raw Linear that ran
    # next used to win on the exact class, so weights were copied crosswise and the wrong
    # layer was blamed.
    class Scaled(paddle.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 1.01

    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(8, 8)  # registered first, runs second
            self.l0 = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.l1(self.l0(x))

    class PNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.l0 = Scaled(8, 8)
            self.l1 = paddle.nn.Linear(8, 8)

        def forward(self, x):
            return self.l1(self.l0(x))

    assert _paths(_pairing(TNet(), PNet())) == [("", ""), ("l0", "l0"), ("l1", "l1")]


@pytest.mark.parametrize("widths", [(8, 8), (8, 4)], ids=["same-width", "narrowing"])
def test_a_swapped_activation_pairs_where_it_ran_not_with_the_next_of_its_class(widths):
    # Found by the fuzz: Tanh, Tanh against Sigmoid, Tanh. The first base Tanh took raw's
    # second (the exact class), crossing the pairs, so the swap was blamed on the wrong layer,
    # or (widths differing) a replay crashed on the shapes.
    # Raw's names differ from base's, so only the order can tell.
    nn = paddle.nn
    raw = _renamed(nn.Linear(8, widths[0]), nn.Sigmoid(), nn.Linear(widths[0], widths[1]), nn.Tanh())
    tn = torch.nn
    base = tn.Sequential(tn.Linear(8, widths[0]), tn.Tanh(), tn.Linear(widths[0], widths[1]), tn.Tanh())
    assert _paths(_pairing(base, raw)) == [("", ""), ("0", "p0"), ("1", "p1"), ("2", "p2"), ("3", "p3")]


def _renamed(*layers):
    """A paddle Sequential whose children are named p0, p1... (base's are 0, 1...)."""
    return paddle.nn.Sequential(*((f"p{i}", layer) for i, layer in enumerate(layers)))


def test_a_swapped_activation_before_one_of_the_same_kind_is_paired_not_left_out():
    # Found by the fuzz: ReLU, GELU against GELU (swapped), GELU. The ReLU was left unpaired for
    # the next GELU, although that one has its own counterpart; the bug was blamed on the parent.
    base = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.ReLU(), torch.nn.GELU())
    pairing = _pairing(base, _renamed(paddle.nn.Linear(8, 3), paddle.nn.GELU(), paddle.nn.GELU()))
    assert _paths(pairing) == [("", ""), ("0", "p0"), ("1", "p1"), ("2", "p2")]
    assert not pairing.unmatched_base and not pairing.unmatched_raw


def test_a_swapped_activation_pairs_by_its_path_among_activations_of_both_kinds():
    # Found by the fuzz: ReLU, ReLU, GELU against GELU (swapped), ReLU, GELU. By class alone the
    # first ReLU took raw's second, and the last GELU could take raw's first: pairs crossed.
    def net(lib, first_act):
        nn = lib.nn
        return nn.Sequential(nn.Linear(8, 3), first_act(), nn.ReLU(), nn.GELU())

    pairing = _pairing(net(torch, torch.nn.ReLU), net(paddle, paddle.nn.GELU))
    assert _paths(pairing) == [("", ""), ("0", "0"), ("1", "1"), ("2", "2"), ("3", "3")]


def test_a_swapped_activation_among_renamed_ones_pairs_in_order():
    # Found by the fuzz: GELU, tanh, GELU against Tanh (swapped), tanh, GELU, every raw layer
    # renamed. A look one call ahead still crossed the pairs; a short alignment does not.
    class CustomTanh(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x)

    class PCustomTanh(paddle.nn.Layer):
        def forward(self, x):
            return paddle.tanh(x)

    base = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.GELU(), CustomTanh(), torch.nn.GELU())
    raw = _renamed(paddle.nn.Linear(8, 3), paddle.nn.Tanh(), PCustomTanh(), paddle.nn.GELU())
    assert _paths(_pairing(base, raw)) == [("", ""), ("0", "p0"), ("1", "p1"), ("2", "p2"), ("3", "p3")]


# -- Trees not built alike (tests/structure_models.py), both directions -----------------------------
from tests.structure_models import STRUCTURES, build  # noqa: E402

_BUGS = {"boundaries": "eps", "dense": "eps", "wrappers": "eps", "custom": "grad"}
_BLAMED_RAW = {  # the raw layer that holds the bug, by raw's structure
    "one": "features.2.conv.4", "split": "blocks.1.conv.4",
    "outside": "layers.1.norm", "inside": "layers.1.norm",
    "flat": "stage2.1.branch.3", "nested": "stage2.1.branch.1.1",
    "own": "b1.act",  # backward order: the second block's activation is reached first
}  # fmt: skip
_STRUCTURE_CASES = [
    pytest.param(case, fw, style, id=f"{case}-{fw}->{'paddle' if fw == 'torch' else 'torch'}-base {style}")
    for case, (_, styles) in STRUCTURES.items()
    for fw in ("torch", "paddle")
    for style in styles
]


def _unpaired_weights(result):
    return [w for w in result.warnings if "was not paired" in w or "nothing was copied" in w]


@pytest.mark.parametrize(("case", "fw", "style"), _STRUCTURE_CASES)
def test_trees_built_differently_pair_every_weighted_layer_and_pass(case, fw, style):
    import nbdiff

    base, raw, x = build(case, fw, style)
    result = nbdiff.auto_diff(base, raw, x)
    assert result, result.report()
    assert not _unpaired_weights(result), result.warnings


@pytest.mark.parametrize(("case", "fw", "style"), _STRUCTURE_CASES)
def test_trees_built_differently_blame_the_bug(case, fw, style):
    import nbdiff

    raw_style = next(s for s in STRUCTURES[case][1] if s != style)
    if case == "custom" and raw_style != "own":
        pytest.skip("the bug is in the user's own layer, which this side does not have")
    base, raw, x = build(case, fw, style, _BUGS[case])
    result = nbdiff.auto_diff(base, raw, x)
    d = result.first_divergence
    assert d is not None and d.where == "layer" and d.raw_path == _BLAMED_RAW[raw_style], result.report()
    assert not d.inherited
    if case == "custom":  # both blocks' activations have the wrong gradient: both are findings
        assert d.phase.value == "backward"
        assert [f.raw_path for f in result.findings] == ["b1.act", "b0.act"], result.report()


def test_a_custom_activation_pairs_where_it_sits_not_with_a_library_activation_nearby():
    # Base `b0.act` is a ReLU; raw's is a user's `Rectifier`, and raw's GELU sibling runs two calls
    # later: the pairing must not take the GELU because its class looks like an activation.
    base, raw, _ = build("custom", "torch", "library")
    got = _paths(_pairing_x(base, raw, np.random.RandomState(0).randn(4, 16).astype("float32")))
    assert ("b0.act", "b0.act") in got and ("b0.gelu", "b0.gelu") in got


def _pairing_x(base, raw, x):
    bfw, rfw = framework_of(base, "base"), framework_of(raw, "raw")
    bcall, rcall = split_inputs(x, bfw, rfw)
    return pair_forward(forward_structure(bfw, base, bcall, "base"), forward_structure(rfw, raw, rcall, "raw"))


def test_a_port_that_kept_names_classes_and_shapes_pairs_each_call_at_one_look(monkeypatch):
    # Pairing searched a window of 32 raw calls for every base call: 0.45 s of a 500-layer
    # auto_diff's 3 s. A call whose counterpart at the cursor scores as well as any can is taken.
    import nbdiff.align.pairing as pairing

    looks = []
    real = pairing._score
    monkeypatch.setattr(pairing, "_score", lambda *a, **k: looks.append(1) or real(*a, **k))
    n = 40
    base = torch.nn.Sequential(*[m for _ in range(n) for m in (torch.nn.Linear(8, 8), torch.nn.Tanh())])
    raw = paddle.nn.Sequential(*[m for _ in range(n) for m in (paddle.nn.Linear(8, 8), paddle.nn.Tanh())])
    found = _pairing(base, raw)
    assert _paths(found)[1:] == [(str(i), str(i)) for i in range(2 * n)] and not found.unmatched_base
    assert len(looks) < 3 * (2 * n + 1), len(looks)
