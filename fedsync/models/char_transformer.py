"""A decoder-only transformer language model that predicts every position (GPT-style).

Pre-norm blocks (``LayerNorm -> causal self-attention``, ``LayerNorm -> MLP``, each
with a residual), learned position embeddings and an output head tied to the token
embedding. Weights start as GPT-2's do: normal with standard deviation 0.02, the
projections into the residual stream scaled by ``1 / sqrt(2 * layers)``, biases zero.
The same seed gives the same weights on every platform (the initialisation draws only
from torch's CPU generator).

The cross-site comparisons use two sizes: ``char-gpt`` (4 layers of width 128, about
0.8M parameters with Tiny Shakespeare's 65 characters) and ``char-gpt-5m`` (6 layers of
width 256, about 4.8M).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.out(F.gelu(self.fc(self.norm2(x)))))


class CharTransformer(nn.Module):
    """``Embedding + positions -> blocks -> LayerNorm -> tied head``, logits per position.

    Parameters
    ----------
    input_shape : tuple of int
        ``(context,)``: token ids per sample, at most ``context`` long.
    num_classes : int
        Vocabulary size (inputs and outputs share it).
    width : int
        Embedding width (a multiple of ``heads``).
    layers : int
        Transformer blocks.
    heads : int
        Attention heads per block.
    dropout : float
        Dropout after the embeddings, the attention weights and each residual branch.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        *,
        width: int = 128,
        layers: int = 4,
        heads: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"char-gpt needs (context,) input, got {tuple(input_shape)}")
        context = int(input_shape[0])
        if min(context, num_classes, width, layers, heads) < 1:
            raise ValueError(
                "char-gpt sizes must be >= 1: "
                f"context {context}, vocab {num_classes}, width {width}, layers {layers}, "
                f"heads {heads}"
            )
        if width % heads:
            raise ValueError(f"char-gpt width {width} is not a multiple of heads {heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"char-gpt dropout must be in [0, 1), got {dropout}")
        self.context = context
        self.embedding = nn.Embedding(num_classes, width)
        self.positions = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self._init_weights(layers)

    def _init_weights(self, layers: int) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        for block in self.blocks:
            assert isinstance(block, _Block)
            for residual in (block.proj, block.out):
                nn.init.normal_(residual.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(batch, length, vocab)`` from ids ``(batch, length)``."""
        length = x.shape[1]
        if length > self.context:
            raise ValueError(f"char-gpt: {length} tokens exceed the context of {self.context}")
        positions = torch.arange(length, device=x.device)
        hidden = self.drop(self.embedding(x.long()) + self.positions(positions))
        for block in self.blocks:
            hidden = block(hidden)
        return self.norm(hidden) @ self.embedding.weight.T


def char_gpt_5m(input_shape: Sequence[int], num_classes: int) -> CharTransformer:
    """6 blocks of width 256 with 8 heads: about 4.8M parameters with 65 characters."""
    return CharTransformer(input_shape, num_classes, width=256, layers=6, heads=8)
