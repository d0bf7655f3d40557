"""The garbage collector is paused while a check runs, and comes back however the check ends."""

import gc

import numpy as np
import pytest

from nbdiff.engine.gc_pause import gc_paused

torch = pytest.importorskip("torch")


def _pair():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    raw = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    return base, raw


def test_auto_diff_runs_the_models_with_the_collector_paused_and_restores_it():
    import nbdiff

    base, raw = _pair()
    seen = []
    raw.register_forward_hook(lambda *a: seen.append(gc.isenabled()))
    assert nbdiff.auto_diff(base, raw, np.ones((2, 4), "float32"))
    assert seen and not any(seen) and gc.isenabled()


def test_the_collector_comes_back_after_the_model_raises():
    import nbdiff
    from nbdiff.errors import ModelCallError

    base, raw = _pair()

    def boom(*args):
        raise RuntimeError("the user's bug")

    raw.register_forward_hook(boom)
    with pytest.raises(ModelCallError):
        nbdiff.auto_diff(base, raw, np.ones((2, 4), "float32"))
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_check_leaves_no_cyclic_garbage_holding_tensors():
    # With the collector paused, anything in a reference cycle stays until the check ends: the
    # recursive closures that flattened layer outputs kept 24 activations of a 2-block transformer.
    import nbdiff

    base, raw = _pair()
    x = np.ones((2, 4), "float32")
    nbdiff.auto_diff(base, raw, x)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        nbdiff.auto_diff(base, raw, x)
        gc.collect()
        tensors = [o for o in gc.garbage if isinstance(o, (torch.Tensor, np.ndarray))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert tensors == []
