"""%load_ext nbdiff, %modeldiff and %%modeldiff through IPython's InteractiveShell."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")
pytest.importorskip("anywidget")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from nbdiff.errors import OptionError  # noqa: E402
from nbdiff.notebook.magics import parse_flags  # noqa: E402
from nbdiff.view.sources import source_excerpt  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402

TRAIN = """
topt = torch.optim.SGD(tb.parameters(), lr=0.1)
popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters())
for i in range(3):
    tb(torch.tensor(x)).mean().backward(); topt.step(); topt.zero_grad()
    pb(paddle.to_tensor(x)).mean().backward(); popt.step(); popt.clear_grad()
"""


@pytest.fixture()
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbdiff")
    shell.user_ns.update(torch=torch, paddle=paddle, x=inputs("mlp"))
    yield shell
    shell.run_line_magic("unload_ext", "nbdiff")
    InteractiveShell.clear_instance()


def _models(ip, bug=None):
    ip.user_ns.update(tb=BUILDERS["mlp"]("torch"), pb=BUILDERS["mlp"]("paddle", bug))


def _hooks_left(ip):
    tb, pb = ip.user_ns["tb"], ip.user_ns["pb"]
    return any(m._forward_pre_hooks for m in tb.modules()) or any(
        m._forward_pre_hooks for m in pb.sublayers(include_self=True)
    )


def test_load_and_unload_register_and_remove_the_magics():
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "nbdiff")
        assert "modeldiff" in shell.magics_manager.magics["line"]
        assert "modeldiff" in shell.magics_manager.magics["cell"]
        shell.run_line_magic("unload_ext", "nbdiff")
        assert "modeldiff" not in shell.magics_manager.magics["line"]
    finally:
        InteractiveShell.clear_instance()


def test_line_magic_runs_auto_diff_and_stores_the_result(ip, capsys):
    _models(ip, "eps")
    ip.run_line_magic("modeldiff", "tb pb x --out found")
    result = ip.user_ns["found"]
    assert result.first_divergence.base_path == "norm"
    # IPython's magic machinery sits between the test and the model: not user code.
    assert not any("IPython" in f.filename for f in result.first_divergence.base_stack)
    assert "FAILED" in capsys.readouterr().out
    _models(ip)
    ip.run_line_magic("modeldiff", "tb pb x --single-step --atol 1e-4 --mode mean --phase forward")
    result = ip.user_ns["_modeldiff"]
    assert result and result.options["single_step"] and result.options["atol"] == 1e-4
    assert result.options["compare_mode"] == "mean" and not result.select(phase="backward")


def test_api_flag_traces_calls_inside_layers(ip):
    ip.user_ns.update(tb=BUILDERS["mlp"]("torch"), pb=BUILDERS["mlp"]("paddle", "functional"))
    ip.run_line_magic("modeldiff", "tb pb x --api")
    assert ip.user_ns["_modeldiff"].first_divergence.where == "api"
    ip.user_ns.update(tb=BUILDERS["mlp"]("torch"), pb=BUILDERS["mlp"]("paddle", "functional"))
    ip.run_cell_magic("modeldiff", "tb pb --api", TRAIN)
    assert ip.user_ns["_modeldiff"].first_divergence.base_path == "::gelu"


def test_line_magic_with_losses_and_optimizers(ip):
    _models(ip)
    tb, pb = ip.user_ns["tb"], ip.user_ns["pb"]
    ip.user_ns.update(
        tl=lambda out: (out**2).mean(),
        pl=lambda out: (out**2).mean(),
        topt=torch.optim.SGD(tb.parameters(), lr=0.1),
        popt=paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters()),
    )
    ip.run_line_magic("modeldiff", "tb pb x --loss tl pl --opt topt popt --steps 2")
    result = ip.user_ns["_modeldiff"]
    assert result and result.steps == 2 and len(result.select(phase="optimizer")) == 8


def test_cell_magic_compares_every_step_of_the_users_loop(ip):
    _models(ip)
    ip.run_cell_magic("modeldiff", "tb pb", TRAIN)
    result = ip.user_ns["_modeldiff"]
    assert result, result.report()
    assert result.steps == 3 and len(result.select(phase="optimizer")) == 3 * 4
    assert not _hooks_left(ip)


def test_the_line_magic_compares_every_step_it_is_asked_for_and_draws_their_chart(ip):
    """`%modeldiff ... --steps 3` stopped at the first diverging step without saying so, and showed
    no step chart; `%%modeldiff` compares every step."""
    from nbdiff.view.model import step_rows

    _models(ip, "eps")
    ip.run_cell("topt = torch.optim.SGD(tb.parameters(), lr=0.1)")
    ip.run_cell("popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters())")
    ip.run_line_magic("modeldiff", "tb pb x --steps 3 --opt topt popt")
    result = ip.user_ns["_modeldiff"]
    assert (result.first_divergence.step, result.first_divergence.base_path) == (0, "norm")
    assert result.steps == 3 and [r["step"] for r in step_rows(result)] == [0, 1, 2]
    assert all(r["outputs"] > 1 for r in step_rows(result))  # the bug is in every step
    assert not _hooks_left(ip)


def test_cell_magic_blames_a_backward_only_bug(ip):
    _models(ip, "backward")
    ip.run_cell_magic("modeldiff", "tb pb", TRAIN)
    d = ip.user_ns["_modeldiff"].first_divergence
    assert (d.phase.value, d.base_path, d.step) == ("backward", "mid", 0)
    # The stack reaches the cell's own line, shown as cell source by the view.
    cells = [f for f in d.base_stack if source_excerpt(f.filename, f.lineno)["kind"] == "cell"]
    assert (
        cells
        and "tb(torch.tensor(x))" in source_excerpt(cells[0].filename, cells[0].lineno)["lines"][cells[0].lineno - 1]
    )


def test_frames_are_named_by_cell_and_show_the_cell_as_written(ip):
    # The user's own loop in a %%modeldiff cell, with a line magic in it that IPython rewrites.
    _models(ip, "eps")
    cell = "%%modeldiff tb pb\n%time y = 1\n" + TRAIN.strip()
    assert ip.run_cell(cell, store_history=True).success
    count = ip.execution_count - 1
    d = ip.user_ns["_modeldiff"].first_divergence
    frame = next(f for f in d.base_stack if source_excerpt(f.filename, f.lineno)["kind"] == "cell")
    s = source_excerpt(frame.filename, frame.lineno)
    assert s["label"] == f"Cell In [{count}], line {frame.lineno}"
    # Line numbers match the editor (line 1 is the magic), and the text is the user's, not the rewrite.
    assert s["lines"] == cell.split("\n") and "tb(torch.tensor(x))" in s["lines"][frame.lineno - 1]


def test_cell_magic_blames_an_optimizer_bug_by_parameter(ip):
    _models(ip)
    cell = TRAIN.replace(
        "popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters())",
        "popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=[{'params': pb.fc2.parameters(), "
        "'learning_rate': 1.1}, {'params': [p for n, p in pb.named_parameters() if not n.startswith('fc2.')]}])",
    )
    ip.run_cell_magic("modeldiff", "tb pb", cell)
    d = ip.user_ns["_modeldiff"].first_divergence
    assert (d.phase.value, d.where, d.step) == ("optimizer", "parameter", 0)
    assert d.parameter in ("fc2.weight", "fc2.bias")


def test_cell_magic_single_step_needs_base_first(ip, capsys):
    _models(ip, "weight")
    ip.run_cell_magic("modeldiff", "tb pb --single-step", TRAIN)
    assert ip.user_ns["_modeldiff"].first_divergence.base_path == "fc2"
    swapped = "pb(paddle.to_tensor(x)).mean().backward()\ntb(torch.tensor(x)).mean().backward()\n"
    ip.user_ns.pop("_modeldiff")
    capsys.readouterr()
    run = ip.run_cell("%%modeldiff tb pb --single-step\n" + swapped)
    out = capsys.readouterr()
    text = out.out + out.err
    assert not run.success and "base model must run first" in text and "nothing was compared" in text
    # The user's line (numbered as in the editor: the magic's line is 1), not nbdiff's internals.
    assert "line 2" in text and "pb(paddle.to_tensor(x))" in text
    assert "nbdiff/" not in text and "site-packages" not in text, text
    assert "_modeldiff" not in ip.user_ns
    assert not _hooks_left(ip)


def test_a_cell_that_raises_shows_the_users_traceback_and_cleans_up(ip, capsys):
    _models(ip)
    tb, pb = ip.user_ns["tb"], ip.user_ns["pb"]
    pb.eval()
    run = ip.run_cell("%%modeldiff tb pb\ntb(torch.tensor(x))\nraise ValueError('bug in my loop')")
    out = capsys.readouterr()
    text = out.out + out.err
    assert "bug in my loop" in text and "nothing was compared" in text
    # The cell fails, so "Run All" and nbconvert --execute stop here.
    assert not run.success and type(run.error_in_exec).__name__ == "CellFailed"
    assert not _hooks_left(ip) and tb.training and not pb.training


def test_the_line_magic_shows_the_models_own_traceback_not_nbdiffs(ip, capsys):
    _models(ip)
    ip.run_cell("def broken(x):\n    raise ValueError('shape bug in my forward')\npb.fc2.forward = broken")
    capsys.readouterr()
    run = ip.run_cell("%modeldiff tb pb x")
    out = capsys.readouterr()
    text = out.out + out.err
    assert not run.success and type(run.error_in_exec).__name__ == "ModelCallError"
    # The user's frame, named by its cell, with the line as written; then nbdiff's one message.
    assert "Cell In [" in text and "raise ValueError('shape bug in my forward')" in text
    assert "The raw model (MLP) raised ValueError" in text and "removed its hooks" in text
    # Not nbdiff's or the frameworks' internals (about 6 KB of them before).
    assert "nbdiff/" not in text and "site-packages" not in text and len(text) < 2000, text
    del ip.user_ns["pb"].fc2.forward
    assert not _hooks_left(ip)


def test_an_interrupted_cell_fails_as_an_interrupt_and_cleans_up(ip, capsys):
    _models(ip)
    run = ip.run_cell("%%modeldiff tb pb\ntb(torch.tensor(x))\nraise KeyboardInterrupt")
    assert not run.success and isinstance(run.error_in_exec, KeyboardInterrupt)
    assert "interrupted" in capsys.readouterr().out
    assert not _hooks_left(ip)


@pytest.mark.parametrize("name", ["__builtins__", "_", "_i3", "Out", "In", "get_ipython", "print", "x y", "class"])
def test_out_names_ipython_or_python_rely_on_are_refused(ip, name, capsys):
    _models(ip)
    keep = ip.user_ns.get(name)
    run = ip.run_cell(f"%modeldiff tb pb x --out '{name}'")
    assert not run.success and "--out" in capsys.readouterr().out
    assert ip.user_ns.get(name) is keep


def test_unknown_names_and_bad_flags_get_one_line_and_the_usage(ip, capsys):
    _models(ip)
    for cell, says in [
        ("%modeldiff tb missing x", "no variable named 'missing'"),
        ("%modeldiff tb pb x --steps many", "invalid int value"),
        ("%%modeldiff tb pb --steps 3\n" + TRAIN, "--steps, --loss and --opt are for the line magic"),
    ]:
        run = ip.run_cell(cell)
        out = capsys.readouterr().out
        assert not run.success and says in out and "usage: %modeldiff" in out
        assert "Traceback" not in out and "nbdiff/" not in out, out


def test_parse_flags_defaults():
    args = parse_flags("a b c", cell=False)
    assert (args.base, args.raw, args.inputs, args.out, args.compare_mode, args.diff_phase) == (
        "a", "b", "c", "_modeldiff", "strict", "both",
    )  # fmt: skip
    assert np.isclose(parse_flags("a b --atol 1e-3", cell=True).atol, 1e-3)


def test_models_passed_to_opt_are_refused_before_anything_runs(ip, capsys):
    _models(ip)
    tb = ip.user_ns["tb"]
    before = tb.fc1.weight.detach().clone()
    run = ip.run_cell("%modeldiff tb pb x --opt tb pb --steps 2")
    text = "".join(capsys.readouterr())
    assert not run.success
    assert "optimizers[0] (base) is a model" in text and "torch.optim.AdamW(model.parameters())" in text
    assert torch.equal(tb.fc1.weight, before) and not _hooks_left(ip)


def test_memory_flag_reaches_the_check_and_bad_values_are_refused(ip):
    assert parse_flags("tb pb x --memory-mib 0", False).memory_mib == 0
    assert parse_flags("tb pb --memory-mib none", True).memory_mib is None
    assert parse_flags("tb pb x", False).memory_mib == 256
    _models(ip, "eps")
    ip.run_line_magic("modeldiff", "tb pb x --memory-mib 0")
    assert ip.user_ns["_modeldiff"].first_divergence.base_path == "norm"
    with pytest.raises(OptionError, match="memory_mib=-1.0 must be"):
        ip.run_line_magic("modeldiff", "tb pb x --memory-mib -1")  # checked by auto_diff itself
    with pytest.raises(OptionError, match="--memory-mib"):
        ip.run_line_magic("modeldiff", "tb pb x --memory-mib lots")
    with pytest.raises(OptionError, match="memory_mib=-1.0 must be"):
        ip.run_cell_magic("modeldiff", "tb pb --memory-mib -1", TRAIN)  # and by watch


@pytest.mark.parametrize(
    "ctrl_c",
    [
        "KeyboardInterrupt",
        # A Ctrl-C that lands in a Python hook paddle's backward calls comes out as an OSError naming
        # it: the browser test of an interrupted loop hit it, and the cell said "the cell raised OSError".
        "OSError('(Fatal) Operator backward raised KeyboardInterrupt: ')",
    ],
)
def test_an_interrupted_cell_keeps_and_shows_the_steps_both_models_completed(ip, capsys, ctrl_c):
    # %%modeldiff interrupted after thousands of steps said "nothing was compared".
    _models(ip, bug="eps")
    cell = f"""%%modeldiff tb pb --out found
