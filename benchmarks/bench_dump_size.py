"""Bytes per step of a dump of a 1B-parameter-shaped model, for each of record's capture options.

Run: .venv/bin/python benchmarks/bench_dump_size.py [--steps S] [--width W]
A Llama-shaped decoder with the layout of a 1B model (16 blocks; attention q/k/v/o, a gated MLP,
two RMSNorms per block, embedding and head) at tiny width (``W``, default 64; sequence 32, batch
2), trained ``S`` SGD steps under ``nbdiff.record``. Counts bytes on disk, not time: what a 7B
user has to budget for scales with the width squared (weights) or the width (activations), and
the relative sizes of the options hold. Prints each option's bytes per step and its share of
the full tensor dump.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nbdiff  # noqa: E402

warnings.filterwarnings("ignore")
BLOCKS, VOCAB, SEQ, BATCH = 16, 256, 32, 2


class RMSNorm(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate_proj, self.up_proj = torch.nn.Linear(d, 4 * d, bias=False), torch.nn.Linear(d, 4 * d, bias=False)
        self.down_proj = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        att = torch.nn.functional.scaled_dot_product_attention(
            self.q_proj(h), self.k_proj(h), self.v_proj(h), is_causal=True
        )
        x = x + self.o_proj(att)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, d)
        self.layers = torch.nn.ModuleList(Block(d) for _ in range(BLOCKS))
        self.norm, self.lm_head = RMSNorm(d), torch.nn.Linear(d, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


OPTIONS = {
    "tensor (everything)": dict(),
    "statistics": dict(dump_type="statistics"),
    "tensor, depth=1 (the blocks' calls, not their projections')": dict(depth=1),
    "tensor, layers=['layers.3.*']": dict(layers=["layers.3", "layers.3.*"]),
    "tensors of layers.3's projections, statistics elsewhere": dict(tensors=["layers.3.*_proj"]),
    "tensor, every 4th step (steps=range(0, S, 4))": "every 4th",
}


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(options: dict, steps: int, width: int, folder: Path) -> tuple[int, int]:
    torch.manual_seed(0)
    model = Decoder(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with nbdiff.record(model, folder, **options) as rec:
        for _ in range(steps):
            model(ids).float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    return size(folder), len(list(rec.path.glob("step*.json")))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    params = sum(p.numel() for p in Decoder(args.width).parameters())
    print(f"1B-shaped decoder: {BLOCKS} blocks at width {args.width} ({params / 1e6:.2f}M parameters), "
          f"batch {BATCH} x {SEQ} tokens, {args.steps} SGD steps")  # fmt: skip
    full = None
    root = Path(tempfile.mkdtemp())
    try:
        for i, (name, options) in enumerate(OPTIONS.items()):
            if options == "every 4th":
                options = dict(steps=range(0, args.steps, 4))
            total, written = run(options, args.steps, args.width, root / str(i))
            per_step = total / args.steps  # per training step, written or not
            full = full or per_step
            print(
                f"  {name:58s} {per_step / 2**20:8.2f} MiB/step  {100 * per_step / full:6.1f}%  ({written} step files)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
