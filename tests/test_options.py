"""Options are checked at the door: a clear OptionError/InputError before any model runs."""

import math

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.errors import InputError, OptionError  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _models():
    return BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")


@pytest.mark.parametrize("how", ["auto_diff", "watch"])
def test_the_same_object_as_base_and_raw_is_refused(how):
    # It agreed with itself: a silent SUCCESS that checked nothing.
    m = BUILDERS["mlp"]("torch")
    with pytest.raises(InputError, match="copy.deepcopy"):
        nbdiff.auto_diff(m, m, inputs("mlp")) if how == "auto_diff" else nbdiff.watch(m, m)


@pytest.mark.parametrize(
    "option, says",
    [
        (dict(atol=math.nan), "atol=nan must be a finite number"),
        (dict(atol=-1), "atol=-1 must be a finite number"),
        (dict(rtol="abc"), "rtol='abc' must be a finite number"),
        (dict(layer_map={"fc1": "fc1"}), "use LayerMap"),
        (dict(compare_mode="loose"), "compare_mode='loose'"),
        (dict(diff_phase="sideways"), "diff_phase='sideways'"),
    ],
)
@pytest.mark.parametrize("how", ["auto_diff", "watch"])
def test_bad_options_name_themselves(how, option, says):
    tb, pb = _models()
    with pytest.raises(OptionError, match=says.replace("(", "\\(")):
        nbdiff.auto_diff(tb, pb, inputs("mlp"), **option) if how == "auto_diff" else nbdiff.watch(tb, pb, **option)
    assert not any(m._forward_pre_hooks for m in tb.modules())


def test_run_options():
    tb, pb = _models()
    for bad, says in [
        (dict(steps=0), "steps=0"),
        (dict(steps=True), "steps=True"),
        (dict(steps=2), "needs optimizers"),
    ]:
        with pytest.raises(OptionError, match=says):
            nbdiff.auto_diff(tb, pb, inputs("mlp"), **bad)
    with pytest.raises(InputError, match="loss_fns must be a pair"):
        nbdiff.auto_diff(tb, pb, inputs("mlp"), loss_fns=[None])


@pytest.mark.parametrize("side", ["torch", "paddle"])
def test_no_grad_says_so_and_offers_forward_only(side):
    # paddle: a silent SUCCESS with 0 backward events; torch: a deep autograd error.
    tb, pb = _models()
    block = torch.no_grad() if side == "torch" else paddle.no_grad()
    with block, pytest.raises(InputError, match=f"{side} gradients are off.*diff_phase='forward'"):
        nbdiff.auto_diff(tb, pb, inputs("mlp"))
    with block:
        assert nbdiff.auto_diff(tb, pb, inputs("mlp"), diff_phase="forward")


def test_a_model_with_nothing_trainable_says_so():
    tb, pb = _models()
    for p in tb.parameters():
        p.requires_grad_(False)
    with pytest.raises(InputError, match="base \\(MLP\\) has no trainable parameter.*diff_phase='forward'"):
        nbdiff.auto_diff(tb, pb, inputs("mlp"))


def test_optimizers_that_are_models_or_nothing_callable_are_refused():
    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    x = inputs("mlp")
    with pytest.raises(InputError, match=r"optimizers\[1\] \(raw\) is a model \(.*\), not an optimizer"):
        nbdiff.auto_diff(base, raw, x, optimizers=[torch.optim.SGD(base.parameters(), lr=0.1), raw], steps=2)
    with pytest.raises(InputError, match=r"optimizers\[0\] \(base\) is a str"):
        nbdiff.auto_diff(base, raw, x, optimizers=["adam", "adam"], steps=2)


@pytest.mark.parametrize("verb", ["auto_diff", "watch", "record"])
def test_a_meta_device_model_says_it_has_no_values(verb, tmp_path):
    # A bare NotImplementedError, or an error blaming the model.
    import torch

    with torch.device("meta"):
        meta = torch.nn.Sequential(torch.nn.Linear(16, 8))
    says = r"`0.weight` is on the meta device \(a shape without values\).*to_empty"
    with pytest.raises(InputError, match=says):
        if verb == "auto_diff":
            nbdiff.auto_diff(meta, BUILDERS["mlp"]("paddle"), inputs("mlp"))
        elif verb == "watch":
            nbdiff.watch(BUILDERS["mlp"]("torch"), meta)
        else:
            nbdiff.record(meta, tmp_path / "d")


@pytest.mark.parametrize("verb", ["auto_diff", "watch", "record"])
def test_a_model_compiled_by_paddle_to_static_says_what_to_pass_instead(verb, tmp_path):
    # Its translated forward failed under nbdiff's hooks, and the error blamed the user's model.
    import paddle

    compiled = paddle.jit.to_static(BUILDERS["mlp"]("paddle"))
    says = r"raw \(MLP\): `<root>`: its forward is compiled by paddle.jit.to_static.*full_graph=True"
    if verb == "record":
        says = says.replace("raw", "the model")
    with pytest.raises(InputError, match=says):
        if verb == "auto_diff":
            nbdiff.auto_diff(BUILDERS["mlp"]("torch"), compiled, inputs("mlp"))
        elif verb == "watch":
            nbdiff.watch(BUILDERS["mlp"]("torch"), compiled)
        else:
            nbdiff.record(compiled, tmp_path / "d")
    assert not list(tmp_path.iterdir())  # nothing written
