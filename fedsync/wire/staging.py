"""A sender's device-resident sections, brought to the host in one copy per device.

A compressor whose kernels run on a device hands the encoder tensors still on that
device: positions, codes and per-chunk params (see :data:`fedsync.updates.Array`).
Here, before the frame is laid out, the codes are checked and bit-packed where they
live (the device backend's ``pack_bits``: Triton on CUDA, torch ops elsewhere; the
bytes of :func:`fedsync.kernels.bitpack.pack_bits`), every device section of every tensor is
concatenated into one byte buffer per device, and that buffer crosses to the host in
a single copy. Positions travel as int32 when the tensor has fewer than ``2**31``
elements (half the bytes); the host entropy-codes them (:mod:`.index_coding`: the
context coder is a sequential range coder with no device twin).

Tensors that are already on the host (the numba backend's numpy arrays) pass
through untouched, so a CPU sender writes the bytes it always wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedsync.kernels.dispatch import backend_for, byte_view
from fedsync.updates import Array, CompressedTensor, QuantizedValues
from fedsync.wire.layout import MAX_BITS

__all__ = ["Staged", "stage_tensors"]

_UNSIGNED = {torch.int8: 0xFF, torch.int16: 0xFFFF, torch.int32: 0xFFFFFFFF}
"""Signed storage a device may hold codes in, read as the unsigned bit pattern."""
_CODE_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@dataclass
class Staged:
    """One tensor ready for the encoder: host arrays only.

    Attributes
    ----------
    tensor : CompressedTensor
        The tensor with host positions and params; its codes are the input's (still
        on the device when ``packed`` is set: the encoder only reads their count).
    packed : numpy.ndarray or None
        The packed code stream, already checked, when the codes were on a device.
    """

    tensor: CompressedTensor
    packed: np.ndarray | None = None


def _checked_device_codes(codes: torch.Tensor, bits: int, label: str) -> None:
    """The encoder's code checks, run where the codes live (one scalar crosses)."""
    if not isinstance(bits, int | np.integer) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{label}: bits must be an int in 1..{MAX_BITS}, got {bits!r}")
    if codes.ndim != 1:
        raise ValueError(f"{label}: codes must be one-dimensional, got shape {tuple(codes.shape)}")
    if codes.dtype not in _CODE_DTYPES:
        raise ValueError(f"{label}: codes must be integers, got dtype {codes.dtype}")
    if codes.numel() == 0:
        return
    width = torch.iinfo(codes.dtype).bits
    if codes.dtype == torch.int64:
        low = int(codes.min())
        if low < 0:
            raise ValueError(f"{label}: codes must be non-negative, got {low}")
    if bits < width:
        wide = codes.to(torch.int64)
        mask = _UNSIGNED.get(codes.dtype)
        top = int((wide & mask).max() if mask is not None else wide.max())
        if top >> bits:
            raise ValueError(
                f"{label}: code {top} does not fit {bits} bits (expected < {1 << int(bits)})"
            )


@dataclass
class _Part:
    """Where one section sits in its device's buffer."""

    tensor: int
    kind: str  # "indices", "codes" or a param name
    dtype: np.dtype
    start: int
    stop: int


def stage_tensors(tensors: Sequence[CompressedTensor], labels: Sequence[str]) -> list[Staged]:
    """Bring every device-resident section of ``tensors`` to the host.

    Parameters
    ----------
    tensors : sequence of CompressedTensor
        The frame's tensors, in any mix of host arrays and device tensors.
    labels : sequence of str
        How error messages name each tensor.

    Returns
    -------
    list of Staged
        One per tensor, in order.

    Raises
    ------
    ValueError
        A device code that breaks the encoder's contract (see
        :func:`fedsync.wire.encode_frame`).
    """
    staged = [Staged(t) for t in tensors]
    buffers: dict[torch.device, list[torch.Tensor]] = {}
    parts: dict[torch.device, list[_Part]] = {}

    def add(device: torch.device, index: int, kind: str, data: torch.Tensor) -> None:
        chunks = buffers.setdefault(device, [])
        table = parts.setdefault(device, [])
        start = table[-1].stop if table else 0
        raw = byte_view(data)
        dtype = np.dtype(str(data.dtype).removeprefix("torch."))
        table.append(_Part(index, kind, dtype, start, start + raw.numel()))
        chunks.append(raw)

    for i, (tensor, label) in enumerate(zip(tensors, labels, strict=True)):
        values = tensor.values
        if isinstance(tensor.indices, torch.Tensor):
            index = tensor.indices.reshape(-1)
            if index.dtype.is_floating_point or index.dtype == torch.bool:
                raise ValueError(f"{label}: indices must be integers, got dtype {index.dtype}")
            small = tensor.spec.numel < 1 << 31 and index.dtype in (torch.int32, torch.int64)
            add(index.device, i, "indices", index.to(torch.int32) if small else index)
        for name, param in values.params.items():
            if isinstance(param, torch.Tensor):
                add(param.device, i, f"param:{name}", param.to(torch.float32))
        if isinstance(values.codes, torch.Tensor):
            codes = values.codes
            _checked_device_codes(codes, values.bits, label)
            add(codes.device, i, "codes", backend_for(codes).pack_bits(codes, int(values.bits)))

    for device, chunks in buffers.items():
        host = torch.cat(chunks).cpu().numpy()  # the one device-to-host copy
        for part in parts[device]:
            array = host[part.start : part.stop].view(part.dtype)
            entry = staged[part.tensor]
            if part.kind == "codes":
                entry.packed = array
            elif part.kind == "indices":
                entry.tensor = replace(entry.tensor, indices=array)
            else:
                name = part.kind.removeprefix("param:")
                params: dict[str, Array] = dict(entry.tensor.values.params)
                params[name] = array
                values = QuantizedValues(
                    entry.tensor.values.scheme,
                    entry.tensor.values.bits,
                    entry.tensor.values.codes,
                    params,
                )
                entry.tensor = replace(entry.tensor, values=values)
    return staged
