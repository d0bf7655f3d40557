"""The mesh a rank records and the per-dimension layouts of its tensors (trace/mesh)."""

from __future__ import annotations

import pytest

from nbdiff.errors import DumpError, OptionError
from nbdiff.trace.mesh import LAYOUT, Mesh, Placement, placements


def test_layouts_name_one_placement_per_mesh_dimension():
    assert placements("strided(0,2)@dp,shard(1)@tp") == [
        Placement("strided", 0, 2, "dp"),
        Placement("shard", 1, 1, "tp"),
    ]
    assert placements("shard(2)") == [Placement("shard", 2)]
    assert placements("replicate,partial") == [Placement("replicate"), Placement("partial")]
    assert placements("") == []
    assert [p.written() for p in placements("strided(0,2)@dp,shard(1)@tp")] == ["strided(0,2)@dp", "shard(1)@tp"]
    for bad in ("shard(x)", "shard(0)@", "strided(0)", "shard(0),,replicate", "shard(0)@1tp"):
        assert not LAYOUT.fullmatch(bad), bad
        with pytest.raises(ValueError):
            placements(bad)


def test_a_mesh_given_as_sizes_lays_ranks_out_row_major():
    places = [Mesh.of_sizes({"dp": 2, "tp": 3}, r, 6, None, "mean").coordinate for r in range(6)]
    assert places == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    m = Mesh.of_sizes({"dp": 2, "tp": 3}, 4, 6, None, "mean")
    assert (m.data_parallel, m.group(), m.position(), m.data_parallel_size) == (("dp",), 1, 1, 2)


def test_data_parallel_dimensions_are_found_by_name_or_said():
    names = ("dp_replicate", "dp_shard", "tp")
    assert Mesh.made((1, 2, 2), names, (0, 1, 0), None, "mean").data_parallel == ("dp_replicate", "dp_shard")
    assert Mesh.made((2, 2), ("batch", "model"), (0, 0), "batch", "sum").data_parallel == ("batch",)
    assert Mesh.made((2, 2), ("a", "b"), (0, 0), None, "mean").data_parallel == ()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Mesh.of_sizes({"dp": 2, "tp": 2}, 0, 6, None, "mean"), "4 places do not match the job's 6 ranks"),
        (lambda: Mesh.made((2, 2), ("dp", "tp"), (0, 0), "data", "mean"), "the mesh has no dimension 'data'"),
        (lambda: Mesh.made((2, 2), ("dp", "tp"), (0, 0), None, "max"), r"dp_reduce='max'"),
        (lambda: Mesh.made((2, 2), ("dp", "dp"), (0, 0), None, "mean"), "must be distinct identifiers"),
    ],
)
def test_a_mesh_that_cannot_be_is_an_option_error_naming_the_argument(call, match):
    with pytest.raises(OptionError, match=match):
        call()


def test_a_recorded_mesh_is_checked_as_it_is_read():
    good = {"shape": [2, 2], "names": ["dp", "tp"], "coordinate": [1, 0], "data_parallel": ["dp"], "reduce": "mean"}
    assert Mesh.from_json(good, "rank2").to_json() == good
    for bad, match in [
        ({**good, "coordinate": [2, 0]}, "puts the rank outside it"),
        ({**good, "names": ["dp"]}, "puts the rank outside it"),
        ({**good, "data_parallel": ["fsdp"]}, "names data-parallel dimensions it lacks"),
        ({**good, "shape": "2x2"}, "is not shape, names"),
    ]:
        with pytest.raises(DumpError, match=match):
            Mesh.from_json(bad, "rank2/manifest.json")


def test_a_layout_is_split_into_its_tensor_and_data_parallel_placements():
    mesh = Mesh.made((2, 2), ("dp", "tp"), (0, 1), None, "mean")
    assert mesh.split("strided(0,2)@dp,shard(0)@tp", "w") == ("shard(0)", [Placement("strided", 0, 2, "dp")])
    assert mesh.split("shard(1)@tp", "w") == ("shard(1)", [])  # on the tensor-parallel submesh alone
    assert mesh.split("shard(0)@dp", "w") == ("", [Placement("shard", 0, 1, "dp")])
    assert mesh.split("shard(0),replicate", "w") == ("replicate", [Placement("shard", 0, 1, "dp")])  # unnamed: all
    assert mesh.split("shard(1)", "w") == ("shard(1)", [])  # unnamed, fewer: the tensor-parallel ones
    with pytest.raises(DumpError, match="w: laid out over mesh dimension 'pp'"):
        mesh.split("shard(0)@pp", "w")
    with pytest.raises(DumpError, match="names 3 placements, but the run's mesh"):
        mesh.split("shard(0),shard(1),replicate", "w")
