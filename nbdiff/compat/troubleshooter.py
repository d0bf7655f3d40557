"""TroubleShooter's ``api_dump_*`` on nbdiff: ``from nbdiff.compat.troubleshooter import ...``.

``api_dump_init`` / ``api_dump_start`` / ``api_dump_stop`` record the network with API-level
tracing into ``output_path/rank{R}`` (nbdiff's format: JSON and safetensors, never pickle);
``api_dump_compare`` compares two such folders, every step, and writes
``ts_api_mapping_{step}.csv``, ``ts_api_forward_compare_{step}.csv`` and
``ts_api_backward_compare_{step}.csv``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbdiff.errors import OptionError
from nbdiff.frameworks import framework_of
from nbdiff.offline import compare
from nbdiff.recording import record
from nbdiff.result import DiffResult

__all__ = ["api_dump_init", "api_dump_start", "api_dump_stop", "api_dump_compare"]

_DUMP_TYPES = {"all": "tensor", "npy": "tensor", "statistics": "statistics", "stack": "stack"}


class _State:
    net: Any = None
    output_path: str = "./ts_api_dump"
    retain_backward: bool = False
    active: record | None = None


def api_dump_init(
    net: Any, output_path: str = "./ts_api_dump", *, retain_backward: bool = False, compare_statedict: bool = False
) -> None:
    """Choose the network and the output folder. Dropout is neutralised while dumping, as TroubleShooter did.

    ``compare_statedict`` also saves the network's weights (``{framework}_net.safetensors``).
    """
    framework_of(net, "net")
    _State.net, _State.output_path, _State.retain_backward = net, str(output_path), retain_backward
    if compare_statedict:
        _save_weights(net, Path(output_path))


def api_dump_start(
    mode: str = "all",
    scope: list[str] | None = None,
    dump_type: str = "all",
    filter_data: bool = True,
    filter_stack: bool = True,
) -> None:
    """Start recording: every call of the network is a step; API calls inside layers are kept."""
    if _State.net is None:
        raise OptionError("api_dump_start: call api_dump_init(net, output_path) first.")
    if dump_type not in _DUMP_TYPES:
        raise OptionError(f"api_dump_start: dump_type={dump_type!r} is not one of {sorted(_DUMP_TYPES)}.")
    if _State.active is not None:
        raise OptionError("api_dump_start: a dump is already running; call api_dump_stop() first.")
    rec = record(
        _State.net, _State.output_path, api_level=True, dump_type=_DUMP_TYPES[dump_type], mode=mode, scope=scope,
        filter_data=filter_data, filter_stack=filter_stack, retain_backward=_State.retain_backward,
        overwrite=True,  # TroubleShooter: each start/stop pair writes the dump again
    )  # fmt: skip
    _State.active = rec.__enter__()


def api_dump_stop() -> None:
    """Stop recording and write the dump (a later start/stop pair writes it again)."""
    if _State.active is None:
        raise OptionError("api_dump_stop: no dump is running (call api_dump_start first).")
    rec, _State.active = _State.active, None
    rec.__exit__(None, None, None)


def api_dump_compare(
    origin_path: str,
    target_path: str,
    output_path: str | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    ignore_unmatched: bool = False,
) -> DiffResult:
    """Compare ``target_path`` against ``origin_path``; with ``output_path``, write the CSV tables.

    ``atol``/``rtol`` left as ``None`` use nbdiff's defaults (no false alarms on
    equivalent models); explicit values are absolute and relative as in TroubleShooter.
    With ``equal_nan=False`` a NaN on both sides at the same place is still a difference.
    """
    result = compare(origin_path, target_path, atol=atol, rtol=rtol, ignore_unmatched=ignore_unmatched)
    result = _nan_is_a_difference(result) if not equal_nan else _nan_agrees(result)
    if output_path is not None:
        result_tables = result.to_csv(output_path)
        for f in result_tables:
            p = Path(f)
            p.rename(p.with_name("ts_api_" + p.name))
    print(result.report())
    return result


def _nan_agrees(result: DiffResult) -> DiffResult:
    """TroubleShooter's ``equal_nan=True``: NaN where both sides hold it at the same place is agreement,
    so nbdiff's "first event producing NaN" finding is dropped when nothing else differs."""
    d = result.first_divergence
    if d is None or d.where != "nonfinite" or not all(t.passed for e in result.events for t in e.tensors):
        return result
    from dataclasses import replace

    return replace(result, first_divergence=None, findings=())


def _nan_is_a_difference(result: DiffResult) -> DiffResult:
    """TroubleShooter's numpy.allclose(equal_nan=False): a first divergence where both sides hold NaN."""
    if result.first_divergence is not None:
        return result
    for e in result.events:
        for t in e.tensors:
            if t.nan_base or t.nan_raw:
                from dataclasses import replace

                from nbdiff.judge.blame import divergence_of

                bad = replace(t, ratio=float("inf"), note="NaN (equal_nan=False)")
                d = replace(e, tensors=(bad,))
                return replace(result, first_divergence=divergence_of(d, "layer"))
    return result


def _save_weights(net: Any, folder: Path) -> None:
    from safetensors.numpy import save_file

    fw = framework_of(net, "net")
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for path, layer in fw.named_layers(net):
        for name, t in fw.direct_params(layer) + fw.direct_buffers(layer):
            arrays[f"{path}.{name}" if path else name] = fw.to_numpy(t).copy()
    save_file(arrays, str(folder / f"{fw.name}_net.safetensors"))


def _reset() -> None:
    """Forget the current dump (tests)."""
    if _State.active is not None:
        _State.active.__exit__(None, None, None)
    _State.net, _State.active = None, None
