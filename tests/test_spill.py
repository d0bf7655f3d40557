"""A large result keeps its tensors in a file, mapped back when read: same verdict, same view."""

import glob
import os
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402
from nbdiff.engine.spill import event_tensors, spill_tensors, spilled, wait_for_spills  # noqa: E402
from nbdiff.errors import OptionError  # noqa: E402
from nbdiff.trace import spool as spool_module  # noqa: E402
from nbdiff.trace.spool import in_file  # noqa: E402


def _pair(scale=1.0):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256))
    raw = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256))

    class Scaled(torch.nn.Module):  # raw's last layer is off by `scale`
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) * scale

    raw[2] = Scaled(raw[2]) if scale != 1.0 else raw[2]
    return base, raw


def _in_memory(result):
    return sum(t.value.nbytes for t in event_tensors(result.events) if not in_file(t.value))


X = np.random.default_rng(0).standard_normal((128, 256)).astype("float32")


def test_a_result_above_the_limit_keeps_its_tensors_on_disk_with_the_same_verdict(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kept = nbdiff.auto_diff(*_pair(1.01), X, spill_above_mib=None)
    moved = nbdiff.auto_diff(*_pair(1.01), X, spill_above_mib=0.5)
    wait_for_spills()  # the move runs in a thread: the result came back before it
    assert _in_memory(kept) > 1_000_000 and _in_memory(moved) < _in_memory(kept) / 10
    assert not kept and not moved
    assert (moved.first_divergence.base_path, moved.first_divergence.phase) == (
        kept.first_divergence.base_path,
        kept.first_divergence.phase,
    )
    a = [t.value for t in event_tensors(kept.events)]
    b = [t.value for t in event_tensors(moved.events)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # The file's name is gone already: nothing to clean up, whatever happens to the process.
    assert not glob.glob(os.path.join(tmp_path, "*"))


def test_the_view_and_a_saved_copy_read_the_mapped_tensors(tmp_path):
    from nbdiff.view.model import build_tree, node_detail

    result = nbdiff.auto_diff(*_pair(1.01), X, spill_above_mib=0)
    wait_for_spills()
    assert any(in_file(t.value) for t in event_tensors(result.events))
    tree = build_tree(result)
    details = [node_detail(tree, i) for i in range(len(tree.nodes))]
    assert any(d.get("picture") for d in details)  # histograms drawn from the mapped values
    result.save(tmp_path / "r")
    again = nbdiff.load(tmp_path / "r")
    assert again.first_divergence.base_path == result.first_divergence.base_path


def test_below_the_limit_nothing_moves():
    result = nbdiff.auto_diff(*_pair(), X)  # about 2 MiB of tensors, under the 64 MiB default
    wait_for_spills()
    assert result and not any(in_file(t.value) for t in event_tensors(result.events))


def test_a_failed_write_keeps_the_tensors_in_memory_and_says_so(tmp_path):
    result = nbdiff.auto_diff(*_pair(), X, spill_above_mib=None)
    before = _in_memory(result)
    why = spill_tensors(event_tensors(result.events), 0, folder=str(tmp_path / "missing"))
    assert "stay in memory" in why and _in_memory(result) == before


@pytest.mark.parametrize("bad", [-1, "64", True])
def test_a_bad_limit_is_refused(bad):
    with pytest.raises(OptionError, match="spill_above_mib"):
        nbdiff.auto_diff(*_pair(), X, spill_above_mib=bad)


def test_small_arrays_stay_in_memory(monkeypatch):
    monkeypatch.setattr(spool_module, "SMALL_BYTES", 1 << 30)
    result = nbdiff.auto_diff(*_pair(), X, spill_above_mib=0)
    wait_for_spills()
    assert not any(in_file(t.value) for t in event_tensors(result.events))


def test_a_failed_move_in_the_thread_warns_and_keeps_the_tensors(monkeypatch, tmp_path):
    result = nbdiff.auto_diff(*_pair(), X, spill_above_mib=None)
    before = _in_memory(result)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with pytest.warns(RuntimeWarning, match="stay in memory"):
        spilled(result, 0)
        wait_for_spills()
    assert _in_memory(result) == before


def test_a_script_that_ends_right_after_the_check_exits_cleanly():
    # The move was a daemon thread: stopped inside the write at exit, it aborted the process.
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, str(repo / "tests" / "spill_exit_child.py")], capture_output=True, text=True
        )
        assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def _held_in_memory(result):
    """Bytes of memory the result's arrays really pin: the records' values and the arrays its
    passing comparisons keep for their metrics, counted once per buffer they live in."""
    roots = {}
    arrays = [t.value for t in event_tensors(result.events)]
    for d in result.events:
        for td in d.tensors:
            detail = object.__getattribute__(td, "detail")
            if detail is not None and detail._arrays is not None:
                arrays += list(detail._arrays)
    for a in arrays:
        if in_file(a):
            continue
        while isinstance(a.base, np.ndarray):
            a = a.base
        roots[id(a)] = a.nbytes
    return sum(roots.values())


def test_a_spilled_result_pins_no_memory_through_its_passing_comparisons(monkeypatch, tmp_path):
    # The comparisons that passed keep their arrays to compute their metrics when read. They kept
    # the in-memory copies after the records moved to the file: the benchmark transformer's
    # spilled result still held 134 MiB. They now read the file too; the metrics are the same.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    near = 1.0 + 2e-7  # within tolerance, not bit-identical: comparisons that pass keep arrays
    kept = nbdiff.auto_diff(*_pair(near), X, spill_above_mib=None)
    moved = nbdiff.auto_diff(*_pair(near), X, spill_above_mib=0.5)
    wait_for_spills()
    assert kept and moved
    assert _held_in_memory(kept) > 1_000_000 and _held_in_memory(moved) < 100_000
    for a, b in zip(kept.events, moved.events):
        for x, y in zip(a.tensors, b.tensors):
            assert (x.name, x.ratio, x.max_rel, x.mean_abs, x.cosine) == (
                y.name,
                y.ratio,
                y.max_rel,
                y.mean_abs,
                y.cosine,
            )


def test_a_comparisons_own_arrays_and_views_of_moved_ones_are_read_from_the_file(tmp_path):
    from nbdiff.engine.spill import _from_file
    from nbdiff.trace.spool import Spool

    rng = np.random.default_rng(1)
    moved = rng.standard_normal((64, 512)).astype("float32")
    own = np.ascontiguousarray(rng.standard_normal((512, 64)).astype("float32").T)  # a converted layout
    spool = Spool(0, str(tmp_path))
    maps = {id(moved): spool.keep(moved)}
    try:
        for x in (moved, moved.reshape(512, 64), moved[None], np.broadcast_to(moved[:1], (64, 512)), moved.T, own):
            y = _from_file(x, maps, spool)
            assert in_file(y) and y.shape == x.shape and np.array_equal(y, x)
        assert _from_file(own, maps, spool) is maps[id(own)]  # written once
        small = np.ones(4, "float32")
        assert _from_file(small, maps, spool) is small  # small arrays stay
    finally:
        spool.close()
