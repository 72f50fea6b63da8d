"""The reference job's model and data: a small causal transformer LM on synthetic tokens.

Small on purpose (the demo trains two ranks on two CPU cores), but shaped like the real thing:
embedding, pre-norm transformer blocks, a language-model head, cross-entropy on next tokens.
Batches are a pure function of (seed, step, rank), so a job resumed from step N sees exactly the
data it would have seen without the fault.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 1024
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    seq: int = 64
    batch: int = 8


class TinyLM(nn.Module):
    causal: torch.Tensor  # a registered buffer, which nn.Module's attribute typing cannot see

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.d_model))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(cfg.d_model, cfg.heads, 4 * cfg.d_model, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(cfg.seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        mask = self.causal[: tokens.shape[1], : tokens.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def synthetic_batch(cfg: ModelConfig, seed: int, step: int, rank: int, device: torch.device) -> torch.Tensor:
    """Tokens of shape (batch, seq + 1): inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.randint(cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator).to(device)


def loss_fn(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
