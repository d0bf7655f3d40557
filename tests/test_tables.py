"""CSV tables: one set per step, with every compared tensor."""

import csv

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.report.tables import COMPARE_COLUMNS, MAPPING_COLUMNS  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402


def test_tables_hold_every_pair_and_tensor(tmp_path):
    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))
    files = {p.split("/")[-1] for p in result.to_csv(str(tmp_path))}
    assert files == {"mapping_0.csv", "forward_compare_0.csv", "backward_compare_0.csv"}
    rows = list(csv.DictReader(open(tmp_path / "forward_compare_0.csv")))
    assert list(rows[0]) == COMPARE_COLUMNS
    norm = next(r for r in rows if r["base_path"] == "norm")
    assert norm["passed"] == "False" and float(norm["local_ratio"]) > 1
    mapping = list(csv.DictReader(open(tmp_path / "mapping_0.csv")))
    assert list(mapping[0]) == MAPPING_COLUMNS and len(mapping) == len(result.select(phase="forward"))
