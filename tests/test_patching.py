"""API patching: outermost calls reported, originals restored on error and in any exit order."""

import types

import pytest

from nbdiff.frameworks.patching import active_patches, patched


def test_patched_reports_the_outermost_call_and_restores_even_on_error():
    mod = types.SimpleNamespace(double=lambda x: x * 2)
    mod.quad = lambda x: mod.double(mod.double(x))
    original = mod.double
    seen = []
    with (
        pytest.raises(RuntimeError),
        patched([(mod, "double", "double"), (mod, "quad", "quad")], lambda n, a, k, o: seen.append((n, o))),
    ):
        assert mod.quad(1) == 4
        raise RuntimeError("user error")
    assert seen == [("quad", 4)]  # double ran inside quad: its implementation, not reported
    assert mod.double is original


def test_patched_class_attributes_are_restored_exactly():
    class Base:
        def op(self):
            return 1

    class Child(Base):
        pass

    with patched([(Child, "op", "op")], lambda *a: None):
        assert "op" in vars(Child)
    assert "op" not in vars(Child) and Child().op() == 1


def test_sessions_that_end_out_of_order_restore_every_original():
    # A enters, B enters, A exits, B exits: 672 paddle functions stayed wrapped.
    mod = types.SimpleNamespace(op=lambda x: x + 1)
    original = mod.op
    seen_a, seen_b = [], []
    a = patched([(mod, "op", "op")], lambda n, *_: seen_a.append(n))
    b = patched([(mod, "op", "op")], lambda n, *_: seen_b.append(n))
    a.__enter__()
    b.__enter__()
    mod.op(1)
    a.__exit__(None, None, None)
    mod.op(2)
    assert (len(seen_a), len(seen_b)) == (1, 2) and mod.op is not original
    b.__exit__(None, None, None)
    assert mod.op is original and active_patches() == 0


def test_real_paddle_tables_are_restored_whatever_the_exit_order():
    paddle = pytest.importorskip("paddle")
    from nbdiff.frameworks import framework_of

    fw = framework_of(paddle.nn.Linear(2, 2), "m")
    before = (paddle.matmul, paddle.Tensor.__add__, paddle.nn.functional.gelu)
    a, b = fw.api_tracing(lambda *a: None), fw.api_tracing(lambda *a: None)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert (paddle.matmul, paddle.Tensor.__add__, paddle.nn.functional.gelu) == before and active_patches() == 0


def test_a_ctrl_c_while_patches_are_undone_undoes_them_all_then_raises():
    # A real SIGINT during the undo left hundreds of paddle functions wrapped (1 to 3 runs in 30).
    import os
    import signal

    class Owner:
        interrupt = False

        def __setattr__(self, name, value):
            if Owner.interrupt:  # the first restore is interrupted
                Owner.interrupt = False
                os.kill(os.getpid(), signal.SIGINT)
            object.__setattr__(self, name, value)

    owner = Owner()
    originals = {}
    for name in ("a", "b", "c"):
        object.__setattr__(owner, name, lambda x, n=name: n)
        originals[name] = getattr(owner, name)
    with pytest.raises(KeyboardInterrupt):
        with patched([(owner, n, n) for n in originals], lambda *a: None):
            Owner.interrupt = True
    assert all(getattr(owner, n) is f for n, f in originals.items())
    assert active_patches() == 0
