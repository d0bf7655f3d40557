"""Steps that come from the models themselves: ``auto_diff`` runs them, ``watch`` and ``%%modeldiff``
record the user's own loop.

A live step measures a layer's local error by replaying it on base's inputs
(:class:`~nbdiff.engine.live.comparer.LiveComparer`); ``single_step`` feeds raw base's inputs
(:mod:`~nbdiff.engine.live.feed`); a watched run's steps are compared as the loop runs
(:mod:`~nbdiff.engine.live.watched`). The comparison itself is the engine's spine, which this room
imports and which never imports it.
"""
