"""The paddle side of BERT, written the way paddlenlp writes it.

paddlenlp does not install beside paddleformers (which has no BERT), so this follows its
``BertModel``: embeddings of its own, then ``paddle.nn.TransformerEncoder`` (whose ``self_attn``
ends at ``out_proj``, with the residual, dropout and ``norm1`` in the encoder layer, and the FFN's
activation called as a function), then a pooler. transformers' ``BertAttention`` holds the
self-attention *and* its output projection, dropout, residual and LayerNorm, and calls its FFN
activation as a module: the same math, blocks of other spans.
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import nn


class BertEmbeddings(nn.Layer):
    def __init__(self, vocab: int, hidden: int, max_positions: int, type_vocab: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.layer_norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Any, token_type_ids: Any = None) -> Any:
        ones = paddle.ones_like(input_ids, dtype="int64")
        position_ids = paddle.cumsum(ones, axis=-1) - ones
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids, dtype="int64")
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(embeddings))


class BertPooler(nn.Layer):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: Any) -> Any:
        return self.activation(self.dense(hidden_states[:, 0]))


class BertModel(nn.Layer):
    def __init__(
        self, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
        intermediate_size: int, max_position_embeddings: int, type_vocab_size: int, hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1, pad_token_id: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.pad_token_id = pad_token_id
        self.embeddings = BertEmbeddings(
            vocab_size, hidden_size, max_position_embeddings, type_vocab_size, hidden_dropout_prob
        )
        layer = nn.TransformerEncoderLayer(
            hidden_size, num_attention_heads, intermediate_size, dropout=hidden_dropout_prob,
            activation=hidden_act, attn_dropout=hidden_dropout_prob, act_dropout=0,
        )  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, num_hidden_layers)
        self.pooler = BertPooler(hidden_size)

    def forward(self, input_ids: Any, token_type_ids: Any = None) -> tuple[Any, Any]:
        mask = paddle.unsqueeze((input_ids == self.pad_token_id).astype("float32") * -1e4, axis=[1, 2])
        sequence = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
        return sequence, self.pooler(sequence)


class GPTDecoderLayer(nn.Layer):
    """paddlenlp's GPT decoder layer: pre-norm, ``paddle.nn.MultiHeadAttention`` with separate q/k/v
    projections (transformers' GPT-2 fuses them in one ``Conv1D``), the activation as a function."""

    def __init__(self, hidden: int, heads: int, inner: int, dropout: float, eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = nn.MultiHeadAttention(hidden, heads, dropout=dropout)
        self.linear1 = nn.Linear(hidden, inner)
        self.linear2 = nn.Linear(inner, hidden)
        self.norm1 = nn.LayerNorm(hidden, epsilon=eps)
        self.norm2 = nn.LayerNorm(hidden, epsilon=eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = nn.functional.gelu

    def forward(self, tgt: Any, mask: Any) -> Any:
        h = self.norm1(tgt)
        tgt = tgt + self.dropout1(self.self_attn(h, h, h, attn_mask=mask))
        return tgt + self.dropout2(self.linear2(self.activation(self.linear1(self.norm2(tgt)))))


class GPTModel(nn.Layer):
    """paddlenlp's ``GPTModel`` (embeddings, decoder layers, final norm), returning the hidden states."""

    def __init__(
        self, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
        intermediate_size: int, max_position_embeddings: int, hidden_dropout_prob: float = 0.1,
    ) -> None:  # fmt: skip
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.dropout = nn.Dropout(hidden_dropout_prob)
        self.layers = nn.LayerList(
            [
                GPTDecoderLayer(hidden_size, num_attention_heads, intermediate_size, hidden_dropout_prob)
                for _ in range(num_hidden_layers)
            ]
        )
        self.norm = nn.LayerNorm(hidden_size)

    def forward(self, input_ids: Any) -> Any:
        length = input_ids.shape[1]
        positions = paddle.arange(length, dtype="int64").unsqueeze(0)
        x = self.dropout(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        causal = paddle.triu(paddle.full([length, length], -1e4, dtype=x.dtype), diagonal=1)
        for layer in self.layers:
            x = layer(x, causal)
        return self.norm(x)
