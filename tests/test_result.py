"""DiffResult: every step of a watched run is compared, the first divergence stays the answer."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def _train(optimizer, steps=4):
    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    x = inputs("mlp")
    with nbdiff.watch(tb, pb) as w:
        topt = torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01)
        popt = optimizer(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.01)
        for _ in range(steps):
            tb(torch.tensor(x)).pow(2).mean().backward()
            topt.step()
            topt.zero_grad()
            pb(paddle.to_tensor(x)).pow(2).mean().backward()
            popt.step()
            popt.clear_grad()
    return w.result


def test_a_watched_run_compares_every_step_and_keeps_the_first_divergence():
    # paddle's Adam(weight_decay=...) is an L2 penalty, torch's AdamW decays decoupled: step 0's update.
    result = _train(paddle.optimizer.Adam)
    d = result.first_divergence
    assert (d.step, d.phase.value) == (0, "optimizer") and result.steps == 4
    rows = result.step_errors()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["outputs"] < 1 < rows[0]["updates"]  # step 0's forward agreed; its update did not
    assert all(r["outputs"] > 1 for r in rows[1:])  # from then on the outputs drift


def test_an_agreeing_run_stays_under_tolerance_at_every_step():
    result = _train(paddle.optimizer.AdamW)
    assert result and result.steps == 4, result.report()
    rows = result.step_errors()
    within = lambda row: all(v is None or v <= 1 for k, v in row.items() if k != "step")  # noqa: E731
    # Later steps agree too, unless Adam turned a gradient that is rounding noise into a weight that
    # drifted (about 1 random init in 50): then the result says so.
    drift = any("raw's weights differ from where base's updates would have taken them" in w for w in result.warnings)
    assert within(rows[0]) and (drift or all(within(r) for r in rows[1:]))
    fig = result.plot()
    assert fig.axes[0].get_yscale() == "log" and len(fig.axes[0].lines) >= 3


def test_step_errors_of_a_single_comparison():
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    (row,) = result.step_errors()
    assert row["outputs"] > 1 and row["updates"] is None and np.isfinite(row["gradients"])
