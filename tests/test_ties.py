"""Weights tied on one side only (engine/ties): said with the result, since no layer is at fault."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nbdiff  # noqa: E402


@pytest.mark.parametrize("direction", ["torch->paddle", "paddle->torch"])
def test_weights_tied_on_one_side_only_are_said(direction):
    # Blamed "inherited" at head's backward with no word about the tie. torch's side ties its head to
    # its embedding; paddle's keeps two tensors.
    paddle = pytest.importorskip("paddle")

    class TorchLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.mid, self.head = (
                torch.nn.Embedding(16, 8),
                torch.nn.Linear(8, 8),
                torch.nn.Linear(8, 16, bias=False),
            )
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(torch.tanh(self.mid(self.emb(ids))))

    class PaddleLM(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb, self.mid = paddle.nn.Embedding(16, 8), paddle.nn.Linear(8, 8)
            self.head = paddle.nn.Linear(8, 16, bias_attr=False)

        def forward(self, ids):
            return self.head(paddle.tanh(self.mid(self.emb(ids))))

    torch.manual_seed(0)
    bfw, rfw = direction.split("->")
    base, raw = (TorchLM(), PaddleLM()) if bfw == "torch" else (PaddleLM(), TorchLM())
    ids = np.random.RandomState(0).randint(0, 16, (4, 5)).astype("int64")
    t = lambda fw: torch.from_numpy(ids) if fw == "torch" else paddle.to_tensor(ids)  # noqa: E731
    with nbdiff.watch(base, raw) as w:
        base(t(bfw)).square().mean().backward()
        raw(t(rfw)).square().mean().backward()
    tier, other = ("base", "raw") if bfw == "torch" else ("raw", "base")
    said = [m for m in w.result.warnings if " ties " in m]
    assert said == [
        f"{tier} ties `emb.weight` and `head.weight` (one tensor), {other} keeps them apart: the tied tensor's "
        f"gradient is the sum of both layers' (its backward differs from {other}'s by the other layer's share), and "
        "after an update the untied copies part. Tie them on both sides (tie_word_embeddings) or on neither."
    ]