topt = torch.optim.SGD(tb.parameters(), lr=0.1)
popt = paddle.optimizer.SGD(learning_rate=0.1, parameters=pb.parameters())
for i in range(10):
    tb(torch.tensor(x)).mean().backward(); topt.step(); topt.zero_grad()
    if i == 3:
        raise {ctrl_c}  # Ctrl-C in step 3, after base's part of it
    pb(paddle.to_tensor(x)).mean().backward(); popt.step(); popt.clear_grad()
"""
    run = ip.run_cell(cell)
    assert not run.success and isinstance(run.error_in_exec, KeyboardInterrupt)
    out = capsys.readouterr().out
    said = out.find("the 3 step(s) both models completed were compared")
    # Said first, then the view (a long view hid the line under it).
    assert 0 <= said < out.find("FAILED at step 0"), out
    found = ip.user_ns["found"]
    assert found.steps == 3 and not found and found.first_divergence.step == 0
    assert any(w.startswith("interrupted in step 3") for w in found.warnings)
    assert not _hooks_left(ip)


def test_keep_steps_flag_reaches_the_cells_watch_and_the_line_magic_refuses_it(ip):
    _models(ip)
    ip.run_cell_magic("modeldiff", "tb pb --keep-steps 1", TRAIN)
    result = ip.user_ns["_modeldiff"]
    assert result and result.steps == 3, result.report()
    assert {e.base.step for e in result.events} == {0}  # the rest are summarised by their worst errors
    assert len(result.step_errors()) == 3 and any("keep_steps=3" in n for n in result.notes)
    with pytest.raises(OptionError, match="keep_steps=-1"):
        ip.run_cell_magic("modeldiff", "tb pb --keep-steps -1", TRAIN)
    with pytest.raises(OptionError, match="--keep-steps"):
        ip.run_line_magic("modeldiff", "tb pb x --keep-steps 1")


_INTERRUPTED_LOOPS = r"""
import ctypes, gc, sys
import torch
from IPython.core.interactiveshell import InteractiveShell
torch.set_num_threads(1)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "nbdiff")

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(50)])

