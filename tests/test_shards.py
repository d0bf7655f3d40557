"""Gathering a tensor-parallel run's shards (gather/shards): layouts, rules, statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nbdiff.errors import DumpError, OptionError
from nbdiff.gather import shards as sh
from nbdiff.trace.events import Event, Kind, Phase, TensorRecord
from nbdiff.trace.stats import tensor_stats


@dataclass
class _Dump:
    """What Gathered reads of a rank dump."""

    steps: list[list[Event]]
    framework: str = "torch"
    layers: dict[str, list[str]] = field(default_factory=dict)
    layouts: dict[str, dict[str, str]] = field(default_factory=dict)
    path: Path = Path("run/rank0")

    @property
    def meta(self) -> dict[str, Any]:
        return {"framework": self.framework, "param_layouts": self.layouts, "rank": int(self.path.name[4:])}


def _event(path: str, outs: list[TensorRecord], ins: list[TensorRecord] = (), phase: Phase = Phase.FORWARD) -> Event:
    return Event(0, phase, Kind.LAYER, 0, path, "Linear", 0, 1, None, True, tuple(ins), tuple(outs))


def _rec(name: str, value: np.ndarray | None, layout: str = "", stats: Any = None, shape: tuple = ()) -> TensorRecord:
    return TensorRecord(name, tuple(value.shape) if value is not None else shape, "float32", value, stats, layout)


def _values(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_recorded_layouts_gather_shards_copies_and_partial_sums():
    whole = _values(0, (2, 3, 8))
    halves = np.split(whole, 2, axis=2)
    parts = [whole * 0.25, whole * 0.75]
    ranks = [
        [_event("up", [_rec("out", halves[r], "shard(2)")], [_rec("in[0]", whole, "replicate")]),
         _event("down", [_rec("out", parts[r], "partial")])]
        for r in range(2)
    ]  # fmt: skip
    ref = [_event("up", [_rec("out", whole)], [_rec("in[0]", whole)]), _event("down", [_rec("out", whole)])]
    g = sh.Gathered([_Dump([ref])], [_Dump([ranks[0]]), _Dump([ranks[1]], path=Path("run/rank1"))])
    a, b = g.step(0)
    assert a is not None and a[0].outputs[0].value is whole
    up, down = b
    np.testing.assert_array_equal(up.outputs[0].value, whole)
    np.testing.assert_array_equal(up.inputs[0].value, whole)
    np.testing.assert_allclose(down.outputs[0].value, whole, rtol=1e-6)
    assert (up.outputs[0].shape, up.outputs[0].layout) == ((2, 3, 8), "")
    how = g.gatherings[0][id(up.outputs[0])]
    assert how.layout == "shard(2)" and len(how.shards) == 2


def test_a_plain_tensor_is_laid_out_by_the_whole_runs_shape_then_passed_through_a_parameterless_layer():
    whole = _values(1, (4, 6))
    halves = np.split(whole, 2, axis=1)
    act_out = [np.tanh(h) for h in halves]
    ranks = [
        [_event("up", [_rec("out", halves[r])]), _event("act", [_rec("out", act_out[r])], [_rec("in[0]", halves[r])])]
        for r in range(2)
    ]
    ref = [_event("up", [_rec("out", whole)]), _event("act", [_rec("out", np.tanh(whole))], [_rec("in[0]", whole)])]
    g = sh.Gathered([_Dump([ref])], [_Dump([ranks[0]]), _Dump([ranks[1]])])
    up, act = g.step(0)[1]
    np.testing.assert_array_equal(up.outputs[0].value, whole)
    np.testing.assert_array_equal(act.outputs[0].value, np.tanh(whole))
    # Two split runs (no whole one to fit): the rule of `up` (a recorded shard(0) weight: column) and
    # the pass-through through `act` tell the same.
    g2 = sh.Gathered(
        [_Dump([ranks[0]], layouts={"up": {"weight": "shard(0)"}}, layers={"up": ["Linear"]}), _Dump([ranks[1]])],
        [_Dump([ranks[0]], layouts={"up": {"weight": "shard(0)"}}, layers={"up": ["Linear"]}), _Dump([ranks[1]])],
    )
    for side in g2.step(0):
        np.testing.assert_array_equal(side[1].outputs[0].value, np.tanh(whole))
    assert not g2.notes


def test_shards_kept_as_statistics_gather_to_the_statistics_of_the_whole():
    whole = _values(2, (3, 10)) * 3 + 1
    cut = [whole[:, :4], whole[:, 4:]]
    ranks = [[_event("up", [_rec("out", None, "shard(1)", tensor_stats(c), c.shape)])] for c in cut]
    ref = [_event("up", [_rec("out", None, "", tensor_stats(whole), whole.shape)])]
    g = sh.Gathered([_Dump([ref])], [_Dump([ranks[0]]), _Dump([ranks[1]])])
    out = g.step(0)[1][0].outputs[0]
    want = tensor_stats(whole)
    assert out.shape == (3, 10)
    for name in ("min", "max", "mean", "std", "abs_mean"):
        assert getattr(out.stats, name) == pytest.approx(getattr(want, name), rel=1e-5), name


def test_what_cannot_be_told_is_said_and_rank_0_stands_for_it():
    a, b = _values(3, (2, 4)), _values(4, (2, 4))
    ranks = [[_event("mystery", [_rec("out", v)])] for v in (a, b)]
    g = sh.Gathered([_Dump([ranks[0]]), _Dump([ranks[1]])], [_Dump([ranks[0]]), _Dump([ranks[1]])])
    assert g.step(0)[1][0].outputs[0].value is a
    assert len(g.notes) == 1 and "`mystery` out: not told how it is spread" in g.notes[0]
    assert "shards={'mystery': 'column'}" in g.notes[0]


def test_ranks_that_ran_different_calls_are_a_dump_error():
    v = _values(5, (2, 2))
    g = sh.Gathered(
        [_Dump([[_event("up", [_rec("out", v)])]])],
        [_Dump([[_event("up", [_rec("out", v)])]]), _Dump([[]], path=Path("run/rank1"))],
    )
    with pytest.raises(DumpError, match=r"run/rank1: step 0 has no forward call of `up`"):
        g.step(0)


def test_a_layout_over_several_dimensions_without_the_mesh_is_refused_with_what_to_do():
    v = _values(6, (2, 2))
    ranks = [_Dump([[_event("up", [_rec("out", v, "shard(0),replicate")])]]) for _ in range(2)]
    # Which placement is whose dimension is the recorded mesh's to say (tests/test_data_parallel.py).
    with pytest.raises(DumpError, match=r"does not say the mesh. Record with nbdiff.record\(..., mesh="):
        sh.Gathered([_Dump([[_event("up", [_rec("out", v)])]])], ranks).step(0)


def test_register_shard_rule_checks_its_layouts_and_serves_the_users_map_and_classes():
    with pytest.raises(OptionError, match="'diagonal' is not shard"):
        sh.register_shard_rule("bad", {"out": "diagonal"})
    try:
        sh.register_shard_rule("heads", {"in": "replicate", "out": "shard(1)"}, classes=["MyHeads"])
        assert sh.RULE_BY_CLASS["MyHeads"] == "heads"
        sh.Gathered([], [], {"attn.*": "heads"})  # a registered rule is a known name
        whole = _values(7, (2, 6, 3))
        ranks = [[_event("attn.h", [_rec("out", c)])] for c in np.split(whole, 2, axis=1)]
        dumps = [_Dump([r], layers={"attn.h": ["MyHeads"]}) for r in ranks]
        both = sh.Gathered(dumps, dumps).step(0)
        np.testing.assert_array_equal(both[1][0].outputs[0].value, whole)
    finally:
        sh.SHARD_RULES.pop("heads", None)
        sh.RULE_BY_CLASS.pop("MyHeads", None)
    with pytest.raises(OptionError, match="no shard rule 'heads'"):
        sh.Gathered([], [], {"attn.*": "heads"})


def test_shard_slices_cut_the_whole_as_the_ranks_held_it():
    whole = _values(8, (5, 4))
    shards = [whole[:3], whole[3:]]
    cuts = sh.shard_slices("shard(0)", shards, whole)
    assert [c.shape for c in cuts] == [(3, 4), (2, 4)]
    assert sh.shard_slices("partial", shards, whole) is None
    assert sh.shard_slices("replicate", [whole, whole], whole)[1] is whole


def test_partial_sums_kept_as_statistics_are_left_out_and_said():
    whole = _values(9, (2, 4))
    ranks = [[_event("down", [_rec("out", None, "partial", tensor_stats(whole / 2), whole.shape)])] for _ in range(2)]
    ref = [_event("down", [_rec("out", None, "", tensor_stats(whole), whole.shape)])]
    g = sh.Gathered([_Dump([ref])], [_Dump([ranks[0]]), _Dump([ranks[1]])])
    assert g.step(0)[1][0].outputs == ()
    assert g.notes == ["`down` out (forward): partial sums kept as statistics only cannot be added up; not compared."]


@pytest.mark.parametrize("layout", ["shard(0)", "shard(2)", "shard(-3)"])
def test_a_recorded_layout_along_a_dimension_the_tensor_lacks_is_a_dump_error(layout):
    # A 0-d tensor recorded as shard(0) raised a bare IndexError (exit 1, read as "diverged").
    v = _values(7, (2, 2)) if layout != "shard(0)" else np.float32(1.5) * np.ones((), "float32")
    ranks = [_Dump([[_event("up", [_rec("out", v, layout)])]], path=Path(f"run/rank{r}")) for r in range(2)]
    with pytest.raises(DumpError, match=r"`up` out \(step 0\): recorded as laid out .* has no such dimension"):
        sh.Gathered([_Dump([[_event("up", [_rec("out", v)])]])], ranks).step(0)
