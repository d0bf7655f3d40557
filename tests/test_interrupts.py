"""Undoing runs whole under Ctrl-C; the Ctrl-C is raised after."""

import os
import signal

import pytest

from nbdiff.frameworks import interrupts
from nbdiff.frameworks.interrupts import done_whole, interrupts_deferred, undone_whole


def test_a_ctrl_c_during_the_block_is_raised_after_it_ran_to_its_end():
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the signal")
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_is_raised_and_the_handler_is_back():
    with interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_undo_runs_once_whatever_moment_the_ctrl_c_comes(monkeypatch):
    done = []
    undone_whole(lambda: done.append("quiet"))
    with pytest.raises(KeyboardInterrupt):  # during it: it runs to its end, then the Ctrl-C
        undone_whole(lambda: (os.kill(os.getpid(), signal.SIGINT), done.append("during")))
    real = interrupts.interrupts_deferred

    def interrupted_as_it_begins():
        raise KeyboardInterrupt  # before the deferral holds SIGINT: the block never ran

    monkeypatch.setattr(interrupts, "interrupts_deferred", interrupted_as_it_begins)
    with pytest.raises(KeyboardInterrupt):
        undone_whole(lambda: done.append("as it began"))
    monkeypatch.setattr(interrupts, "interrupts_deferred", real)
    with pytest.raises(ValueError):  # its own error: raised, and it is not run again
        undone_whole(lambda: (done.append("raising"), int("x")))
    assert done == ["quiet", "during", "as it began", "raising"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_putting_on_is_whole_or_undone_whatever_moment_the_ctrl_c_comes(monkeypatch):
    on = []
    done_whole(lambda: on.append("hook"), on.clear)
    assert on == ["hook"]
    with pytest.raises(KeyboardInterrupt):  # during it: all of it is put on, then taken off, then the Ctrl-C
        done_whole(lambda: (on.append("second"), os.kill(os.getpid(), signal.SIGINT)), on.clear)
    assert on == []

    def interrupted_as_it_begins():
        raise KeyboardInterrupt

    monkeypatch.setattr(interrupts, "interrupts_deferred", interrupted_as_it_begins)
    undone = []
    with pytest.raises(KeyboardInterrupt):  # before it held SIGINT: nothing put on, the undo still asked
        done_whole(lambda: on.append("never"), lambda: undone.append("undo"))
    assert on == [] and undone == ["undo"]


def _drop_a_ctrl_c():
    """What a Ctrl-C landing in a weak reference's callback does: printed as "Exception ignored", lost."""
    import weakref

    class Thing:
        pass

    def callback(_):
        raise KeyboardInterrupt

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
    return ref


@pytest.mark.parametrize("fw_name", ["torch", "paddle"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_python_drops_in_a_callback_stops_the_watched_loop_at_the_next_layer_call(fw_name):
    """Torch's, paddle's or the user's weak reference callbacks and __del__ methods run in the
    middle of a step: a Ctrl-C there was dropped and the %%modeldiff loop ran on."""
    import numpy as np

    import nbdiff

    fw = pytest.importorskip(fw_name)
    other = pytest.importorskip("paddle" if fw_name == "torch" else "torch")
    nn = fw.nn
    made = []

    class Net(nn.Module if fw_name == "torch" else nn.Layer):
        def __init__(self, drop=False):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.drop = drop

        def forward(self, x):
            x = self.a(x)
            if self.drop and len(made) == 2:
                _drop_a_ctrl_c()
            return self.b(x)

    base = other.nn.Sequential(other.nn.Linear(4, 4), other.nn.Linear(4, 4))
    raw = Net(drop=True)
    x = np.ones((2, 4), "float32")
    as_raw, as_base = (fw.tensor, other.to_tensor) if fw_name == "torch" else (fw.to_tensor, other.tensor)
    with pytest.raises(KeyboardInterrupt), nbdiff.watch(base, raw, auto_init=False):
        for _ in range(5):
            base(as_base(x))
            raw(as_raw(x))
            made.append(1)
    assert len(made) == 2  # the third step's raw call stopped at its next layer, `b`
