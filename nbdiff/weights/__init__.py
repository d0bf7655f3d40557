"""Weight transfer between models: layout rules and ``assign_weight``."""

from __future__ import annotations

from nbdiff.weights.assign import WeightMap, assign_weight, plan_weights
from nbdiff.weights.plan import LayerWeights
from nbdiff.weights.rules import WeightRule, register_weight_rule

__all__ = ["LayerWeights", "WeightMap", "WeightRule", "assign_weight", "plan_weights", "register_weight_rule"]
