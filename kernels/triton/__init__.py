"""Triton kernels for the compressors, and the switch that puts them to work.

Importing this package never needs Triton or CUDA, and does not import Triton:
:data:`AVAILABLE` says whether it is installed; :func:`install` registers
:class:`~fedsync.kernels.triton.backend.TritonBackend` for ``"cuda"`` tensors in
:mod:`fedsync.kernels.dispatch` when Triton and a CUDA device are both present, so the same
pipeline object runs these kernels for CUDA tensors and the numba/torch kernels for
CPU tensors::

    from fedsync.kernels import triton as tk
    tk.install()                 # no-op (returns False) without Triton or CUDA

The CPU twins these kernels are checked against live in :mod:`kernels` (this package
imports them, never the reverse): :mod:`fedsync.kernels.philox` (the counter-based generator
of ``tl.randint``), :mod:`fedsync.kernels.ordered_sums` (float64 sums in one fixed order,
whose device twin is :mod:`.reduce`) and the stochastic and sign quantizers of
:mod:`fedsync.kernels.quantize`.

Kernel modules (:mod:`.select`, :mod:`.quantize`, :mod:`.reduce`, :mod:`.pack`,
:mod:`.scatter`, :mod:`.backend`) import Triton and are imported on demand. Under
``TRITON_INTERPRET=1`` they run on CPU tensors (that is how the tests check them).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import torch

from fedsync.kernels.triton._runtime import HAVE_TRITON, TRITON_ERROR, interpreting, runs_on

if TYPE_CHECKING:
    from fedsync.kernels.triton.backend import TritonBackend

__all__ = [
    "AVAILABLE",
    "TRITON_ERROR",
    "get_backend",
    "install",
    "interpreting",
    "runs_on",
    "scatter_add_",
]

AVAILABLE = HAVE_TRITON
"""Whether Triton is installed (its kernels can then run on CUDA, or interpreted)."""

_BACKEND: TritonBackend | None = None


def get_backend() -> TritonBackend:
    """The process's :class:`~fedsync.kernels.triton.backend.TritonBackend` (created once).

    Raises
    ------
    RuntimeError
        If Triton is not importable.
    """
    global _BACKEND
    if not HAVE_TRITON:
        raise RuntimeError(f"triton is not available: {TRITON_ERROR}")
    if _BACKEND is None:
        from fedsync.kernels.triton.backend import TritonBackend

        _BACKEND = TritonBackend()
    return _BACKEND


def install(*, force: bool = False) -> bool:
    """Serve CUDA tensors with the Triton kernels; return whether it did.

    Does nothing without Triton, or without a CUDA device unless ``force`` (tests
    install it to check the dispatch path, then put the previous backend back), or
    when the environment sets ``FEDSYNC_TRITON=0``.
    """
    if os.environ.get("FEDSYNC_TRITON", "1") == "0":
        return False  # the user opted out: CUDA tensors keep the torch backend
    if not HAVE_TRITON or not (force or torch.cuda.is_available()):
        return False
    from fedsync.kernels.dispatch import register_backend

    try:
        triton_backend = get_backend()  # the first import of Triton happens here
    except Exception as exc:  # a broken install: keep the torch backend, say why
        warnings.warn(f"Triton kernels unavailable, using torch: {exc}", stacklevel=2)
        return False
    register_backend("cuda", triton_backend)
    return True


def scatter_add_(
    acc: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, weight: float
) -> torch.Tensor:
    """``acc[indices] += values * float32(weight)`` in place; positions unique.

    The server buffer's scatter-add: the Triton kernel for CUDA tensors when Triton is
    installed, ``Tensor.index_add_`` otherwise. Both round the product and then the
    sum, so the accumulator has the same bits either way.
    """
    if acc.device.type == "cuda" and HAVE_TRITON:
        from fedsync.kernels.triton.scatter import scatter_add_ as kernel

        return kernel(acc, indices, values, weight)
    return acc.index_add_(0, indices, values, alpha=weight)
