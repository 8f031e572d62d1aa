"""Quantizers: how kept values become fixed-width codes (one module per method).

Every module of this folder is imported here: a new quantizer is its file alone.
"""

from fedsync.compression.quantizers.binmean import BinMean, BinMeanConfig
from fedsync.compression.quantizers.floats import (
    BF16,
    FP16,
    FP32,
    Bf16Config,
    Fp16Config,
    Fp32Config,
)
from fedsync.compression.quantizers.qsgd import QSGD, QSGDConfig
from fedsync.compression.quantizers.sign import Sign, SignConfig
from fedsync.compression.quantizers.ternary import Ternary, TernaryConfig
from fedsync.compression.quantizers.uniform import Uniform, UniformConfig
from fedsync.plugins import import_submodules

import_submodules(__name__, __path__)

__all__ = [
    "BF16",
    "FP16",
    "FP32",
    "QSGD",
    "Bf16Config",
    "BinMean",
    "BinMeanConfig",
    "Fp16Config",
    "Fp32Config",
    "QSGDConfig",
    "Sign",
    "SignConfig",
    "Ternary",
    "TernaryConfig",
    "Uniform",
    "UniformConfig",
]
