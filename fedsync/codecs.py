"""fedsync's codecs as a library: a state dict to bytes and back, on your own transport.

For users who move updates themselves (their own Flower messages, ``torch.distributed``,
files): :class:`Codec` compresses a ``{name: tensor}`` mapping (a model's state dict, an
update, gradients) into one self-checking frame and decompresses a frame back into dense
tensors, checked against the tensors the receiver expects::

    >>> import torch
    >>> from fedsync.codecs import Codec
    >>> update = {"w": torch.randn(100, 10), "b": torch.randn(10)}
    >>> sender, receiver = Codec("topk:0.1+uniform:8+ef"), Codec("topk:0.1+uniform:8+ef")
    >>> dense = receiver.decompress(sender.compress(update), like=update)
    >>> sorted(dense), dense["w"].shape
    (['b', 'w'], torch.Size([100, 10]))

Rules, the same on both ends:

* **Only floating-point tensors are compressed** (float32, float16, bfloat16, float64).
  Other entries of a state dict (BatchNorm's ``num_batches_tracked``, integer buffers,
  boolean masks) are skipped by :meth:`Codec.compress` and by the ``like=`` of
  :meth:`Codec.decompress`, which returns the floating-point tensors only: merge them
  into the model with ``model.load_state_dict(out, strict=False)``, or send the others
  your own way (:func:`float_tensors` names what is sent).
* **The receiver uses the sender's spec.** :meth:`Codec.decompress` accepts only frames
  written by a codec of its own spec: a frame of another codec raises
  :class:`UnexpectedCodec`, read off the frame's header before anything is allocated.
  Any other fault of the bytes (truncated, corrupt, another model's tensors, NaN)
  raises a :class:`PayloadError` subclass that names it; nothing else.
* **Tensors stay on their device.** A CUDA update is compressed on the GPU (fedsync's
  Triton kernels; the frame's sections come to the host once), and decompressed tensors
  land on the device of the ``like=`` tensors (or ``device=``).
* **The sender is stateful** (error-feedback residuals, a step counter that varies the
  seed of stochastic stages): :meth:`Codec.state_dict` / :meth:`Codec.load_state_dict`
  carry it between processes as CPU tensors (``torch.save``-able); a fresh codec of the
  same spec and seed that loads it writes the same bytes as the original would have.

The spec grammar is in ``docs/compression.md`` and :mod:`fedsync.compression.spec`;
:func:`codec_names` lists the stage names. The engine underneath is
:class:`fedsync.codec.UpdateCodec` (:attr:`Codec.update_codec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import numpy as np
import torch

from fedsync.codec import CompressionStats, UpdateCodec
from fedsync.compression.config import STAGE_ORDER
from fedsync.compression.errors import (
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    SpecError,
    UnknownCodec,
    UpdateMismatch,
)
from fedsync.compression.pipeline import DTYPE_NAMES
from fedsync.compression.registry import REGISTRY
from fedsync.compression.spec import PipelineConfig
from fedsync.updates import TensorSpec
from fedsync.wire import DEFAULT_LIMITS, FrameLimits, PayloadError, UnexpectedCodec

__all__ = [
    "Codec",
    "CodecMismatch",
    "CompressionStats",
    "NonFiniteInputError",
    "NonFiniteUpdate",
    "PayloadError",
    "SpecError",
    "TensorSpec",
    "UnexpectedCodec",
    "UnknownCodec",
    "UpdateMismatch",
    "codec_names",
    "float_tensors",
    "tensor_specs",
]

Like: TypeAlias = Mapping[str, torch.Tensor] | Mapping[str, TensorSpec]
"""What a receiver expects: a state dict (or any name -> tensor mapping) of the model,
or the :class:`TensorSpec` of each tensor (:func:`tensor_specs`)."""

_TORCH_DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}

_STATE_KEYS = ("codec/step",)
_STATE_PREFIXES = ("residual/", "momentum/", "sparsifier/", "factors/")
"""Keys of a codec's :meth:`Codec.state_dict` (exact, then by prefix)."""


def _compressible(tensor: torch.Tensor) -> bool:
    return tensor.dtype in DTYPE_NAMES


