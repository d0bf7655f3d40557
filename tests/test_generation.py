"""Generation step by step (judge/generation): decode loops with KV caches under ``watch``, where a
divergence starts (decode step, token position), and whether it is late or early."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nbdiff
from nbdiff.judge.generation import generation

torch = pytest.importorskip("torch")
paddle = pytest.importorskip("paddle")

DIRECTIONS = ["torch->paddle", "paddle->torch"]


def _tensor(fw, a):
    return torch.from_numpy(a) if fw == "torch" else paddle.to_tensor(a)


def _decode(direction, bug_from=None, new_tokens=32):
    """A 4-token prompt, then ``new_tokens`` calls of one token each, under ``watch`` with defaults."""
    from tests.structure_models import rotary_decoder

    bfw, rfw = direction.split("->")
    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = rotary_decoder(bfw), rotary_decoder(rfw, bug_from)
    rng = np.random.RandomState(0)
    calls = [rng.randn(2, 4, 8).astype("float32")] + [rng.randn(2, 1, 8).astype("float32") for _ in range(new_tokens)]
    with nbdiff.watch(base, raw) as w:
        for x in calls:
            with torch.no_grad(), paddle.no_grad():
                base(_tensor(bfw, x))
                raw(_tensor(rfw, x))
    assert base.calls == raw.calls == len(calls)  # never called more often than the loop did
    return w.result


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_equivalent_decode_loops_with_kv_caches_pass_over_32_new_tokens(direction):
    r = _decode(direction)
    assert r, r.report()
    g = r.generation()
    assert g is not None and g.steps == 33 and g.step is None
    assert g.positions[0] == (0, 4) and g.positions[1] == (4, 5) and g.positions[-1] == (35, 36)
    assert "33 decode steps, positions 0-35, agree" in r.report()


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_position_bug_past_16_is_blamed_at_its_decode_step_as_a_late_divergence(direction):
    r = _decode(direction, bug_from=16)
    d = r.first_divergence
    assert d is not None, r.report()
    # Position 16 is computed by decode step 13 (the prompt took positions 0-3).
    assert (d.step, d.phase.value, d.raw_path) == (13, "forward", "rope"), d.describe()
    g = r.generation()
    assert (g.step, g.position, g.late) == (13, 16, True)
    assert "decode step 13 of 33, token position 16 (positions 0-15 agree): a late divergence" in r.report()
    # The step chart reads positions for a decode loop.
    from nbdiff.view.model import step_rows

    rows = step_rows(r)
    assert rows[13]["position"] == 16 and rows[0]["position"] == 0


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_bug_at_every_position_is_an_early_divergence(direction):
    from tests.structure_models import decoders

    bfw, rfw = direction.split("->")
    base, raw = decoders(direction, bug=True)
    tokens = np.random.RandomState(0).randn(6, 2, 1, 8).astype("float32")
    with nbdiff.watch(base, raw) as w:
        for t in tokens:
            with torch.no_grad(), paddle.no_grad():
                base(_tensor(bfw, t))
                raw(_tensor(rfw, t))
    g = w.result.generation()
    assert (g.step, g.position, g.late) == (0, 0, False), w.result.report()
    assert "the prompt (step 0 of 6), token position 0: an early divergence" in w.result.report()


def test_training_steps_are_not_a_decode_loop():
    rows = [dict(step=0, tokens=1, outputs=0.1, gradients=0.2), dict(step=1, tokens=1, outputs=0.1, gradients=0.2)]
    assert generation(rows, None) is None
    assert generation([dict(step=0, tokens=4), dict(step=1, tokens=4)], None) is None  # a fresh batch each call
    assert generation([dict(step=0, tokens=4), dict(step=1, tokens=1)], None).positions == ((0, 4), (4, 5))


# --- real libraries: transformers' generate() against paddleformers' --------------------------


def _llama_generate(bug=None):
    pytest.importorskip("transformers")
    pytest.importorskip("paddleformers")
    from tests.zoo.pairs import llama

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base, raw, _, _ = llama(bug)()
    ids = np.random.RandomState(0).randint(0, 96, (1, 5)).astype("int64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with nbdiff.watch(base, raw) as w:
            with torch.no_grad():
                out_b = base.generate(torch.from_numpy(ids), max_new_tokens=16, do_sample=False)
            with paddle.no_grad():
                out_r, _ = raw.generate(paddle.to_tensor(ids), max_new_tokens=16, decode_strategy="greedy_search")
    return w.result, out_b[0, 5:].tolist(), out_r[0].numpy().tolist()


def test_transformers_generate_against_paddleformers_generate_agrees_greedy_16_tokens():
    r, tokens_b, tokens_r = _llama_generate()
    assert tokens_b == tokens_r
    # transformers computes the prompt step's logits at the last position only (logits_to_keep=1):
    # compared with paddleformers' last position, not broadcast over every position.
    assert r, r.report()
    assert r.steps == 16 and r.generation().positions[:2] == ((0, 5), (5, 6))


def test_a_rotary_theta_bug_in_generation_is_blamed_at_its_step_and_layer():
    r, _, _ = _llama_generate("rope_theta")
    d = r.first_divergence
    assert (d.step, d.phase.value, d.base_path) == (0, "forward", "model.rotary_emb"), d.describe()
    g = r.generation()
    # Position 0 rotates by nothing at any theta: the error starts at position 1.
    assert (g.step, g.position, g.late) == (0, 1, True)


def test_decode_loops_recorded_apart_compare_as_a_decode_loop(tmp_path):
    from tests.structure_models import rotary_decoder

    torch.manual_seed(0)
    paddle.seed(0)
    base, raw = rotary_decoder("torch"), rotary_decoder("paddle", bug_from=16)
    raw.set_state_dict(
        {
            k: paddle.to_tensor(v.detach().numpy().T if v.ndim == 2 else v.detach().numpy())
            for k, v in base.state_dict().items()
        }
    )
    rng = np.random.RandomState(0)
    calls = [rng.randn(2, 4, 8).astype("float32")] + [rng.randn(2, 1, 8).astype("float32") for _ in range(20)]
    for model, fw, out in ((base, "torch", tmp_path / "b"), (raw, "paddle", tmp_path / "r")):
        with nbdiff.record(model, out), torch.no_grad(), paddle.no_grad():
            for x in calls:
                model(_tensor(fw, x))
    r = nbdiff.compare(tmp_path / "b", tmp_path / "r")
    d = r.first_divergence
    assert (d.step, d.raw_path) == (13, "rope"), r.report()
    g = r.generation()
    assert (g.step, g.position, g.late) == (13, 16, True)
