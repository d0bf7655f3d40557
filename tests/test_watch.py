"""watch: the user's own loop, recorded and compared step by step."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


def test_raw_gets_base_weights_from_before_base_stepped():
    # Base's whole step (its optimizer included) runs before raw's first call. When the weights are
    # copied then (pairing by execution), they must be base's as its step 0 began, not its updated ones.
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    raw = copy.deepcopy(base)
    with torch.no_grad():
        for p in raw.parameters():
            p.add_(1.0)  # auto_init must replace these
    x = torch.tensor(np.random.RandomState(1).randn(32, 8).astype("float32"))
    with nbdiff.watch(base, raw) as w:
        opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (base, raw)]
        for _ in range(2):
            for model, opt in zip((base, raw), opts):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    assert w.result, w.result.report()
    for b, r in zip(base.parameters(), raw.parameters()):
        torch.testing.assert_close(b, r, rtol=0, atol=1e-6)
