"""The notebook side of nbdiff: the magics and the widget (the view itself is :mod:`nbdiff.view`).

Needs the ``notebook`` extra (IPython, anywidget, ipywidgets, matplotlib). Nothing
here is imported by ``import nbdiff``; ``%load_ext nbdiff`` loads the magics.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from nbdiff.notebook.magics import ModelDiffMagics
    from nbdiff.trace.origin.built_with import remember_arguments

    ipython.register_magics(ModelDiffMagics)
    # Layers built from now on have their arguments remembered (repro, compare's rebuild); a framework
    # imported in a later cell is wrapped before the next cell runs.
    remember_arguments()
    ipython.events.register("pre_run_cell", _remember_arguments)


def _remember_arguments(*_: Any) -> None:
    from nbdiff.trace.origin.built_with import remember_arguments

    remember_arguments()


def unload_ipython_extension(ipython: Any) -> None:
    from nbdiff.trace.origin.built_with import forget_arguments

    # IPython has no unregister_magics: drop the entries the class registered.
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("modeldiff", None)
    try:
        ipython.events.unregister("pre_run_cell", _remember_arguments)
    except ValueError:
        pass
    forget_arguments()
