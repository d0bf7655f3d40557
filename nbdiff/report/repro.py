"""``result.repro(path)``: a standalone reproduction of the blamed layer pair.

Writes ``path/repro.py`` and ``path/repro.safetensors`` (the pair's inputs and weights).
The script needs only numpy, safetensors and the two frameworks, not nbdiff: it rebuilds
both layers from their classes and the constructor arguments read off the layer objects,
loads the weights, runs both on the same inputs, prints the local error against the
tolerance nbdiff used, and exits 1 while the divergence persists (0 once fixed), so it
can become the unit test of the fix; a script that cannot run (a missing file or module, a name its
notebook code needs) exits 2 and says what failed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from nbdiff.errors import OptionError
from nbdiff.frameworks import Framework, framework_of
from nbdiff.judge.blame import Divergence, EventDiff
from nbdiff.report.cell_classes import CellDefinitions
from nbdiff.trace.origin.constructors import NotRebuildable, constructor_of

__all__ = ["write_repro"]


def _constructor(fw: Framework, layer: Any, definitions: CellDefinitions) -> str:
    """``module.Class(arg=value, ...)`` rebuilding ``layer`` from the attributes that hold its arguments.
    A class defined in a notebook cell is written into the script (``definitions``) and called by name."""
    try:
        found = constructor_of(fw, layer)
    except NotRebuildable as exc:
        raise OptionError(f"repro: {exc}, or write the reproduction by hand.") from None
    if found.importable:
        return found.call_text()
    cell = found.module == "__main__" and "<locals>" not in found.qualname
    if not (cell and definitions.add(type(layer))):
        raise OptionError(
            f"repro: {found.qualname} is defined in a function (or its cell's text is gone), so a script cannot "
            "define it. Move the class to a module (a .py file next to the notebook) and run again."
        )
    return found.call_text().removeprefix("__main__.")


_SCRIPT = '''"""nbdiff reproduction: {what}