ip.user_ns.update(torch=torch, b=model(), r=model(), x=torch.randn(8, 64))
loop = '''
ob, orr = torch.optim.SGD(b.parameters(), 1e-3), torch.optim.SGD(r.parameters(), 1e-3)
for k in range(200):
    for m, o in ((b, ob), (r, orr)):
        o.zero_grad(); m(x).square().mean().backward(); o.step()
    if k == 199:
        raise KeyboardInterrupt  # Ctrl-C
'''
# Both runs first check one step, so that what nbdiff imports and one result are in both: the
# difference is then what the interrupted cells kept, and the heap's free pages are handed back.
ip.run_cell("%%modeldiff b r\nfor m in (b, r): m(x).square().mean().backward()")
watched = sys.argv[1] == "watched"
# %%modeldiff moves each result's tensors to a file in a thread, and that move fails on a full disk
# (as it did on CI): here every move fails, so the numbers are the same on any disk, and the results
# kept are counted whole.
import nbdiff.engine.spill as spill

spill._move = lambda *args, **kwargs: "the disk is full"


def kept():
    spill.wait_for_spills()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is kept, not what the allocator has yet to hand back
    return rss()


after = []
for _ in range(3):
    ip.run_cell(("%%modeldiff b r\n" if watched else "") + loop)
    after.append(kept())
