"""Dotted layer paths."""

from nbdiff.trace.layer_paths import relative


def test_a_path_relative_to_a_layer_is_inside_it_or_none():
    assert relative("attn.out_proj", "attn") == "out_proj"
    assert relative("attn", "attn") == ""
    assert relative("attn.out_proj", "") == "attn.out_proj"  # the root holds every layer
    assert relative("attn2.q", "attn") is None  # a prefix of the name is not an ancestor
    assert relative("fc", "attn") is None
