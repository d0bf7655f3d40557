"""Runs of several ranks made whole, step by step, so that they compare with a run of any other
layout: tensor-parallel shards (:mod:`.shards`, by :mod:`.shard_rules`), data-parallel groups
(:mod:`.data_parallel`), micro-batches (:mod:`.micro_batches`) and pipeline stages (:mod:`.stages`);
:mod:`.gathering` is what they share. Reads dumps' events (:mod:`nbdiff.trace`), imports no framework."""
