"""A small decoder-only transformer language model, sized by flags.

The trainer jobs exist to exercise elasticity and checkpointing, not to reach a good perplexity,
so the model is the plainest causal transformer that torch ships the pieces for. Its size is what
matters: big enough (tens of millions of parameters by default) that checkpoint save/restore
costs are measurable, small enough that a step takes well under a second on two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the language model; saved with every checkpoint's metadata."""

    vocab_size: int = 8192
    """Tokens in the vocabulary; embedding and output head are each vocab_size x d_model."""
    d_model: int = 512
    """Width of the residual stream."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 8
    """Attention heads per block; must divide d_model."""
    seq_len: int = 32
    """Tokens per training sample (the model also learns positions up to this length)."""
    dropout: float = 0.0
    """Dropout probability; 0 keeps runs bit-comparable across world sizes."""


class TransformerLM(nn.Module):
    """Causal transformer LM: token + position embeddings, pre-norm blocks, untied output head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=config.d_model,
                nhead=config.n_heads,
                dim_feedforward=4 * config.d_model,
                dropout=config.dropout,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Map token ids (batch, seq) to next-token logits (batch, seq, vocab)."""
        seq_len = tokens.shape[1]
        positions = torch.arange(seq_len, device=tokens.device)
        hidden = self.token_embedding(tokens) + self.position_embedding(positions)
        causal_mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=tokens.device)
        for block in self.blocks:
            hidden = block(hidden, src_mask=causal_mask, is_causal=True)
        return self.head(self.final_norm(hidden))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (what the checkpoint size scales with)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def format_count(count: int) -> str:
    """`count` with one decimal and a k/M/B suffix (830, 12.3k, 21.0M), so that a tiny test model
    and a large one both print a figure that says something (not 0.0M)."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if round(count / scale, 1) >= 1:
            return f"{count / scale:.1f}{suffix}"
    return str(count)
