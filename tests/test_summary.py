"""A statistics dump's activations and gradients, summarised by their framework instead of copied."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import paddle  # noqa: E402
import torch  # noqa: E402

import nbdiff  # noqa: E402
from nbdiff.trace.dump.store import read_dump  # noqa: E402
from nbdiff.trace.recorder import Recorder  # noqa: E402
from nbdiff.trace.stats import tensor_sample, tensor_stats  # noqa: E402
from tests.dumps import pair, train  # noqa: E402


@pytest.fixture(autouse=True)
def reducing(monkeypatch):
    """Both frameworks reduce here whatever the cores (``prefers_reducing``: its own tests)."""
    from nbdiff.frameworks.paddle import PaddleFramework
    from nbdiff.frameworks.torch import TorchFramework

    for adapter in (TorchFramework, PaddleFramework):
        monkeypatch.setattr(adapter, "prefers_reducing", lambda self, tensor: True)


def test_a_statistics_dump_copies_no_activation_to_the_host(monkeypatch, tmp_path):
    # Each activation was copied whole, then reduced by numpy on the writer's thread: with default
    # threads a torch CNN's recorded step cost 3.5x its bare one.
    base, raw = pair()  # its weight copy runs both models, recorded: before the count
    copied: list[str] = []
    hold = Recorder.hold

    def counted(self, a, copy=True):
        code = sys._getframe(1).f_code  # who asked: a layer call, a gradient's hook, a parameter's...
        copied.append(code.co_name if code.co_filename.endswith("recorder.py") else "elsewhere")
        return hold(self, a, copy)

    monkeypatch.setattr(Recorder, "hold", counted)
    activations = {"_keep", "<lambda>", "hook"}  # forward values, gradients (copied, summed)
    train(base, tmp_path / "s", steps=1, dump_type="statistics")
    assert not activations & set(copied), copied  # torch: parameters' gradients only
    copied.clear()
    train(raw, tmp_path / "p", steps=1, dump_type="statistics")
    assert "_keep" not in copied and {"<lambda>", "hook"} & set(copied)  # paddle's gradients arrive in parts
    copied.clear()
    train(base, tmp_path / "t", steps=1, dump_type="tensor")
    assert "_keep" in copied


@pytest.mark.parametrize("side", [0, 1])
def test_summarised_statistics_and_samples_are_those_of_the_values(tmp_path, side):
    model = pair()[side]  # recorded twice, its weights kept (lr=0)
    summary = read_dump(train(model, tmp_path / "s", steps=1, lr=0.0, dump_type="statistics"))
    values = read_dump(train(model, tmp_path / "t", steps=1, lr=0.0, dump_type="tensor"))
    checked = 0
    for es, et in zip(summary.steps[0], values.steps[0]):
        for s, t in zip(es.inputs + es.outputs, et.inputs + et.outputs):
            if t.value is None or s.stats is None:
                continue
            want, scale = tensor_stats(t.value), float(np.abs(t.value).max()) or 1.0
            for f in ("min", "max", "mean", "std", "abs_mean"):
                assert abs(getattr(s.stats, f) - getattr(want, f)) <= 1e-6 * scale, (es.path, s.name, f)
            if s.sample is not None:
                np.testing.assert_array_equal(s.sample, tensor_sample(t.value))
                checked += 1
    assert checked > 10


def _conv_bn(fw: str):
    if fw == "torch":
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4), paddle.nn.ReLU())


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_a_batchnorm_over_few_values_per_channel_keeps_its_values_though_its_input_was_summarised(tmp_path, fw):
    # 2 x 2 x 2 = 8 values per channel: compare recomputes this BatchNorm from its values.
    model, x = _conv_bn(fw), np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype("float32")
    with nbdiff.record(model, tmp_path / "d", dump_type="statistics") as rec:
        out = model(torch.tensor(x) if fw == "torch" else paddle.to_tensor(x))
        out.sum().backward()
    dump = read_dump(rec.path)
    by_path = {(e.phase.value, e.path): e for e in dump.steps[0]}
    for phase in ("forward", "backward"):
        norm = by_path[(phase, "1")]
        assert all(t.value is not None for t in norm.inputs + norm.outputs), phase
    conv = by_path[("forward", "0")]
    assert conv.outputs[0].value is None and conv.outputs[0].sample is not None


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_an_activation_holding_nan_is_copied_and_its_nan_counted(tmp_path, fw):
    x = np.array([[1.0, -1.0, 4.0]], "float32")
    model = torch.nn.Sequential(torch.nn.Identity()) if fw == "torch" else paddle.nn.Sequential(paddle.nn.Identity())
    with nbdiff.record(model, tmp_path / "d", dump_type="statistics") as rec:
        xt = torch.tensor(x) if fw == "torch" else paddle.to_tensor(x)
        model(xt.log() if fw == "torch" else paddle.log(xt))
    out = next(e for e in read_dump(rec.path).steps[0] if e.path == "0").outputs[0]
    assert out.stats.nan == 1 and out.stats.max == pytest.approx(np.log(4.0))
