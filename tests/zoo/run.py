"""Print the zoo table: ``python -m tests.zoo.run [substring]``."""

from __future__ import annotations

import sys
import time
import traceback

import nbdiff
from tests.zoo.pairs import CASES


def outcome(case) -> tuple[bool, str]:
    base, raw, inputs, opts = case.build()
    result = nbdiff.auto_diff(base, raw, inputs, **opts)
    d = result.first_divergence
    if case.expect is None:
        return bool(result), "pass" if result else f"FALSE ALARM: {d.describe()}"
    if d is None:
        return False, "MISSED"
    phase, path, param = case.expect
    ok = d.phase.value == phase and d.base_path == path and (param is None or d.parameter == param)
    return ok, d.describe() + (f" · why: {d.why()}" if d.arguments else "")


def main() -> None:
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    for case in CASES:
        if pick not in case.name:
            continue
        t = time.time()
        try:
            ok, text = outcome(case)
        except Exception as exc:  # the table reports errors as outcomes
            ok, text = False, f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if "-v" in sys.argv:
                traceback.print_exc()
        print(f"{'ok ' if ok else 'BAD'} {case.name:22s} {time.time() - t:5.1f}s  {text}", flush=True)


if __name__ == "__main__":
    main()