if watched:
    assert ip.user_ns["_modeldiff"].steps == 199, ip.user_ns["_modeldiff"]
print(after[0], after[-1])
"""


def test_interrupted_cells_keep_no_more_than_the_same_loops_alone(tmp_path):
    # A %%modeldiff interrupted after thousands of steps kept every step's recording (949 MiB against
    # 567 MiB without nbdiff; 1,340 MiB after three interrupts).
    import subprocess
    import sys

    script = tmp_path / "loops.py"
    script.write_text(_INTERRUPTED_LOOPS)

    def rss(mode):
        done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return [float(v) for v in done.stdout.strip().splitlines()[-1].split()]

    (alone_1, alone_3), (watched_1, watched_3) = rss("alone"), rss("watched")
    assert watched_3 - alone_3 < 50, f"{watched_3:.0f} MiB watched, {alone_3:.0f} MiB alone"
    # Each cell's view held its result for the kernel's life (+68 MiB after three cells, +38 of them
    # by the second and third; now +38 and +8): the later cells keep about what the loops alone keep.
    more = (watched_3 - watched_1) - (alone_3 - alone_1)
    assert more < 20, f"{more:.0f} MiB more kept by the second and third interrupted cells"


def test_a_cell_with_train_mode_batchnorms_compares_running_statistics_and_can_fail_on_framework_differences(ip):
    # %%modeldiff compared no running statistics, and --framework-differences did not exist.
    from tests.dumps import CNN_X, momentum_pair

    tb, pb = momentum_pair(None)
    ip.user_ns.update(tb=tb, pb=pb, x=CNN_X)
    cell = "tb.train(); pb.train()\ntb(torch.tensor(x)).mean().backward()\npb(paddle.to_tensor(x)).mean().backward()\n"
    assert ip.run_cell("%%modeldiff tb pb --out noted\n" + cell).success
    noted = ip.user_ns["noted"]
    assert noted and any(f.where == "framework" and f.base_path == "bn1" for f in noted.findings), noted.report()
    assert ip.run_cell("%%modeldiff tb pb --framework-differences fail --out failed\n" + cell).success
    failed = ip.user_ns["failed"]
    assert not failed and failed.first_divergence.where == "framework", failed.report()
    assert not _hooks_left(ip)


def test_the_headline_is_said_once_not_again_as_a_repr_line(ip, capsys):
    # "<DiffResult ...: FAILED at ...>" was printed above the view, whose headline says the same.
    _models(ip, bug="eps")
    ip.run_line_magic("modeldiff", "tb pb x")
    out = capsys.readouterr().out
    assert "<DiffResult" not in out, out
    assert out.count("FAILED at step 0") == 1, out
