"""ppautodiff's ``autodiff`` on nbdiff: ``from nbdiff.compat.ppautodiff import autodiff``."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.compat.padiff import PadiffResult
from nbdiff.diff import auto_diff
from nbdiff.errors import OptionError

__all__ = ["autodiff"]

_OPTIONS = {"atol", "rtol", "compare_mode"}


def autodiff(
    layer: Any, module: Any, example_inp: Any, auto_weights: bool = True, options: dict | None = None
) -> PadiffResult:
    """``autodiff(paddle_layer, torch_module, example_inp, auto_weights=True, options={'atol': ...})``.

    ``example_inp`` is a numpy array (given to both) or a pair (paddle, torch). The torch
    module is the base: with ``auto_weights`` its weights are copied into the paddle
    layer (ppautodiff initialised both with the same random values; copying gives the
    same starting point). Prints SUCCESS or the blamed layer, and returns a result
    that is truthy when aligned.
    """
    options = dict(options or {})
    bad = sorted(set(options) - _OPTIONS)
    if bad:
        raise OptionError(f"autodiff: unknown key(s) {bad} in options; known: {sorted(_OPTIONS)}.")
    if isinstance(example_inp, np.ndarray):
        inputs: Any = example_inp
    elif isinstance(example_inp, (tuple, list)) and len(example_inp) == 2:
        inputs = (example_inp[1], example_inp[0])
    else:
        raise OptionError("autodiff: example_inp must be a numpy array or (paddle_input, torch_input).")
    result = auto_diff(module, layer, inputs, auto_init=auto_weights, **options)
    print(result.report())
    print("SUCCESS !!!" if result else "FAILED !!!")
    return PadiffResult(result)
