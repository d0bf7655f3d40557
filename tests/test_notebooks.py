"""The example notebook runs top to bottom in a real kernel, and the view's state is kept."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("torch")
pytest.importorskip("paddle")

QUICKSTART = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path):
    from nbclient import NotebookClient

    path = QUICKSTART
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   store_widget_state=True).execute()  # fmt: skip
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "SUCCESS" in text and "layer `norm`" in text and "steps: 3" in text
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = [s["state"] for s in states.values() if s["state"].get("_model_name") == "AnyModel"]
    assert len(views) == 3 and any(v["first"] >= 0 for v in views)
