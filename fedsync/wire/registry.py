"""The one-byte codes the frame uses for dtypes, schemes, index modes and codings.

Codes are part of the wire format: never renumber one; a new entry takes the next
free code (and old decoders reject it as :class:`~fedsync.wire.UnknownCode`).
Code 0 is left unused in the dtype and scheme tables so an all-zero table entry is
never valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = [
    "CODING_CODES",
    "CODING_NAMES",
    "DTYPE_CODES",
    "DTYPE_NAMES",
    "INDEX_CODINGS",
    "INDEX_MODE_CODES",
    "INDEX_MODE_NAMES",
    "INDEX_MODE_RULES",
    "SCHEME_CODES",
    "SCHEME_NAMES",
    "IndexModeRule",
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
        "binmean": 8,
    }
)
SCHEME_NAMES = _inverse(SCHEME_CODES)


@dataclass(frozen=True)
class IndexModeRule:
    """What one index mode puts in a frame, and the count it allows.

    Parameters
    ----------
    code : int
        The mode's code (the high nibble of a tensor entry's head byte, 0..15).
    positions : bool
        Whether explicit positions travel (an index section in one of
        :data:`INDEX_CODINGS`); otherwise the coding is ``"none"`` and no section.
    count : {"numel", "at_most_numel", "any"}
        ``"numel"``: one value per element, the count is implied and not carried;
        ``"at_most_numel"``: carried, at most the tensor's element count; ``"any"``:
        carried, bounded only by :attr:`FrameLimits.max_total_values` (values that
        are not one per position, e.g. the factors of a low-rank representation).
    """

    code: int
    positions: bool
    count: Literal["numel", "at_most_numel", "any"]


# The per-tensor representations a frame knows. A new one takes the next free code
# here and needs nothing else from the wire: the decoder applies its rule, the codec's
# pipeline gives the values their meaning.
INDEX_MODE_RULES: Mapping[str, IndexModeRule] = MappingProxyType(
    {
        "explicit": IndexModeRule(0, positions=True, count="at_most_numel"),
        "dense": IndexModeRule(1, positions=False, count="numel"),
        "mask": IndexModeRule(2, positions=False, count="at_most_numel"),
        # P (m x r) and Q (n x r): r * (m + n) values, checked against the shape by the
        # decoder (the rank follows from the count).
        "lowrank": IndexModeRule(3, positions=False, count="any"),
    }
)
INDEX_MODE_CODES: Mapping[str, int] = MappingProxyType(
    {name: rule.code for name, rule in INDEX_MODE_RULES.items()}
)
INDEX_MODE_NAMES = _inverse(INDEX_MODE_CODES)

# "none" is the only coding of the dense and mask modes (no positions travel); the
# others are the candidates of the explicit mode, in tie-break order.
CODING_CODES: Mapping[str, int] = MappingProxyType(
    {"none": 0, "dense": 1, "bitmap": 2, "elias_fano": 3, "rice": 4, "context": 5}
)
CODING_NAMES = _inverse(CODING_CODES)

INDEX_CODINGS: tuple[str, ...] = ("dense", "bitmap", "elias_fano", "rice", "context")
"""The codings an explicit index set may travel in; ties go to the earlier one."""
