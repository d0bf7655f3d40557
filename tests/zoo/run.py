"""Print the zoo table: ``python -m tests.zoo.run [substring] [--offline[=statistics]]``.

``--offline`` checks ``record`` + ``compare`` instead of ``auto_diff``: each side's step is
recorded under the default loss (cases that train are skipped), and the dumps must give the
same verdict and blame as ``auto_diff`` is held to.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback

import nbdiff
from nbdiff.engine.stepping import loss_of
from nbdiff.frameworks import framework_of
from nbdiff.trace.inputs import split_inputs
from tests.zoo.pairs import CASES


def outcome(case) -> tuple[bool, str]:
    base, raw, inputs, opts = case.build()
    return verdict(case, nbdiff.auto_diff(base, raw, inputs, **opts))


def offline_outcome(case, dump_type: str) -> tuple[bool, str]:
    base, raw, inputs, opts = case.build()
    nbdiff.assign_weight(base, raw, inputs=inputs, **{k: v for k, v in opts.items() if k == "layer_map"})
    sides = (framework_of(base, "base"), framework_of(raw, "raw"))
    calls = split_inputs(inputs, *sides)
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for side, fw, model, (args, kwargs) in zip(("base", "raw"), sides, (base, raw), calls):
            fw.seed(0)
            with nbdiff.record(model, f"{folder}/{side}", dump_type=dump_type) as rec:
                out = model(*args, **kwargs)
                if opts.get("diff_phase") != "forward":  # a forward-only case records no backward
                    loss_of(fw, None, out, side).backward()
            paths.append(rec.path)
        return verdict(case, nbdiff.compare(*paths))


def verdict(case, result) -> tuple[bool, str]:
    d = result.first_divergence
    if case.expect is None:
        return bool(result), "pass" if result else f"FALSE ALARM: {d.describe()}"
    if d is None:
        return False, "MISSED"
    phase, path, param = case.expect
    ok = d.phase.value == phase and d.base_path == path and (param is None or d.parameter == param)
    return ok, d.describe() + (f" · why: {d.why()}" if d.arguments else "")


def main() -> None:
    words = [a for a in sys.argv[1:] if not a.startswith("-")]
    pick = words[0] if words else ""
    offline = next((a.partition("=")[2] or "tensor" for a in sys.argv[1:] if a.startswith("--offline")), None)
    for case in CASES:
        if pick not in case.name or (offline and "train" in case.tags):
            continue
        t = time.time()
        try:
            ok, text = outcome(case) if offline is None else offline_outcome(case, offline)
        except Exception as exc:  # the table reports errors as outcomes
            ok, text = False, f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if "-v" in sys.argv:
                traceback.print_exc()
        print(f"{'ok ' if ok else 'BAD'} {case.name:22s} {time.time() - t:5.1f}s  {text}", flush=True)


if __name__ == "__main__":
    main()
