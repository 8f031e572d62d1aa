"""Decode + scatter-add of sparse updates into a dense device buffer (Triton).

The server's K-update cache (:class:`fedsync.aggregation.buffer.UpdateBuffer`) adds
``weight * values`` of each arriving update at its positions. Per update the work is
``O(nnz)``: one thread per kept value loads its position, (optionally) decodes its
code, and updates one accumulator slot; the model size only enters when the
buffer is zeroed or read out, once per K updates.

Same numbers as the CPU: ``acc[i] + value * float32(weight)``, the product rounded,
then the sum (FMA fusion is off), which is what ``Tensor.index_add_(0, idx, v,
alpha=w)`` computes on the CPU. Positions within one update are unique (the
decoder checks it), so no two threads of a launch touch the same slot and no
atomics are needed; updates are applied one launch after another in arrival
order, so each slot sees its additions in the same order as on the CPU, and the
buffer is bit-identical.

The fused variant decodes uniform codes on the fly (``code * scale + min``, two
roundings, as :func:`fedsync.kernels.quantize.uniform_dequantize`), so the float values of
an update are never written out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fedsync.kernels.triton._runtime import launch_options

__all__ = ["scatter_add_", "scatter_add_uniform_"]

_BLOCK = 1024


@triton.jit
def _scatter_add(acc_ptr, idx_ptr, val_ptr, n, w, DENSE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if DENSE:  # noqa: SIM108 - a constexpr branch, resolved when the kernel compiles
        at = i
    else:
        at = tl.load(idx_ptr + i, mask=m, other=0)
    v = tl.load(val_ptr + i, mask=m, other=0.0)
    a = tl.load(acc_ptr + at, mask=m, other=0.0)
    tl.store(acc_ptr + at, a + v * w, mask=m)


@triton.jit
def _scatter_add_uniform(
    acc_ptr,
    idx_ptr,
    codes_ptr,
    mins_ptr,
    scales_ptr,
    n,
    chunk,
    w,
    DENSE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if DENSE:  # noqa: SIM108 - a constexpr branch, resolved when the kernel compiles
        at = i
    else:
        at = tl.load(idx_ptr + i, mask=m, other=0)
    c = i // chunk
    code = tl.load(codes_ptr + i, mask=m, other=0).to(tl.float32)
    v = code * tl.load(scales_ptr + c, mask=m, other=0.0) + tl.load(mins_ptr + c, mask=m, other=0.0)
    a = tl.load(acc_ptr + at, mask=m, other=0.0)
    tl.store(acc_ptr + at, a + v * w, mask=m)


def _check(acc: torch.Tensor, indices: torch.Tensor | None, n: int) -> None:
    if acc.dtype != torch.float32 or acc.dim() != 1 or not acc.is_contiguous():
        raise ValueError("the accumulator must be a 1-d contiguous float32 tensor")
    if indices is None and n != acc.numel():
        raise ValueError(f"a dense update needs {acc.numel()} values, got {n}")
    if indices is not None and indices.numel() != n:
        raise ValueError(f"{indices.numel()} positions for {n} values")


def scatter_add_(
    acc: torch.Tensor, indices: torch.Tensor | None, values: torch.Tensor, weight: float
) -> torch.Tensor:
    """``acc[indices] += values * float32(weight)`` in place; ``indices=None`` for a
    dense update. Positions must be unique and in range (the caller validated)."""
    n = values.numel()
    _check(acc, indices, n)
    if n:
        dense = indices is None
        _scatter_add[(triton.cdiv(n, _BLOCK),)](
            acc,
            values if dense else indices,
            values,
            n,
            float(weight),
            DENSE=dense,
            BLOCK=_BLOCK,
            **launch_options(),
        )
    return acc


def scatter_add_uniform_(
    acc: torch.Tensor,
    indices: torch.Tensor | None,
    codes: torch.Tensor,
    mins: torch.Tensor,
    scales: torch.Tensor,
    chunk: int,
    weight: float,
) -> torch.Tensor:
    """Decode uniform codes and scatter-add them, in one pass over the kept values."""
    n = codes.numel()
    _check(acc, indices, n)
    if n:
        dense = indices is None
        _scatter_add_uniform[(triton.cdiv(n, _BLOCK),)](
            acc,
            codes if dense else indices,
            codes,
            mins,
            scales,
            n,
            chunk,
            float(weight),
            DENSE=dense,
            BLOCK=_BLOCK,
            **launch_options(),
        )
    return acc
