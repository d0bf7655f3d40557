"""The example notebook runs top to bottom in a real kernel, and the view's state is kept."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("torch")
pytest.importorskip("paddle")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _run(name, tmp_path):
    """Execute a notebook top to bottom as "Run All" does: the first failing cell stops it."""
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   store_widget_state=True).execute()  # fmt: skip
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = [s["state"] for s in states.values() if s["state"].get("_model_name") == "AnyModel"]
    return nb, text, views


def test_quickstart_notebook_executes(tmp_path):
    _, text, views = _run("quickstart.ipynb", tmp_path)
    assert "SUCCESS" in text and "layer `norm`" in text and "steps: 3" in text
    assert len(views) == 3 and any(v["first"] >= 0 for v in views)


def test_single_step_notebook_blames_the_attention_code(tmp_path):
    _, text, views = _run("single_step.ipynb", tmp_path)
    assert "code of `<root>` (TorchBlock) itself, between `qkv` and `proj`" in text, text
    assert "between: ('qkv', 'proj')" in text and "FixedPaddleBlock: SUCCESS> | steps: 2" in text
    assert len(views) == 2 and views[0]["first"] >= 0 and views[1]["first"] == -1


def test_training_drift_notebook_starts_in_the_optimizer(tmp_path):
    nb, text, views = _run("training_drift.ipynb", tmp_path)
    assert "step 0, optimizer: update of parameter" in text and "PaddleMLP: SUCCESS> | steps: 6" in text
    assert "why: decay style: base 'decoupled', raw 'L2'" in text
    assert len(views) == 2 and len(views[0]["steps"]) == 6 and views[0]["steps"][5]["outputs"] > 1
    # drift.plot() shows a figure: the per-step chart as an image.
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_a_failing_modeldiff_cell_stops_run_all(tmp_path):
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "%load_ext nbdiff\nfrom tests.fault_suite.models import BUILDERS, inputs\nimport torch\n"
            "tb, pb, x = BUILDERS['mlp']('torch'), BUILDERS['mlp']('paddle'), inputs('mlp')"
        ),
        nbformat.v4.new_code_cell("%%modeldiff tb pb\ntb(torch.tensor(x))\nraise ValueError('bug in my loop')"),
        nbformat.v4.new_code_cell("after = 1"),
    ]
    from nbclient import NotebookClient

    root = str(Path(__file__).resolve().parents[1])
    with pytest.raises(CellExecutionError, match="bug in my loop"):
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": root}}).execute()
    assert nb.cells[2].get("outputs") == [] and nb.cells[2].get("execution_count") is None
