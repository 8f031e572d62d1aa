"""The compressor pipeline: sparsifiers, quantizers, error feedback, specs, registry.

Small objects with one job each, composed by a spec string or typed config::

    >>> from fedsync.compression import PipelineConfig
    >>> cfg = PipelineConfig.from_spec("dgc:0.001,sample=0.01+qsgd:16+ef:momentum=0.9")
    >>> cfg.with_density(0.01).with_bits(4).to_spec()
    'dgc:0.01+qsgd:7+ef:momentum=0.9'

Users normally go through :class:`fedsync.codecs.UpdateCodec`, which adds the wire
format, seeds, state export and statistics.
"""

from fedsync.compression import quantizers, rotations, sparsifiers
from fedsync.compression.base import Kept, Quantizer, Rotation, Sparsifier, target_count
from fedsync.compression.config import (
    BuildContext,
    QuantizerConfig,
    RotationConfig,
    SparsifierConfig,
    StageConfig,
)
from fedsync.compression.demo_memory import DeMoConfig, DeMoFeedback
from fedsync.compression.error_feedback import (
    ErrorFeedback,
    ErrorFeedbackConfig,
    ErrorFeedbackState,
)
from fedsync.compression.errors import (
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    SpecError,
    UnknownCodec,
    UpdateMismatch,
)
from fedsync.compression.pipeline import Compressed, Compressor, Pipeline, build_pipeline, flatten
from fedsync.compression.quantizers import (
    Bf16Config,
    Fp16Config,
    Fp32Config,
    QSGDConfig,
    SignConfig,
    TernaryConfig,
    UniformConfig,
)
from fedsync.compression.registry import REGISTRY, StageRegistry, register
from fedsync.compression.rotations import RandomizedHadamard, RHTConfig
from fedsync.compression.seeding import derive_seed, rng_for
from fedsync.compression.sparsifiers import (
    DCTConfig,
    DenseConfig,
    DGCConfig,
    MaskConfig,
    PowerSGDConfig,
    RandomKConfig,
    SIDCoConfig,
    TopKConfig,
    mask_digest,
)
from fedsync.compression.spec import PipelineConfig, format_spec, parse_spec

__all__ = [
    "REGISTRY",
    "Bf16Config",
    "BuildContext",
    "CodecMismatch",
    "Compressed",
    "Compressor",
    "DCTConfig",
    "DGCConfig",
    "DeMoConfig",
    "DeMoFeedback",
    "DenseConfig",
    "ErrorFeedback",
    "ErrorFeedbackConfig",
    "ErrorFeedbackState",
    "Fp16Config",
    "Fp32Config",
    "Kept",
    "MaskConfig",
    "NonFiniteInputError",
    "NonFiniteUpdate",
    "Pipeline",
    "PipelineConfig",
    "PowerSGDConfig",
    "QSGDConfig",
    "Quantizer",
    "QuantizerConfig",
    "RHTConfig",
    "RandomKConfig",
    "RandomizedHadamard",
    "Rotation",
    "RotationConfig",
    "SIDCoConfig",
    "SignConfig",
    "Sparsifier",
    "SparsifierConfig",
    "SpecError",
    "StageConfig",
    "StageRegistry",
    "TernaryConfig",
    "TopKConfig",
    "UniformConfig",
    "UnknownCodec",
    "UpdateMismatch",
    "build_pipeline",
    "derive_seed",
    "flatten",
    "format_spec",
    "mask_digest",
    "parse_spec",
    "quantizers",
    "register",
    "rng_for",
    "rotations",
    "sparsifiers",
    "target_count",
]
