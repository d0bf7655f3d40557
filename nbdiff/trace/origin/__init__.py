"""Where what was recorded comes from in the user's code: the frames of a call
(:mod:`~nbdiff.trace.origin.stack`) and the notebook cells they point into
(:mod:`~nbdiff.trace.origin.cells`), the line that built a layer (:mod:`~nbdiff.trace.origin.built`),
and what it was built with (:mod:`~nbdiff.trace.origin.constructors`, remembered in a notebook by
:mod:`~nbdiff.trace.origin.built_with`). The rest of trace reads it; it reads nothing of the rest."""
