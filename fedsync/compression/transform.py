"""Sparsifiers that select in a transformed domain (the DCT of DeMo).

A :class:`TransformSparsifier` maps a flat tensor to coefficients of the same length,
keeps some of them and sends their positions and values in the frame's ordinary
explicit-position section (the positions index the coefficient array). Only the
:class:`~fedsync.compression.pipeline.Pipeline` needs to know: what the receiver
decodes (``sent``, ``decompress``) is the inverse transform of the kept coefficients,
a dense tensor in the parameter domain, so error feedback and aggregation stay in
the parameter domain and never see a coefficient.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from fedsync.compression.base import Sparsifier
from fedsync.updates import IndexMode, TensorSpec

__all__ = ["TransformSparsifier"]


class TransformSparsifier(Sparsifier):
    """A sparsifier whose positions and values are coefficients of a linear transform.

    :meth:`select` returns coefficient positions and values; :meth:`inverse` rebuilds
    the parameter-domain tensor from them. Positions always travel explicitly.
    """

    def index_mode(self, spec: TensorSpec) -> IndexMode:
        return "explicit"

    @abstractmethod
    def inverse(
        self, spec: TensorSpec, positions: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """The dense float32 tensor (``spec.numel`` values, on ``values``' device)
        whose transform holds ``values`` at ``positions`` and zeros elsewhere.

        ``positions`` are increasing int64 coefficient positions already checked to
        lie in ``[0, spec.numel)``.

        Raises
        ------
        CodecMismatch
            If the positions break the transform's own rule (e.g. more kept
            coefficients in one chunk than the spec allows).
        """
