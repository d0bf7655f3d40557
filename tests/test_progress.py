"""Progress bars for training steps compared and for a recorded loop, quiet when quick or turned off."""

import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")
pytest.importorskip("tqdm")

import nbdiff  # noqa: E402
from nbdiff.engine import progress as progress_module  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _pair():
    base, raw = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    opts = [
        torch.optim.SGD(base.parameters(), lr=0.01),
        paddle.optimizer.SGD(learning_rate=0.01, parameters=raw.parameters()),
    ]
    return base, raw, opts


def test_auto_diff_shows_its_steps(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    base, raw, opts = _pair()
    assert nbdiff.auto_diff(base, raw, inputs("mlp"), optimizers=opts, steps=3)
    assert "nbdiff: steps" in capsys.readouterr().err


def test_watch_shows_the_steps_it_sees_and_the_comparing(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    base, raw, opts = _pair()
    x = inputs("mlp")
    with nbdiff.watch(base, raw) as w:
        for _ in range(3):
            base(torch.tensor(x)).mean().backward()
            opts[0].step()
            opts[0].zero_grad()
            raw(paddle.to_tensor(x)).mean().backward()
            opts[1].step()
            opts[1].clear_grad()
    assert w.result is not None and w.result.steps == 3
    err = capsys.readouterr().err
    assert "nbdiff: steps seen" in err and "nbdiff: comparing steps" in err


def test_quick_calls_and_nbdiff_progress_0_print_nothing(monkeypatch, capsys):
    base, raw, opts = _pair()
    assert nbdiff.auto_diff(base, raw, inputs("mlp"), optimizers=opts, steps=2)  # well under DELAY
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    monkeypatch.setenv("NBDIFF_PROGRESS", "0")
    assert nbdiff.auto_diff(base, raw, inputs("mlp"), optimizers=opts, steps=2)
    assert "nbdiff:" not in capsys.readouterr().err