Runs the two layers on the same inputs and weights (repro.safetensors) and compares their
{compared} with the tolerance nbdiff used. Exit status 1 while they differ, 0 once fixed,
2 where it cannot run.
Needs numpy, safetensors, {frameworks}; not nbdiff.
"""

import os
import sys


def _cannot_run(kind, exc, tb):
    """Whatever stops the script before it compares (a missing file or module, a name the notebook's
    code needs) exits 2: exit 1 says the divergence persists."""
    import traceback

    traceback.print_exception(kind, exc, tb)
    print(f"repro could not run: {{kind.__name__}}: {{exc}} (exit 2; 1 means the layers still differ)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)


sys.excepthook = _cannot_run

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

sys.path[:0] = {paths!r}  # where the layers' own modules were imported from
{imports}

HERE = os.path.dirname(os.path.abspath(__file__))
data = load_file(os.path.join(HERE, "repro.safetensors"))
ATOL, RTOL, SCALED = {atol!r}, {rtol!r}, {scaled!r}
N_INPUTS = {n_inputs}
BACKWARD = {backward!r}  # compare the gradient of the first input, given the same output gradient


def run(framework, layer, prefix, training):
    weights = {{k[len(prefix) + 2 :]: v for k, v in data.items() if k.startswith(prefix + "w.")}}
    inputs = [data[f"{{prefix}}in{{i}}"] for i in range(N_INPUTS)]
    if framework == "torch":
        layer.load_state_dict({{k: torch.from_numpy(v) for k, v in weights.items()}}, strict=False)
        layer.train(training)
        xs = [torch.from_numpy(x).requires_grad_(BACKWARD) for x in inputs]
        with torch.set_grad_enabled(BACKWARD):
            out = layer(*xs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if not BACKWARD:
            return out.detach().float().numpy()
        out.backward(torch.from_numpy(data[f"{{prefix}}gout"]))
        return xs[0].grad.float().numpy()
    layer.set_state_dict({{k: paddle.to_tensor(v) for k, v in weights.items()}})
    layer.train() if training else layer.eval()
    xs = [paddle.to_tensor(x, stop_gradient=not BACKWARD) for x in inputs]
    if BACKWARD:
        out = layer(*xs)
    else:
        with paddle.no_grad():
            out = layer(*xs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    if not BACKWARD:
        return out.astype("float32").numpy()
    out.backward(paddle.to_tensor(data[f"{{prefix}}gout"]))
    return xs[0].grad.astype("float32").numpy()


base = {base_ctor}
raw = {raw_ctor}
b = run({base_fw!r}, base, "base.", {base_training!r}).astype(np.float64)
r = run({raw_fw!r}, raw, "raw.", {raw_training!r}).astype(np.float64).reshape(b.shape)
allowed = ATOL * (np.abs(b).max() if SCALED else 1.0) + RTOL * np.abs(b)
ratio = float((np.abs(r - b) / np.maximum(allowed, 1e-30)).max())
print(f"local error: max abs {{np.abs(r - b).max():.3g}}, {{ratio:.3g}}x the tolerance "
      f"(atol={{ATOL:g}}{{'*max|base|' if SCALED else ''}}, rtol={{RTOL:g}})")
print("DIVERGES" if ratio > 1 else "agrees")
sys.exit(1 if ratio > 1 else 0)
'''


def write_repro(divergence: Divergence, path: str | os.PathLike[str]) -> Path:
    """Write the script and its data for the blamed forward layer pair; returns the script's path."""
    backward = divergence.phase.value == "backward"
    d: EventDiff | None = divergence.forward if backward else divergence.event
    grads = divergence.event.base.outputs if backward and divergence.event is not None else ()
    if (
        d is None
        or d.base.layer is None
        or d.raw.layer is None
        or divergence.where not in ("layer", "between")
        or (backward and not any(g.value is not None for g in grads))
    ):
        raise OptionError(
            f"repro: {divergence.describe()} is not a layer call with its layers at hand (a live auto_diff/watch "
            "forward or backward divergence); a loaded or offline result, or an optimizer/state divergence, has none."
        )
    bfw, rfw = framework_of(d.base.layer, "base layer"), framework_of(d.raw.layer, "raw layer")
    ins = [t for t in d.base.inputs if t.value is not None and t.name.startswith("in[")]
    payload: dict[str, np.ndarray] = {}
    for side, fw, layer in (("base", bfw, d.base.layer), ("raw", rfw, d.raw.layer)):
        for i, t in enumerate(ins):
            payload[f"{side}.in{i}"] = np.require(t.value, requirements="C")
        if backward:  # base's gradient arriving at the first output, given to both: the local error
            payload[f"{side}.gout"] = np.require(next(g.value for g in grads if g.value is not None), requirements="C")
        for name, tensor in _state(fw, layer).items():
            payload[f"{side}.w.{name}"] = tensor
    tol = divergence.tolerance
    definitions = CellDefinitions()
    base_ctor, raw_ctor = _constructor(bfw, d.base.layer, definitions), _constructor(rfw, d.raw.layer, definitions)
    script = _SCRIPT.format(
        what=_docstring_safe(divergence.describe()),
        frameworks=" and ".join(sorted({bfw.name, rfw.name})),
        imports="\n".join(f"import {m}" for m in sorted({bfw.name, rfw.name} | _modules(d)) if m != "__main__")
        + (f"\n\n# defined in the notebook\n{defined}" if (defined := definitions.source()) else ""),
        atol=tol.atol, rtol=tol.rtol, scaled=tol.scaled, n_inputs=len(ins), backward=backward,
        compared="input gradients (for the same output gradient)" if backward else "outputs",
        base_ctor=base_ctor, raw_ctor=raw_ctor,
        base_fw=bfw.name, raw_fw=rfw.name, paths=_import_roots(d),
        base_training=bfw.is_training(d.base.layer), raw_training=rfw.is_training(d.raw.layer),
    )  # fmt: skip
    return _write_both(Path(path), payload, script)


def _write_both(out: Path, payload: dict[str, np.ndarray], script: str) -> Path:
    """Both files or neither: each is written under a temporary name and renamed once both are; a
    folder this call made is removed again if that fails."""
    from safetensors.numpy import save_file

    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    parts = [(out / "repro.safetensors", None), (out / "repro.py", script)]
    temps = [p.with_name(f".{p.name}.partial") for p, _ in parts]
    try:
        save_file(payload, str(temps[0]))
        temps[1].write_text(script)
        for (final, _), temp in zip(parts, temps):
            temp.replace(final)
    except BaseException:
        for temp in temps:
            temp.unlink(missing_ok=True)
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return out / "repro.py"


def _docstring_safe(text: str) -> str:
    """``text`` for the script's docstring: a layer named with a backslash or a NUL (a ModuleDict key)
    made the script a SyntaxError, whose exit status 1 read as "DIVERGES"."""
    return text.encode("unicode_escape").decode("ascii").replace('"', "'")


def _import_roots(d: EventDiff) -> list[str]:
    """Folders from which the layers' modules import (``/proj`` for ``/proj/pkg/mod.py`` as ``pkg.mod``)."""
    import sys

    roots = []
    for layer in (d.base.layer, d.raw.layer):
        name = type(layer).__module__
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or name.split(".")[0] in ("torch", "paddle"):
            continue
        root = Path(file).resolve().parent
        for _ in range(name.count(".")):
            root = root.parent
        if str(root) not in roots:
            roots.append(str(root))
    return roots


def _modules(d: EventDiff) -> set[str]:
    return {type(x).__module__ for x in (d.base.layer, d.raw.layer)}


def _state(fw: Framework, layer: Any) -> dict[str, np.ndarray]:
    state = layer.state_dict()
    return {str(k): np.require(fw.to_numpy(v), requirements="C") for k, v in state.items() if fw.is_tensor(v)}
