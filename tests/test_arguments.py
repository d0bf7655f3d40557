"""Constructor arguments read from paired layers, in torch's meaning, both directions."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.align.arguments import argument_diffs, layer_arguments  # noqa: E402

CASES = [
    # (torch layer, paddle layer, differing argument or None)
    (lambda: torch.nn.LayerNorm(8), lambda: paddle.nn.LayerNorm(8, epsilon=1e-3), "eps"),
    (lambda: torch.nn.LayerNorm(8), lambda: paddle.nn.LayerNorm(8), None),
    (lambda: torch.nn.GELU(), lambda: paddle.nn.GELU(approximate=True), "approximate"),
    (lambda: torch.nn.GELU(approximate="tanh"), lambda: paddle.nn.GELU(approximate=True), None),
    # torch momentum m is paddle momentum 1 - m: 0.1 and 0.9 agree, 0.1 and 0.1 do not.
    (lambda: torch.nn.BatchNorm2d(4, momentum=0.1), lambda: paddle.nn.BatchNorm2D(4, momentum=0.9), None),
    (lambda: torch.nn.BatchNorm2d(4, momentum=0.1), lambda: paddle.nn.BatchNorm2D(4, momentum=0.1), "momentum"),
    (lambda: torch.nn.Conv2d(3, 4, 3, padding=1), lambda: paddle.nn.Conv2D(3, 4, 3, padding=1), None),
    (lambda: torch.nn.Conv2d(3, 4, 3, padding=1), lambda: paddle.nn.Conv2D(3, 4, 3, padding=0), "padding"),
    (lambda: torch.nn.Conv2d(3, 4, 3), lambda: paddle.nn.Conv2D(3, 4, 3, padding_mode="reflect"), "padding_mode"),
    (lambda: torch.nn.Linear(3, 4), lambda: paddle.nn.Linear(3, 4, bias_attr=False), "bias"),
    (lambda: torch.nn.Dropout(0.1), lambda: paddle.nn.Dropout(0.1, mode="downscale_in_infer"), "dropout mode"),
    (lambda: torch.nn.Dropout(0.1), lambda: paddle.nn.Dropout(0.2), "dropout p"),
    (lambda: torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
     lambda: paddle.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), "align_corners"),
    (lambda: torch.nn.TransformerEncoderLayer(8, 2, 16), lambda: paddle.nn.TransformerEncoderLayer(8, 2, 16), None),
    (lambda: torch.nn.TransformerEncoderLayer(8, 2, 16),
     lambda: paddle.nn.TransformerEncoderLayer(8, 2, 16, activation="gelu"), "activation"),
    (lambda: torch.nn.Conv2d(3, 4, 3), lambda: paddle.nn.Conv2D(3, 4, 3, data_format="NHWC"), "data_format"),
]  # fmt: skip


@pytest.mark.parametrize("make_torch, make_paddle, differs", CASES)
@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_only_arguments_whose_meaning_differs_are_reported(make_torch, make_paddle, differs, direction):
    t, p = make_torch(), make_paddle()
    found = (
        argument_diffs("torch", t, "paddle", p)
        if direction == "torch->paddle"
        else argument_diffs("paddle", p, "torch", t)
    )
    assert [d.name for d in found] == ([differs] if differs else []), found


def test_descriptions_read_as_the_user_wrote_them():
    (d,) = argument_diffs("torch", torch.nn.LayerNorm(8), "paddle", paddle.nn.LayerNorm(8, epsilon=1e-3))
    assert d.describe() == "eps: base 1e-05, raw 0.001"
    (m,) = argument_diffs("torch", torch.nn.BatchNorm1d(4), "paddle", paddle.nn.BatchNorm1D(4, momentum=0.1))
    assert m.describe().startswith("momentum: base 0.1, raw 0.9") and "1 - m" in m.describe()


def test_unreadable_or_missing_layers_give_nothing():
    assert argument_diffs("torch", None, "paddle", paddle.nn.GELU()) == []
    assert argument_diffs("torch", torch.nn.ReLU(), "paddle", paddle.nn.GELU()) == []


def test_arguments_are_read_from_the_instance_its_class_and_its_parameters_alike():
    # The attributes a class has are found once per class; each instance's own are read each time.
    class Norm:
        eps = 1e-3  # on the class

        @property
        def momentum(self):
            return 0.3

    a, b = Norm(), Norm()
    b.eps = 1e-6  # on the instance, shadowing the class's
    assert layer_arguments("torch", a) == {"eps": 1e-3, "momentum": 0.3}
    assert layer_arguments("torch", b) == {"eps": 1e-6, "momentum": 0.3}

    class Dense:
        def __init__(self, bias):
            self._parameters = {"weight": object(), "bias": object() if bias else None}

    assert layer_arguments("torch", Dense(True)) == {"bias": True}
    assert layer_arguments("torch", Dense(False)) == {"bias": False}
    assert layer_arguments("torch", Norm()).get("bias") is None  # no weight: no bias argument
