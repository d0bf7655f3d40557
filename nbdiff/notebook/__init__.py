"""The notebook side of nbdiff: the magics and the widget (the view itself is :mod:`nbdiff.view`).

Needs the ``notebook`` extra (IPython, anywidget, ipywidgets, matplotlib). Nothing
here is imported by ``import nbdiff``; ``%load_ext nbdiff`` loads the magics.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from nbdiff.notebook.magics import ModelDiffMagics

    ipython.register_magics(ModelDiffMagics)


def unload_ipython_extension(ipython: Any) -> None:
    # IPython has no unregister_magics: drop the entries the class registered.
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("modeldiff", None)
