"""Sparsifiers: which entries of a tensor travel (one module per method).

Every module of this folder is imported here, so a new sparsifier is its file alone: a
config registered with ``@register()`` and the component it builds (docs/architecture.md,
"Adding a sparsifier").
"""

from fedsync.compression.sparsifiers.chunked import ChunkTopK, ChunkTopKConfig
from fedsync.compression.sparsifiers.dct import DCTConfig, DCTTopK
from fedsync.compression.sparsifiers.dense import Dense, DenseConfig
from fedsync.compression.sparsifiers.dgc import DGC, DGCConfig
from fedsync.compression.sparsifiers.mask import FixedMask, MaskConfig, mask_digest
from fedsync.compression.sparsifiers.powersgd import PowerSGD, PowerSGDConfig
from fedsync.compression.sparsifiers.randomk import RandomK, RandomKConfig
from fedsync.compression.sparsifiers.sidco import SIDCo, SIDCoConfig
from fedsync.compression.sparsifiers.topk import TopK, TopKConfig
from fedsync.plugins import import_submodules

import_submodules(__name__, __path__)

__all__ = [
    "DGC",
    "ChunkTopK",
    "ChunkTopKConfig",
    "DCTConfig",
    "DCTTopK",
    "DGCConfig",
    "Dense",
    "DenseConfig",
    "FixedMask",
    "MaskConfig",
    "PowerSGD",
    "PowerSGDConfig",
    "RandomK",
    "RandomKConfig",
    "SIDCo",
    "SIDCoConfig",
    "TopK",
    "TopKConfig",
    "mask_digest",
]
