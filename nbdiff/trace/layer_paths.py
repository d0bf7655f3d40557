"""Dotted layer paths (``model.layers.0.self_attn``; ``""`` is the root model)."""

from __future__ import annotations

__all__ = ["relative"]


def relative(path: str, root: str) -> str | None:
    """``path`` relative to the layer at ``root`` (``""`` for the root itself), or None outside it."""
    if not root:
        return path
    if path == root:
        return ""
    return path[len(root) + 1 :] if path.startswith(root + ".") else None
