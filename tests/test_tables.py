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


def test_names_that_look_like_formulas_stay_text(tmp_path):
    import copy

    import numpy as np
    import torch

    base = torch.nn.Sequential()
    base.add_module("=HYPERLINK(1)", torch.nn.Linear(4, 4))
    base.add_module("@cmd", torch.nn.Linear(4, 4))
    result = nbdiff.auto_diff(base, copy.deepcopy(base), np.ones((2, 4), "float32"))
    result.to_csv(str(tmp_path))
    cells = [c for row in csv.reader(open(tmp_path / "mapping_0.csv")) for c in row]
    assert "'=HYPERLINK(1)" in cells and "'@cmd" in cells
    assert not any(c[:1] in "=+@" for c in cells if c)
