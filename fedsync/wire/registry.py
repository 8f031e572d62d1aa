"""The one-byte codes the frame uses for dtypes, schemes, index modes and codings.

Codes are part of the wire format: never renumber one; a new entry takes the next
free code (and old decoders reject it as :class:`~fedsync.wire.UnknownCode`).
Code 0 is left unused in the dtype and scheme tables so an all-zero table entry is
never valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "CODING_CODES",
    "CODING_NAMES",
    "DTYPE_CODES",
    "DTYPE_NAMES",
    "INDEX_CODINGS",
    "INDEX_MODE_CODES",
    "INDEX_MODE_NAMES",
    "SCHEME_CODES",
    "SCHEME_NAMES",
]


def _inverse(table: Mapping[str, int]) -> Mapping[int, str]:
    return MappingProxyType({code: name for name, code in table.items()})


DTYPE_CODES: Mapping[str, int] = MappingProxyType(
    {"float32": 1, "float16": 2, "bfloat16": 3, "float64": 4}
)
DTYPE_NAMES = _inverse(DTYPE_CODES)

SCHEME_CODES: Mapping[str, int] = MappingProxyType(
    {
        "fp32": 1,
        "fp16": 2,
        "bf16": 3,
        "uniform": 4,
        "qsgd": 5,
        "sign": 6,
        "ternary": 7,
    }
)
SCHEME_NAMES = _inverse(SCHEME_CODES)

INDEX_MODE_CODES: Mapping[str, int] = MappingProxyType(
    {"explicit": 0, "dense": 1, "mask": 2, "lowrank": 3}
)
INDEX_MODE_NAMES = _inverse(INDEX_MODE_CODES)

# "none" is the only coding of the dense, mask and lowrank modes (no positions travel); the
# other four are the candidates of the explicit mode, in tie-break order.
CODING_CODES: Mapping[str, int] = MappingProxyType(
    {"none": 0, "dense": 1, "bitmap": 2, "elias_fano": 3, "rice": 4}
)
CODING_NAMES = _inverse(CODING_CODES)

INDEX_CODINGS: tuple[str, ...] = ("dense", "bitmap", "elias_fano", "rice")
"""The codings an explicit index set may travel in; ties go to the earlier one."""
