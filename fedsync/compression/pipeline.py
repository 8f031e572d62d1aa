"""A sparsifier, an optional rotation and a quantizer, per tensor and per update, and
its inverse.

:class:`Pipeline` is the stateless compressor: ``compress`` turns one flat float32
tensor into the :class:`~fedsync.updates.CompressedTensor` the wire format packs,
``decompress`` checks a received one against the same configuration and rebuilds the
:class:`~fedsync.updates.SparseTensor` the server aggregates (a
:class:`~fedsync.updates.LowRankTensor`, factors kept, for the ``lowrank`` mode). Error feedback
(:mod:`fedsync.compression.error_feedback`) wraps a pipeline; so may anything else
that follows the :class:`Compressor` protocol.

Where the update lives, the compressed tensor stays: with a device backend (Triton on
CUDA, or torch ops anywhere) positions, codes and params are tensors on the update's
device until the wire encoder writes the frame, and what the receiver will decode
(:meth:`Pipeline.sent`, which error feedback subtracts) is computed there from those
codes. With the host backend (numba on CPU) they are numpy views of the same memory.

A rotation (``rht``) maps the kept values before they are quantized; the receiver
dequantizes and undoes it. Its randomness comes from a frame seed derived from the
call's seed, which every tensor carries (:attr:`CompressedTensor.seed`) and the frame
stores once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsync.compression.base import Quantizer, Rotation, Sparsifier
from fedsync.compression.config import BuildContext
from fedsync.compression.errors import CodecMismatch, NonFiniteInputError, NonFiniteUpdate
from fedsync.compression.seeding import derive_seed
from fedsync.compression.spec import PipelineConfig
from fedsync.compression.transform import TransformSparsifier
from fedsync.kernels.dispatch import backend_for
from fedsync.updates import (
    CompressedTensor,
    LowRankTensor,
    SparseTensor,
    SparseUpdate,
    TensorSpec,
    device_tensor,
    dtype_name,
    host_array,
    lowrank_rank,
    matrix_dims,
    tensor_spec,
)

__all__ = [
    "DTYPE_NAMES",
    "Compressed",
    "Compressor",
    "Pipeline",
    "build_pipeline",
    "flatten",
    "split_factors",
]

DTYPE_NAMES: dict[torch.dtype, str] = {
    dtype: dtype_name(dtype)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
}
"""Dense dtypes an update may hold, and their names in :class:`TensorSpec`."""


def flatten(name: str, tensor: torch.Tensor) -> tuple[TensorSpec, torch.Tensor]:
    """The tensor's spec and its values as a 1-d contiguous float32 tensor.

    No copy when the tensor already is contiguous float32 (the result is then a view:
    compressors read it, never write it).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"update entry {name!r} must be a torch.Tensor, got {type(tensor).__name__}"
        )
    if tensor.dtype not in DTYPE_NAMES:
        raise ValueError(
            f"update entry {name!r} has dtype {tensor.dtype}; only floating tensors "
            f"({', '.join(DTYPE_NAMES.values())}) can be compressed"
        )
    return tensor_spec(name, tensor), tensor.detach().reshape(-1).to(torch.float32).contiguous()


@dataclass
class Compressed:
    """One compressed tensor plus what the sender needs to know what it sent.

    Attributes
    ----------
    tensor : CompressedTensor
        What goes to the wire.
    positions : torch.Tensor or None
        Where the values belong (int64, on the input's device); ``None`` for all.
    device : torch.device
        The input's device.
    """

    tensor: CompressedTensor
    positions: torch.Tensor | None
    device: torch.device


