"""auto_diff's cost on the zoo's real model pairs, against their bare forward+backward.

Run: .venv/bin/python benchmarks/bench_zoo.py [--rounds N] [--threads N] [names...]
Default names: ``llama`` and ``qwen2`` (transformers against paddleformers, tiny configs, the
zoo's own builds: ``tests/zoo/pairs.py``). Bare is both models' forward and backward under the
loss ``auto_diff`` uses by default, run back to back; rounds interleave bare and auto_diff, and
the headline is min over min with the median ratio beside it. The faithful floor (``floor.faithful``)
is what recording each layer call's inputs, outputs and gradients and comparing them takes at the
least, in the same rounds. Needs transformers and paddleformers (``make test`` installs them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

if "--threads" in sys.argv:  # before the frameworks load: their thread pools read it once
    os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")


def measure(name: str, rounds: int) -> str:
    """One zoo pair's line: bare against auto_diff, interleaved round by round."""
    from floor import faithful

    import nbdiff
    from nbdiff.engine.stepping import loss_of
    from nbdiff.frameworks import framework_of
    from nbdiff.trace.inputs import split_inputs
    from tests.zoo.pairs import CASES

    case = next(c for c in CASES if c.name == name)
    base, raw, inputs, options = case.build()
    nbdiff.assign_weight(base, raw, inputs=inputs)
    sides = (framework_of(base, "base"), framework_of(raw, "raw"))
    calls = split_inputs(inputs, *sides)

    def bare() -> None:
        for side, fw, model, (a, kw) in zip(("base", "raw"), sides, (base, raw), calls):
            loss_of(fw, None, model(*a, **kw), side).backward()
            fw.zero_grad(model, None)

    def checked() -> None:
        nbdiff.auto_diff(base, raw, inputs, **options)

    bare()
    checked()
    faithful(base, raw, bare)
    times: dict[str, list[float]] = {"bare": [], "faithful floor": [], "auto_diff": []}
    for _ in range(rounds):
        for label, fn in (
            ("bare", bare),
            ("faithful floor", lambda: faithful(base, raw, bare)),
            ("auto_diff", checked),
        ):
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    low = {k: min(v) for k, v in times.items()}
    mid = {k: statistics.median(v) for k, v in times.items()}
    return (
        f"{name:8s} bare {low['bare'] * 1e3:6.1f} ms | faithful floor {low['faithful floor'] / low['bare']:.2f}x "
        f"({mid['faithful floor'] / mid['bare']:.2f}x) | auto_diff {low['auto_diff'] / low['bare']:.2f}x "
        f"({mid['auto_diff'] / mid['bare']:.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["llama", "qwen2"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, help="CPU threads for both frameworks (1: steadier on a shared machine)")
    args = ap.parse_args()
    for name in args.names:
        print(measure(name, args.rounds), flush=True)


if __name__ == "__main__":
    main()
