"""LayerMap: the user's overrides of automatic pairing.

Layers are named by dotted path (as in ``named_modules()``/``named_sublayers()``)
or given as the layer objects themselves; classes select every instance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nbdiff.errors import OptionError

__all__ = ["LayerMap", "MODES"]

MODES = ("self", "sublayers", "all")
"""``self``: skip the layer's own event, keep its sublayers. ``sublayers``: keep the
layer, skip everything inside it. ``all``: skip both."""


class LayerMap:
    """Explicit pairs, ignored layers, and black/white lists.

    ``map`` pairs base layers with raw layers: ``{"encoder.fc": "enc.linear"}``, or
    layer objects. A key may be a tuple of base layers run back to back that one raw
    layer replaces (many-to-one). A mapped pair is compared only at its boundary:
    the layers inside it are not paired.
    """

    def __init__(
        self,
        map: dict[Any, Any] | None = None,
        *,
        ignore: Iterable[Any] = (),
        black_list: Iterable[Any] = (),
        white_list: Iterable[Any] = (),
        mode: str = "all",
    ) -> None:
        self.map: dict[Any, Any] = dict(map or {})
        self._ignore: list[Any] = list(ignore)
        self._black: list[tuple[Any, str]] = []
        self._white: list[tuple[Any, str]] = []
        self.set_black_list(black_list, mode)
        self.set_white_list(white_list, mode)

    # -- building --------------------------------------------------------------
    def ignore(self, layers: Any) -> LayerMap:
        """Never compare these layers (and what is inside them), on either side."""
        self._ignore += _as_list(layers)
        return self

    def set_black_list(self, layers: Any, mode: str = "all") -> LayerMap:
        """Skip these layers or classes; ``mode`` is one of :data:`MODES`."""
        self._black += [(x, _check_mode(mode)) for x in _as_list(layers)]
        return self

    def set_white_list(self, layers: Any, mode: str = "all") -> LayerMap:
        """Compare only these layers or classes; ``mode`` is one of :data:`MODES`."""
        self._white += [(x, _check_mode(mode)) for x in _as_list(layers)]
        return self

    # -- queries ---------------------------------------------------------------
    def explicit_pairs(
        self, base_layers: dict[str, Any], raw_layers: dict[str, Any]
    ) -> list[tuple[tuple[str, ...], str]]:
        """The ``map`` as ``((base paths...), raw path)`` pairs, checked against both models."""
        out = []
        for b, r in self.map.items():
            bs = b if isinstance(b, (tuple, list)) else (b,)
            base_paths = tuple(_resolve(x, base_layers, "base") for x in bs)
            out.append((base_paths, _resolve(r, raw_layers, "raw")))
        return out

    def skip_reason(self, path: str, layer: Any, inside: list[tuple[str, Any]]) -> str | None:
        """Why the event of ``layer`` at ``path`` is not compared, or ``None``.

        ``inside`` lists the ``(path, layer)`` of every enclosing layer.
        """
        if any(_matches(x, path, layer) for x in self._ignore) or any(
            _matches(x, p, obj) for x in self._ignore for p, obj in inside
        ):
            return "ignored"
        for spec, mode in self._black:
            if _matches(spec, path, layer) and mode in ("self", "all"):
                return "black_list"
            if mode in ("sublayers", "all") and any(_matches(spec, p, obj) for p, obj in inside):
                return "black_list"
        if self._white:
            for spec, mode in self._white:
                if _matches(spec, path, layer) and mode in ("self", "all"):
                    return None
                if mode in ("sublayers", "all") and any(_matches(spec, p, obj) for p, obj in inside):
                    return None
            return "not in white_list"
        return None

    def __bool__(self) -> bool:
        return bool(self.map or self._ignore or self._black or self._white)

    def __repr__(self) -> str:
        parts = []
        if self.map:
            parts.append("{" + ", ".join(f"{_show(k)!s}: {_show(v)!s}" for k, v in self.map.items()) + "}")
        if self._ignore:
            parts.append(f"ignore={[_show(x) for x in self._ignore]}")
        if self._black:
            parts.append(f"black_list={[(_show(x), m) for x, m in self._black]}")
        if self._white:
            parts.append(f"white_list={[(_show(x), m) for x, m in self._white]}")
        return f"LayerMap({', '.join(parts)})"

    @staticmethod
    def auto(base: Any, raw: Any, inputs: Any) -> LayerMap:
        """Propose pairs from one forward pass of each model, print them and return them."""
        from nbdiff.align.auto_map import propose_layer_map

        return propose_layer_map(base, raw, inputs)


def _show(x: Any) -> str:
    if isinstance(x, str):
        return repr(x)
    if isinstance(x, type):
        return x.__name__
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(_show(v) for v in x) + ")"
    return f"<{type(x).__name__}>"


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple, set)) else [x]


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise OptionError(f"LayerMap mode {mode!r} is not one of {MODES}.")
    return mode


def _matches(spec: Any, path: str, layer: Any) -> bool:
    if isinstance(spec, str):
        return spec == path
    if isinstance(spec, type):
        return isinstance(layer, spec)
    return spec is layer


def _resolve(spec: Any, layers: dict[str, Any], side: str) -> str:
    if isinstance(spec, str):
        if spec not in layers:
            near = [p for p in layers if p.endswith(spec.rsplit(".", 1)[-1])][:3]
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise OptionError(f"LayerMap names {side} layer {spec!r}, which the {side} model does not have.{hint}")
        return spec
    for path, layer in layers.items():
        if layer is spec:
            return path
    raise OptionError(f"LayerMap names a {type(spec).__name__} object that is not a sublayer of the {side} model.")
