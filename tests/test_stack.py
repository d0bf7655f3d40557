import os

from nbdiff.trace.origin import stack as stack_module
from nbdiff.trace.origin.stack import user_stack

HERE = os.path.dirname(os.path.abspath(__file__))


def _called_here(hidden):
    return user_stack(hidden)


def test_user_frames_are_kept_innermost_first_and_hidden_roots_left_out():
    frames = _called_here(())
    assert [f.function for f in frames[:2]] == [
        "_called_here",
        "test_user_frames_are_kept_innermost_first_and_hidden_roots_left_out",
    ]
    assert frames[0].filename == os.path.abspath(__file__) and frames[0].lineno > 0
    assert not any(f.filename.startswith(os.path.dirname(stack_module.__file__)) for f in frames)  # nbdiff's own
    assert not any(f.filename == os.path.abspath(__file__) for f in _called_here((HERE,)))


def test_each_set_of_hidden_roots_decides_for_itself_once_per_function():
    # The verdict per code object is remembered, but per set of hidden roots: a recording with
    # filter_stack=False (no roots hidden) must not inherit another's verdicts, nor the reverse.
    hidden = _called_here((HERE,))
    shown = _called_here(())
    assert not any(f.function == "_called_here" for f in hidden)
    assert shown[0].function == "_called_here"
    assert not any(f.function == "_called_here" for f in _called_here((HERE,)))
    assert _called_here(())[0].function == "_called_here"


def test_the_remembered_verdicts_stay_bounded(monkeypatch):
    # A notebook compiles new code objects for every cell it runs, and each is held while remembered.
    monkeypatch.setattr(stack_module, "_verdicts", {})
    monkeypatch.setattr(stack_module, "_VERDICTS_MAX", 3)
    walked = 20  # one walk: up to 12 user frames (the default limit) and the hidden ones among them
    for _ in range(3):
        for fn in [compile("lambda: _called_here(())", "<cell>", "eval") for _ in range(5)]:
            assert eval(fn)()[0].function == "_called_here"  # noqa: S307 - a fixed test string
            assert len(stack_module._verdicts[()]) <= walked


def test_the_line_ipython_makes_of_a_cell_magic_is_not_a_user_frame():
    # %%modeldiff showed an extra frame "Cell In [N], line 1": get_ipython().run_cell_magic(...).
    from nbdiff.trace.origin.stack import user_stack

    class Shell:
        def run_cell_magic(self, name, line, cell):
            return user_stack(())

    code = compile("frames = get_ipython().run_cell_magic('modeldiff', 'a b', 'x')", "<ipython-input-7-abc>", "exec")
    ns = {"get_ipython": lambda: Shell()}
    exec(code, ns)
    assert not [f for f in ns["frames"] if f.filename == "<ipython-input-7-abc>"], ns["frames"]
    # A cell of the user's own code stays.
    code = compile("frames = stack()", "<ipython-input-8-abc>", "exec")
    ns = {"stack": lambda: user_stack(())}
    exec(code, ns)
    assert "<ipython-input-8-abc>" in [f.filename for f in ns["frames"]]


def test_inside_frames_are_the_sublayer_calls_frames_within_its_parents_call():
    from nbdiff.trace.origin.stack import Frame, inside_frames

    cell = Frame("nb.py", 11, "<module>")
    parent = (cell,)
    child = (Frame("m.py", 20, "attention"), Frame("m.py", 23, "forward"), cell)
    assert inside_frames(parent, child) == child[:2]
    # Stacks are cut at a depth from the outside: the parent's outer frames may be missing from the child's.
    deep_parent = (Frame("m.py", 40, "forward"), Frame("m.py", 50, "run"), cell)
    deep_child = (Frame("m.py", 20, "attention"), Frame("m.py", 40, "forward"), Frame("m.py", 50, "run"))
    assert inside_frames(deep_parent, deep_child) == deep_child[:1]
    assert inside_frames(parent, (Frame("other.py", 1, "f"),)) == ()
    # A parent called from no user code (a trainer's loop): all of the child's frames are inside it.
    assert inside_frames((), child[:2]) == child[:2]


def test_every_frame_of_nbdiff_is_hidden_wherever_its_module_sits():
    # The stack module moved a folder deeper (trace/origin) and hid only trace/'s frames: the engine's
    # and the verbs' would have shown up in user stacks as the user's code.
    import nbdiff

    for where in ("engine", "notebook", ""):
        path = os.path.join(os.path.dirname(nbdiff.__file__), where, "somewhere.py")
        namespace = {"user_stack": user_stack}
        exec(compile("def inside():\n    return user_stack(())\n", path, "exec"), namespace)
        frames = namespace["inside"]()
        assert frames and not any(f.filename == path for f in frames), (where, frames[:2])
