"""The view: what a result looks like, in a notebook or in a page of its own.

One view model (:mod:`model`: the paired rows, the details of a row, the step chart's
rows) and one renderer (``js/view.js``, linked here as ``static/``) serve both faces:

- the widget (:mod:`nbdiff.notebook.widget`) answers the renderer's clicks from a kernel;
- the standalone page (:mod:`page`) embeds every row's details, so the same renderer
  answers them without one, and writes the static copy a notebook shows where no
  widget can run.

:mod:`pictures` (error maps and histograms drawn in the browser), :mod:`sources`
(excerpts of user code) and :mod:`plots` (matplotlib figures for ``result.plot()``)
feed them. Imports point one way: ``notebook/`` uses the view, the view uses
``report/text``, and neither ``report/`` nor the view imports ``notebook/``.
"""
