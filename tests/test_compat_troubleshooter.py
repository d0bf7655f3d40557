"""TroubleShooter's api_dump_* through nbdiff.compat.troubleshooter: dump, compare, CSVs, options."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

from nbdiff.compat import troubleshooter as ts  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from tests.dumps import X, pair  # noqa: E402


@pytest.fixture(autouse=True)
def _clean():
    yield
    ts._reset()


def _dump(net, path, steps=2, **start):
    is_torch = isinstance(net, torch.nn.Module)
    ts.api_dump_init(net, str(path), retain_backward=True)
    ts.api_dump_start(**start)
    for _ in range(steps):
        out = net(torch.tensor(X) if is_torch else paddle.to_tensor(X))
        out.mean().backward()
    ts.api_dump_stop()


def test_dump_and_compare_writes_the_documented_tables(tmp_path):
    base, raw = pair()
    _dump(base, tmp_path / "torch_dump")
    _dump(raw, tmp_path / "paddle_dump")
    result = ts.api_dump_compare(str(tmp_path / "torch_dump"), str(tmp_path / "paddle_dump"), str(tmp_path / "out"))
    assert result and result.steps == 2
    names = {p.name for p in (tmp_path / "out").iterdir()}
    for step in (0, 1):
        assert {
            f"ts_api_mapping_{step}.csv",
            f"ts_api_forward_compare_{step}.csv",
            f"ts_api_backward_compare_{step}.csv",
        } <= names


def test_a_functional_bug_is_named_by_api(tmp_path):
    base, raw = pair("functional")
    _dump(base, tmp_path / "a", steps=1)
    _dump(raw, tmp_path / "b", steps=1)
    d = ts.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), rtol=1e-4, atol=1e-4).first_divergence
    assert (d.where, d.base_path) == ("api", "::gelu")


def test_modes_dump_types_and_statedict(tmp_path):
    base, raw = pair()
    ts.api_dump_init(base, str(tmp_path / "s"), compare_statedict=True)
    assert (tmp_path / "s" / "torch_net.safetensors").is_file()
    _dump(base, tmp_path / "s", steps=1, mode="list", scope=["fc1", "norm"], dump_type="statistics",
          filter_data=False, filter_stack=False)  # fmt: skip
    _dump(raw, tmp_path / "t", steps=1, mode="list", scope=["fc1", "norm"], dump_type="statistics")
    result = ts.api_dump_compare(str(tmp_path / "s"), str(tmp_path / "t"), ignore_unmatched=True)
    assert result and {e.base.path for e in result.events} <= {"fc1", "norm"}


def test_nan_on_both_sides_counts_unless_equal_nan(tmp_path):
    class NaNs(torch.nn.Module):
        def forward(self, x):
            return torch.log(x - 10.0)

    class PNaNs(paddle.nn.Layer):
        def forward(self, x):
            return paddle.log(x - 10.0)

    for net, path in ((NaNs(), "a"), (PNaNs(), "b")):
        is_torch = isinstance(net, torch.nn.Module)
        ts.api_dump_init(net, str(tmp_path / path))
        ts.api_dump_start()
        net(torch.tensor(X) if is_torch else paddle.to_tensor(X))
        ts.api_dump_stop()
    assert ts.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), equal_nan=True)
    assert not ts.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), equal_nan=False)


def test_misuse_is_explained():
    ts._reset()
    with pytest.raises(OptionError, match="api_dump_init"):
        ts.api_dump_start()
    ts.api_dump_init(pair()[0], "unused")
    with pytest.raises(OptionError, match="dump_type='npz'"):
        ts.api_dump_start(dump_type="npz")
    with pytest.raises(OptionError, match="no dump is running"):
        ts.api_dump_stop()
    assert np.isfinite(X).all()