def float_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of ``tensors`` a :class:`Codec` compresses: the floating-point ones.

    Parameters
    ----------
    tensors : mapping of str to torch.Tensor
        A state dict or update.

    Returns
    -------
    dict of str to torch.Tensor
        The float32, float16, bfloat16 and float64 entries, in order (the tensors
        themselves, not copies). Integer, boolean and complex entries are left out.

    Raises
    ------
    TypeError
        If an entry is not a tensor.
    """
    out = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"entry {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if _compressible(tensor):
            out[name] = tensor
    return out


def tensor_specs(like: Like) -> dict[str, TensorSpec]:
    """The :class:`TensorSpec` (name, shape, dtype) of every tensor a frame must hold.

    Parameters
    ----------
    like : mapping of str to torch.Tensor or to TensorSpec
        A state dict (its floating-point entries count, see :func:`float_tensors`), or
        specs, which are returned as given.

    Raises
    ------
    TypeError
        If an entry is neither a tensor nor a :class:`TensorSpec`.
    ValueError
        If a spec's name differs from its key, or its dtype is not a float dtype.
    """
    specs: dict[str, TensorSpec] = {}
    for name, item in like.items():
        if isinstance(item, torch.Tensor):
            if _compressible(item):
                shape = tuple(int(d) for d in item.shape)
                specs[name] = TensorSpec(name, shape, DTYPE_NAMES[item.dtype])
        elif isinstance(item, TensorSpec):
            if item.name != name:
                raise ValueError(f"like[{name!r}] is the spec of {item.name!r}")
            if item.dtype not in _TORCH_DTYPES:
                raise ValueError(
                    f"like[{name!r}] has dtype {item.dtype!r}; "
                    f"a frame holds {', '.join(_TORCH_DTYPES)}"
                )
            specs[name] = item
        else:
            raise TypeError(
                f"like[{name!r}] must be a torch.Tensor or TensorSpec, got {type(item).__name__}"
            )
    return specs


def codec_names() -> dict[str, list[str]]:
    """The stage names a spec may use, by kind, in spec order.

    Returns
    -------
    dict of str to list of str
        ``{"sparsifier": [...], "rotation": [...], "quantizer": [...], "feedback":
        [...]}``, each sorted (aliases included). A spec is
        ``sparsifier[+rotation][+quantizer][+feedback]``, each stage ``name[:args]``
        (grammar: :mod:`fedsync.compression.spec`).
    """
    return {kind: REGISTRY.names(kind) for kind in STAGE_ORDER}


class Codec:
    """Compress a state dict to bytes, decompress bytes to dense tensors.

    Parameters
    ----------
    spec : str or PipelineConfig
        The pipeline, e.g. ``"topk:0.1+uniform:8+ef"`` (see :func:`codec_names` and
        ``docs/compression.md``). Sender and receiver use the same spec.
    seed : int
        Base seed of the stochastic stages (random-k, stochastic rounding); with the
        step counter in the codec's state it fixes every random choice, so the same
        spec, seed, state and input give the same bytes. Give each sender its own.
    like : mapping of str to torch.Tensor or to TensorSpec, optional
        The model, known to both ends. Frames then carry an 8-byte digest of its
        tensors' names, shapes and dtypes instead of a tensor table, and
        :meth:`decompress` checks against it when called without ``like=``. Both ends
        must then pass it (a receiver without it cannot resolve the digest).
    masks : mapping of str to torch.Tensor, optional
        Shared pruning masks, for a ``mask`` sparsifier without a density (both ends).
    limits : FrameLimits
        Bounds the decoder enforces before allocating anything.

    Raises
    ------
    SpecError
        For an invalid spec.
    ValueError
        For a seed that is not an int or limits that are not :class:`FrameLimits`.

    Notes
    -----
    Not thread-safe (the sender's state is mutable); decompressing is pure.
    """

    def __init__(
        self,
        spec: str | PipelineConfig = "topk:0.1+uniform:8+ef",
        *,
        seed: int = 0,
        like: Like | None = None,
        masks: Mapping[str, torch.Tensor] | None = None,
        limits: FrameLimits = DEFAULT_LIMITS,
    ) -> None:
        self._like = tensor_specs(like) if like is not None else None
        self._codec = UpdateCodec(spec, seed=seed, masks=masks, limits=limits, specs=self._like)

    @property
    def spec(self) -> str:
        """The canonical spec: what every frame of this codec names."""
        return self._codec.spec

    @property
    def update_codec(self) -> UpdateCodec:
        """The :class:`~fedsync.codec.UpdateCodec` underneath (sparse decoding, stats)."""
        return self._codec

    def __repr__(self) -> str:
        return f"Codec({self.spec!r}, seed={self._codec.seed})"

    # -- sender ----------------------------------------------------------------------

    def compress(self, tensors: Mapping[str, torch.Tensor]) -> bytes:
        """Compress the floating-point tensors of ``tensors`` into one frame.

        Parameters
        ----------
        tensors : mapping of str to torch.Tensor
            A state dict, an update or gradients, on any device. Non-float entries are
            skipped (:func:`float_tensors`); their order is kept.

        Returns
        -------
        bytes
            The frame. With error feedback, what it leaves out is remembered and added
            to the next call's tensors (:meth:`state_dict` carries it).

        Raises
        ------
        NonFiniteInputError
            If a value that would be sent is NaN or Inf.
        ValueError
            If the tensors differ from the codec's ``like`` or, under error feedback,
            from the previous call's (reset with a fresh codec).
        """
        return self._codec.encode(float_tensors(tensors))

    def compression_stats(self) -> CompressionStats:
        """Bytes, values sent and ratios of the last :meth:`compress` (and totals)."""
        return self._codec.compression_stats()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The sender's memory, as CPU tensors (copies), for ``torch.save``.

        Keys: ``codec/step`` (calls so far, int64), ``residual/<name>`` and
        ``momentum/<name>`` (error feedback, flat float32), ``sparsifier/<...>`` and
        ``factors/<name>`` (SIDCo's stage counts, PowerSGD's warm start). Empty memory
        for specs without ``+ef``: only ``codec/step``.
        """
        return {key: torch.from_numpy(array) for key, array in self._codec.to_state().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Replace the sender's memory with a :meth:`state_dict` (of the same spec).

        The memory moves to the tensors' device on the next :meth:`compress`.

        Raises
        ------
        ValueError
            For a key that is not a codec state key, or a value of the wrong dtype or
            number of dimensions.
        TypeError
            For a value that is not a tensor or array.
        """
        arrays: dict[str, np.ndarray] = {}
        for key, value in state_dict.items():
            if key not in _STATE_KEYS and not key.startswith(_STATE_PREFIXES):
                raise ValueError(
                    f"unexpected key {key!r} in a codec state dict (keys are "
                    f"{', '.join(_STATE_KEYS)} and {', '.join(p + '*' for p in _STATE_PREFIXES)})"
                )
            if isinstance(value, torch.Tensor):
                arrays[key] = value.detach().numpy(force=True)
            elif isinstance(value, np.ndarray):
                arrays[key] = value
            else:
                raise TypeError(
                    f"codec state {key!r} must be a tensor or array, got {type(value).__name__}"
                )
        self._codec.load_state(arrays)

    # -- receiver --------------------------------------------------------------------

    def decompress(
        self,
        payload: bytes | bytearray | memoryview | np.ndarray,
        like: Like | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Check a frame of this codec's spec and return its tensors, dense.

        Parameters
        ----------
        payload : bytes-like or 1-d uint8 array
            A frame from :meth:`compress` of a codec with the same spec.
        like : mapping of str to torch.Tensor or to TensorSpec, optional
            What the frame must hold: the receiver's state dict or specs (only the
            floating-point entries count). Default: the codec's ``like``; one of the
            two is needed.
        device : torch.device or str, optional
            Where the tensors go. Default: each ``like`` tensor's device (CPU for specs).

        Returns
        -------
        dict of str to torch.Tensor
            The floating-point tensors, dense, in the ``like`` shapes and dtypes.

        Raises
        ------
        UnexpectedCodec
            If the frame was written by a codec of another spec.
        PayloadError
            For any other fault, as a subclass naming it: broken bytes
            (:class:`~fedsync.wire.TruncatedPayload`, ``ChecksumMismatch``, ...),
            :class:`UpdateMismatch` (names, shapes or dtypes that are not ``like``'s),
            :class:`CodecMismatch`, :class:`NonFiniteUpdate`.
        ValueError
            If neither ``like`` nor the codec's ``like`` is given (before the payload
            is read).
        """
        if like is not None:
            expected = tensor_specs(like)
        elif self._like is not None:
            expected = self._like
        else:
            raise ValueError(
                "decompress needs like= (the receiver's state dict or tensor specs), or a "
                "codec built with like="
            )
        devices: dict[str, torch.device] = {}
        if device is not None:
            target = torch.device(device)
        elif like is not None:
            devices = {
                name: item.device
                for name, item in like.items()
                if isinstance(item, torch.Tensor) and name in expected
            }
            target = next(iter(devices.values()), torch.device("cpu"))
        else:
            target = torch.device("cpu")
        update = self._codec.decode(payload, expected=expected, device=target, own_spec_only=True)
        out = {}
        for name, sparse in update.items():
            dense = sparse.to_dense()
            out[name] = dense.to(
                device=devices.get(name, dense.device), dtype=_TORCH_DTYPES[sparse.spec.dtype]
            )
        return out
