"""Pairing base and raw events: execution order, type equivalence, LayerMap."""

from __future__ import annotations

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pair, Pairing, pair_forward
from nbdiff.align.typemap import equivalent_types

__all__ = ["LayerMap", "Pair", "Pairing", "pair_forward", "equivalent_types"]
