"""Undoing runs whole under Ctrl-C; the Ctrl-C is raised after."""

import os
import signal

import pytest

from nbdiff.trace.interrupts import interrupts_deferred


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
