"""Steps that come from dumps (``record``, then ``compare`` or the CLI): judged from what the dumps hold.

:class:`~nbdiff.engine.recorded.comparer.RecordedComparer` measures a layer's local error by
rebuilding raw's layer from its dump (:mod:`~nbdiff.engine.recorded.rebuilt`) or recomputing a
BatchNorm (:mod:`~nbdiff.engine.recorded.recomputed`); a dump's steps and layer arguments are read
by :mod:`~nbdiff.engine.recorded.dump_steps`, and a tensor-parallel run's shards are gathered by
:mod:`~nbdiff.engine.recorded.gathered`. The comparison itself is the engine's spine, which this room
imports and which never imports it.
"""
