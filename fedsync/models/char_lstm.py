"""A character-level LSTM for next-character prediction (LEAF's Shakespeare model)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class CharLSTM(nn.Module):
    """``Embedding(vocab, 8) -> LSTM(hidden) x layers -> Linear(vocab)`` on the last step.

    LEAF's reference uses two layers of 256; both are configurable because a 2x256
    LSTM over 80 steps is the slowest model here on a CPU.

    Parameters
    ----------
    input_shape : tuple of int
        ``(seq_len,)``: character ids per sample.
    num_classes : int
        Vocabulary size (inputs and outputs share it).
    embedding_dim : int
        Width of the character embedding.
    hidden_size : int
        LSTM width.
    num_layers : int
        Stacked LSTM layers.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        *,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"char-lstm needs (seq_len,) input, got {tuple(input_shape)}")
        if min(num_classes, embedding_dim, hidden_size, num_layers) < 1:
            raise ValueError(
                "char-lstm sizes must be >= 1: "
                f"vocab {num_classes}, embedding {embedding_dim}, hidden {hidden_size}, "
                f"layers {num_layers}"
            )
        self.embedding = nn.Embedding(num_classes, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-character logits, shape ``(batch, vocab)``, from ids ``(batch, seq_len)``."""
        out, _ = self.lstm(self.embedding(x.long()))
        return self.head(out[:, -1])


def small_char_lstm(input_shape: Sequence[int], num_classes: int) -> CharLSTM:
    """One LSTM layer of 128 (79k parameters with the 64-character vocabulary): the
    cross-site scenario's model, small enough for several runs on a 2-core CPU."""
    return CharLSTM(input_shape, num_classes, hidden_size=128, num_layers=1)
