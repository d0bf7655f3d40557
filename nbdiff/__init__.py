"""nbdiff: find exactly where two deep-learning models that should agree stop agreeing.

Importing nbdiff imports neither torch nor paddle; adapters load when a model of
that framework is passed in.
"""

from __future__ import annotations

from nbdiff.align.fused import register_fused_pattern
from nbdiff.align.layer_map import LayerMap
from nbdiff.check import ConfigCheck, check_config
from nbdiff.diff import auto_diff
from nbdiff.errors import (
    DumpError,
    InputError,
    ModelCallError,
    NbdiffError,
    OptionError,
    PairingError,
    WeightTransferError,
)
from nbdiff.gather.shards import register_shard_rule
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.judge.metrics import TensorDiff
from nbdiff.judge.tolerance import Tolerance
from nbdiff.offline import compare
from nbdiff.recording import record
from nbdiff.report.saved import load_result as load
from nbdiff.result import DiffResult
from nbdiff.trace.apis import register_api
from nbdiff.watching import watch
from nbdiff.weights import WeightMap, assign_weight, register_weight_rule

__version__ = "0.1.0"

__all__ = [
    "ConfigCheck",
    "check_config",
    "DiffResult",
    "Divergence",
    "DumpError",
    "EventDiff",
    "InputError",
    "LayerMap",
    "ModelCallError",
    "NbdiffError",
    "OptionError",
    "PairingError",
    "TensorDiff",
    "Tolerance",
    "WeightMap",
    "WeightTransferError",
    "assign_weight",
    "auto_diff",
    "load",
    "compare",
    "record",
    "register_weight_rule",
    "register_fused_pattern",
    "register_shard_rule",
    "register_api",
    "watch",
    "load_ipython_extension",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext nbdiff``: registers ``%modeldiff`` / ``%%modeldiff`` (imported only now)."""
    from nbdiff.notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext nbdiff``: removes the magics."""
    from nbdiff.notebook import unload_ipython_extension as unload

    unload(ipython)