class Compressor(Protocol):
    """Anything that compresses one flat tensor and can say what the receiver gets."""

    def compress(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Compressed:
        """Compress the 1-d float32 ``x`` described by ``spec``."""
        ...

    def sent(self, compressed: Compressed) -> torch.Tensor:
        """The float32 values the receiver will decode, on the input's device."""
        ...


class Pipeline:
    """Sparsify, rotate (optionally), then quantize; stateless across calls (but see
    ``sparsifier.state``).

    Parameters
    ----------
    sparsifier : Sparsifier
    quantizer : Quantizer
    rotation : Rotation, optional
        Applied to the kept values before the quantizer; default none.
    """

    def __init__(
        self, sparsifier: Sparsifier, quantizer: Quantizer, rotation: Rotation | None = None
    ) -> None:
        if not isinstance(sparsifier, Sparsifier):
            raise TypeError(f"sparsifier must be a Sparsifier, got {type(sparsifier).__name__}")
        if not isinstance(quantizer, Quantizer):
            raise TypeError(f"quantizer must be a Quantizer, got {type(quantizer).__name__}")
        if rotation is not None and not isinstance(rotation, Rotation):
            raise TypeError(f"rotation must be a Rotation, got {type(rotation).__name__}")
        self.sparsifier = sparsifier
        self.quantizer = quantizer
        self.rotation = rotation

    # -- sender ------------------------------------------------------------------------

    def compress(self, spec: TensorSpec, x: torch.Tensor, seed: int) -> Compressed:
        """Compress ``x`` (1-d float32 of ``spec.numel`` values) with this call's seed.

        Raises
        ------
        NonFiniteInputError
            If a value that would be sent is NaN or Inf.
        """
        kept = self.sparsifier.select_for(spec, x, derive_seed(seed, spec.name, "sparsify"))
        values = kept.values
        if values.numel() and not backend_for(values).all_finite(values):
            raise NonFiniteInputError(f"tensor {spec.name!r} holds NaN or Inf")
        frame_seed = self.frame_seed(seed)
        if self.rotation is not None:
            assert frame_seed is not None
            values = self.rotation.rotate(spec.name, values, frame_seed)
            if values.numel() and not backend_for(values).all_finite(values):
                raise NonFiniteInputError(f"tensor {spec.name!r} overflows float32 when rotated")
        quantizer = self.sparsifier.quantizer_for(spec, self.quantizer)
        q = quantizer.quantize(values, derive_seed(seed, spec.name, "quantize"))
        indices: np.ndarray | torch.Tensor | None = None
        if kept.mode == "explicit":
            assert kept.positions is not None
            kept_at = kept.positions.to(torch.int64)
            # On the host backend the positions are CPU memory already (a view, no
            # copy); on a device they stay there until the frame is written.
            indices = kept_at.numpy() if backend_for(x).host else kept_at
        # A transform's values land everywhere once inverted (see ``sent``).
        positions = None if isinstance(self.sparsifier, TransformSparsifier) else kept.positions
        tensor = CompressedTensor(spec, kept.mode, indices, q, seed=frame_seed)
        return Compressed(tensor, positions, x.device)

    def frame_seed(self, seed: int) -> int | None:
        """The frame seed of a call with ``seed``: derived from it when this pipeline
        rotates (one per call, not per tensor: the frame carries it once, with or
        without tensors), else ``None``."""
        return derive_seed(seed, "rotation") if self.rotation is not None else None

    def sent(self, compressed: Compressed) -> torch.Tensor:
        """What the receiver decodes from ``compressed`` (same function it runs); for a
        low-rank tensor the product ``P @ Q.T``, flat (every position)."""
        tensor = compressed.tensor
        quantizer = self.sparsifier.quantizer_for(tensor.spec, self.quantizer)
        values = quantizer.decode(tensor.values, compressed.device)
        if self.rotation is not None:
            assert tensor.seed is not None
            values = self.rotation.unrotate(tensor.spec.name, values, tensor.seed)
        if tensor.index_mode == "lowrank":
            p, q = split_factors(tensor.spec, values)
            return (p @ q.T).reshape(-1)
        if isinstance(self.sparsifier, TransformSparsifier):
            assert tensor.indices is not None
            index = device_tensor(tensor.indices, compressed.device, torch.int64)
            return self.sparsifier.inverse(tensor.spec, index, values)
        return values

    def compress_update(
        self, update: Mapping[str, torch.Tensor], seed: int = 0
    ) -> list[CompressedTensor]:
        """Compress every tensor of ``update`` (any float dtype, any device)."""
        return compress_update(self, update, seed)

    # -- receiver ----------------------------------------------------------------------

    def decompress(
        self, tensor: CompressedTensor, device: torch.device | str = "cpu"
    ) -> SparseTensor:
        """Check ``tensor`` against this pipeline and rebuild its sparse form.

        Raises
        ------
        CodecMismatch
            Index mode, count, scheme, bits, params, codes or a frame seed (present
            without a rotation, missing with one) that this pipeline would not produce.
        NonFiniteUpdate
            A decoded value (or param) that is NaN or Inf.
        """
        spec = tensor.spec
        label = repr(spec.name)
        self.check_frame_seed(tensor.seed, label)
        mode = self.sparsifier.index_mode(spec)
        if tensor.index_mode != mode:
            raise CodecMismatch(
                "index mode differs from the codec's",
                field="index mode",
                tensor=label,
                expected=mode,
                got=tensor.index_mode,
            )
        count = len(tensor.values)
        if mode == "lowrank":
            return self._decompress_lowrank(tensor, torch.device(device))
        if mode == "explicit":
            if tensor.indices is None or len(tensor.indices) != count:
                raise CodecMismatch(
                    "explicit positions missing or not one per value", field="indices", tensor=label
                )
            positions = host_array(tensor.indices).astype(np.int64, copy=False)
            if count and (
                positions[0] < 0
                or positions[-1] >= spec.numel
                or bool((np.diff(positions) <= 0).any())
            ):
                raise CodecMismatch(
                    "positions not increasing within the tensor", field="indices", tensor=label
                )
            bound = self.sparsifier.max_count(spec)
            if count > bound:
                raise CodecMismatch(
                    "more values than the codec's sparsifier sends",
                    field="value count",
                    tensor=label,
                    expected=f"<= {bound}",
                    got=count,
                )
        elif mode == "dense":
            if count != spec.numel:
                raise CodecMismatch(
                    "a dense tensor needs one value per element",
                    field="value count",
                    tensor=label,
                    expected=spec.numel,
                    got=count,
                )
            positions = None
        else:
            try:
                shared = self.sparsifier.max_count(spec)
            except ValueError as exc:  # an explicit mask of another shape
                raise CodecMismatch(str(exc), field="shape", tensor=label) from exc
            if count != shared:
                raise CodecMismatch(
                    "value count differs from the shared mask's",
                    field="value count",
                    tensor=label,
                    expected=shared,
                    got=count,
                )
            positions = self.sparsifier.mask_positions(spec)
        device = torch.device(device)
        quantizer = self.sparsifier.quantizer_for(spec, self.quantizer)
        values = quantizer.dequantize(tensor.values, device, tensor=spec.name)
        if values.numel() and not backend_for(values).all_finite(values):
            raise NonFiniteUpdate("decoded values hold NaN or Inf", tensor=label)
        values = self._unrotate(tensor, values, label)
        if positions is None:
            index = torch.arange(spec.numel, dtype=torch.int64, device=device)
        else:
            index = torch.from_numpy(positions).to(device)
        if isinstance(self.sparsifier, TransformSparsifier):
            # Coefficients in, parameters out: the receiver gets the dense inverse.
            values = self.sparsifier.inverse(spec, index, values)
            if values.numel() and not backend_for(values).all_finite(values):
                raise NonFiniteUpdate("the inverse transform overflows", tensor=label)
            index = torch.arange(spec.numel, dtype=torch.int64, device=device)
        return SparseTensor(spec, index, values.to(torch.float32))

    def _decompress_lowrank(self, tensor: CompressedTensor, device: torch.device) -> LowRankTensor:
        """Check a ``lowrank`` tensor's rank and factors; keep them as factors."""
        spec = tensor.spec
        label = repr(spec.name)
        dims = matrix_dims(spec.shape)
        count = len(tensor.values)
        rank = lowrank_rank(spec.shape, count)
        if dims is None or rank is None:
            # The wire decoder rejects these already; a hand-built tensor may not be.
            raise CodecMismatch(
                "factor values are not r * (m + n) for a rank within the matrix",
                field="value count",
                tensor=label,
                expected=f"r * (m + n), 1 <= r <= min(m, n), (m, n) = {dims}",
                got=count,
            )
        bound = self.sparsifier.max_count(spec)
        if count != bound:
            raise CodecMismatch(
                "factor rank differs from the codec's",
                field="rank",
                tensor=label,
                expected=bound // sum(dims),
                got=rank,
            )
        quantizer = self.sparsifier.quantizer_for(spec, self.quantizer)
        values = quantizer.dequantize(tensor.values, device, tensor=spec.name)
        if self.rotation is not None and not backend_for(values).all_finite(values):
            raise NonFiniteUpdate("decoded values hold NaN or Inf", tensor=label)
        values = self._unrotate(tensor, values, label)
        p, q = split_factors(spec, values)
        for field, factor in (("P", p), ("Q", q)):
            if not backend_for(factor).all_finite(factor.reshape(-1)):
                raise NonFiniteUpdate(
                    f"factor {field} holds NaN or Inf", field=f"factor {field}", tensor=label
                )
        return LowRankTensor(spec, p, q)

    def check_frame_seed(self, seed: int | None, tensor: str | None = None) -> None:
        """A frame seed exactly when this pipeline rotates.

        :meth:`fedsync.codecs.UpdateCodec.decode` checks it once per frame, on its
        header (so it holds for a frame of no tensors); :meth:`decompress` again per
        tensor, before anything is allocated for it.

        Raises
        ------
        CodecMismatch
            A rotating pipeline's frame without a seed, or a seed for one that does
            not rotate (``tensor``, when given, names the tensor).
        """
        if (seed is None) != (self.rotation is None):
            raise CodecMismatch(
                "a rotation needs the frame seed, and only a rotation uses one",
                field="seed",
                tensor=tensor,
                expected="a frame seed" if self.rotation is not None else "none",
                got="none" if seed is None else "a frame seed",
            )

    def _unrotate(self, tensor: CompressedTensor, values: torch.Tensor, label: str) -> torch.Tensor:
        """Undo the rotation of finite dequantized ``values`` (no-op without one).

        The work is ``O(count log block)`` and the memory the output plus a few slabs
        (see :mod:`fedsync.compression.rotations.hadamard`): bounded by the value count
        the caller has already checked against the spec and the frame's limits.
        """
        if self.rotation is None or not values.numel():
            return values
        assert tensor.seed is not None
        values = self.rotation.unrotate(tensor.spec.name, values, tensor.seed)
        if not backend_for(values).all_finite(values):
            raise NonFiniteUpdate("the inverse rotation overflows float32", tensor=label)
        return values

    def decompress_update(
        self, tensors: list[CompressedTensor], device: torch.device | str = "cpu"
    ) -> SparseUpdate:
        """:meth:`decompress` every tensor, by name."""
        return {t.spec.name: self.decompress(t, device) for t in tensors}


def compress_update(
    compressor: Compressor, update: Mapping[str, torch.Tensor], seed: int = 0
) -> list[CompressedTensor]:
    """Every tensor of ``update`` through ``compressor`` (a pipeline, or a memory stage
    around one), in the update's order."""
    out = []
    for name, tensor in update.items():
        spec, flat = flatten(name, tensor)
        out.append(compressor.compress(spec, flat, seed).tensor)
    return out


def subtract_sent(memory: torch.Tensor, compressed: Compressed, sent: torch.Tensor) -> None:
    """Remove from a sender's memory (residual, momentum) what the receiver decodes."""
    if compressed.positions is None:
        memory.sub_(sent)
    else:
        memory.index_add_(0, compressed.positions, sent, alpha=-1.0)


def split_factors(spec: TensorSpec, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, Q)``, ``(m, r)`` and ``(n, r)`` views of a low-rank tensor's flat factor
    values (``P`` then ``Q``, row-major; the count already checked)."""
    dims = matrix_dims(spec.shape)
    assert dims is not None
    m, n = dims
    rank = values.numel() // (m + n)
    return values[: m * rank].view(m, rank), values[m * rank :].view(n, rank)


def build_pipeline(config: PipelineConfig, context: BuildContext | None = None) -> Pipeline:
    """The (stateless) pipeline of ``config``; error feedback is wrapped separately."""
    context = context or BuildContext()
    assert config.sparsifier is not None and config.quantizer is not None
    rotation = config.rotation.build(context) if config.rotation is not None else None
    return Pipeline(config.sparsifier.build(context), config.quantizer.build(context), rotation)
