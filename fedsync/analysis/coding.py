"""What each way of sending a tensor's positions costs on a real support.

The sparse codings are the wire format's own (:mod:`fedsync.wire.index_coding`): each
section is built with the encoder fedsync sends and its length read back, plus the
parameter byte and length varint the frame adds (:attr:`IndexPlan.frame_bits`). Next
to them:

* ``coo_int32`` -- positions as plain little-endian int32, ``4 * nnz`` bytes (the
  bytes of the array, as a COO format without compression would send them);
* ``dense`` -- no positions at all, but a value for every element: the
  ``numel - nnz`` zeros cost ``value_bits`` each, charged here as the index cost;
* ``entropy`` -- ``nnz * H(rho) / rho`` bits, the bound for a random support.
"""

from __future__ import annotations

import numpy as np

from fedsync.analysis.metrics import check_support, entropy_bits_per_nnz
from fedsync.wire.index_coding import encode_indices, index_candidates

__all__ = ["SPARSE_CODINGS", "index_costs"]

SPARSE_CODINGS = ("bitmap", "elias_fano", "rice", "context", "coo_int32")
"""The position codings compared, besides ``dense`` (in the report's order)."""


def index_costs(
    support: np.ndarray,
    numel: int,
    *,
    shape: tuple[int, ...] | None = None,
    value_bits: int = 32,
) -> dict[str, float]:
    """Bits each coding spends on the positions of ``support`` (one tensor's update).

    Parameters
    ----------
    support : numpy.ndarray
        Sorted unique flat positions.
    numel : int
        Elements of the tensor.
    shape : tuple of int, optional
        The tensor's shape (the context coder's rows).
    value_bits : int
        Bits of one value on the wire: what ``dense`` pays for every zero it sends.

    Returns
    -------
    dict of str to float
        ``bitmap``, ``elias_fano``, ``rice``, ``context`` (absent where the format
        cannot use it: an empty or full support, or a tensor over its size limit),
        ``coo_int32``, ``dense`` and ``entropy``, each in bits, for this support.
    """
    arr = check_support(support, numel)
    nnz = int(arr.size)
    out: dict[str, float] = {}
    for plan in index_candidates(arr, numel, shape=shape, context="always"):
        if plan.coding == "dense":
            continue
        section = encode_indices(arr, numel, plan)
        if len(section) != plan.nbytes:  # the size model and the encoder must agree
            raise RuntimeError(
                f"{plan.coding}: encoder wrote {len(section)} bytes, the plan said {plan.nbytes}"
            )
        out[plan.coding] = float(plan.frame_bits)
    out["coo_int32"] = 8.0 * len(arr.astype("<i4").tobytes())
    out["dense"] = float(value_bits * (numel - nnz))
    out["entropy"] = nnz * entropy_bits_per_nnz(nnz, numel)
    return out
