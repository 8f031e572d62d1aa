"""The codec users call: a model update to bytes and back.

:class:`UpdateCodec` glues the compressor pipeline (:mod:`fedsync.compression`) to the
wire format (:mod:`fedsync.wire`)::

    >>> import torch
    >>> from fedsync.codec import UpdateCodec, specs_of
    >>> update = {"w": torch.randn(100, 10), "b": torch.randn(10)}
    >>> codec = UpdateCodec("topk:0.1+uniform:8+ef", seed=0)
    >>> payload = codec.encode(update)                     # bytes for one Flower Array
    >>> sparse = codec.decode(payload, expected=specs_of(update))
    >>> sorted(sparse), sparse["w"].nnz
    (['b', 'w'], 100)

The sender's side is stateful (error-feedback residuals, SIDCo's stage counts,
PowerSGD's warm-start factors, a step counter that varies the seed per call); all of
it lives in one :class:`CodecState`,
exported as a plain ``dict[str, numpy.ndarray]`` (:meth:`UpdateCodec.to_state`) for
Flower's ``context.state``. The receiver's side is stateless: :meth:`UpdateCodec.decode`
rebuilds the pipeline from the codec description in the frame, so one server codec
decodes every client's spec, including the per-task densities and bit widths an
asynchronous server hands out (:meth:`UpdateCodec.with_density`,
:meth:`UpdateCodec.with_bits`). A receiver that knows which spec the sender was given
decodes with a codec of that spec and ``own_spec_only=True`` instead: a frame of any
other codec is refused on its header (:class:`UnexpectedCodec`), before a pipeline is
built or anything allocated for it. Nothing here imports Flower.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fedsync.compression.config import BuildContext
from fedsync.compression.error_feedback import ErrorFeedbackState
from fedsync.compression.errors import (
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    SpecError,
    UnknownCodec,
    UpdateMismatch,
)
from fedsync.compression.pipeline import Compressor, Pipeline, build_pipeline, flatten
from fedsync.compression.seeding import derive_seed
from fedsync.compression.sparsifiers.mask import MaskConfig, mask_digest
from fedsync.compression.spec import PipelineConfig, parse_spec
from fedsync.updates import CompressedTensor, SparseUpdate, TensorSpec
from fedsync.wire import (
    DEFAULT_LIMITS,
    FrameLimits,
    PayloadError,
    SchemaMismatch,
    UnexpectedCodec,
    decode_frame,
    encode_frame,
)
from fedsync.wire.schema import schema_digest

__all__ = [
    "CodecMismatch",
    "CodecState",
    "CompressionStats",
    "NonFiniteInputError",
    "NonFiniteUpdate",
    "PayloadError",
    "UnexpectedCodec",
    "UnknownCodec",
    "UpdateCodec",
    "UpdateMismatch",
    "array_to_payload",
    "payload_to_array",
    "specs_of",
]

FACTORS = "factors/"
"""Key prefix of the sparsifier's device memory (PowerSGD's ``Q``) in the state."""

_DECODER_CACHE = 32
"""Pipelines kept per codec string on the receiving side (masks are cached in them)."""


def specs_of(update: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """The :class:`TensorSpec` of every tensor of ``update`` (for ``decode(expected=)``)."""
    return {name: flatten(name, tensor)[0] for name, tensor in update.items()}


def payload_to_array(payload: bytes | bytearray | memoryview) -> np.ndarray:
    """The payload as a 1-d ``uint8`` array: one Flower ``ArrayRecord`` entry.

    A copy (writable, owns its memory), so the array outlives the bytes object.
    """
    return np.frombuffer(bytes(payload), dtype=np.uint8).copy()


def array_to_payload(array: np.ndarray) -> bytes:
    """The bytes of a 1-d ``uint8`` array made by :func:`payload_to_array`.

    Raises
    ------
    ValueError
        If the array is not one-dimensional ``uint8``.
    """
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError(
            f"a payload array must be 1-d uint8, got {array.dtype} with shape {array.shape}"
        )
    return array.tobytes()


@dataclass
class CodecState:
    """Everything the sending side remembers between encodes.

    Attributes
    ----------
    step : int
        Encodes so far; mixed into each call's seed so random choices (random-k,
        stochastic rounding) differ from round to round yet replay exactly.
    feedback : ErrorFeedbackState
        Error-feedback residuals and DGC velocities, by tensor.
    sparsifier : dict of str to numpy.ndarray
        Sparsifier memory (SIDCo's stage count per tensor).
    factors : dict of str to torch.Tensor
        Sparsifier memory that stays on the update's device: PowerSGD's warm-start
        ``Q`` (n x r, float32) per tensor.
    """

    # role: seeds
    step: int = 0
    # role: error feedback memory
    feedback: ErrorFeedbackState = field(default_factory=ErrorFeedbackState)
    # role: adaptive sparsifier memory
    sparsifier: dict[str, np.ndarray] = field(default_factory=dict)
    # role: low-rank warm-start memory
    factors: dict[str, torch.Tensor] = field(default_factory=dict)

    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``codec/step``, ``residual/*``, ``momentum/*``, ``sparsifier/*``,
        ``factors/*`` (2-d float32)."""
        out = {"codec/step": np.array([self.step], dtype=np.int64)}
        out.update(self.feedback.to_state())
        out.update({f"sparsifier/{k}": np.array(v, copy=True) for k, v in self.sparsifier.items()})
        out.update(
            {
                f"{FACTORS}{k}": v.detach().to("cpu", torch.float32).numpy().copy()
                for k, v in self.factors.items()
            }
        )
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> CodecState:
        """Rebuild from :meth:`to_state` output."""
        step = state.get("codec/step")
        factors = {}
        for key, array in state.items():
            if key.startswith(FACTORS):
                values = np.asarray(array)
                if values.dtype != np.float32 or values.ndim != 2:
                    raise ValueError(
                        f"codec state {key!r} must be a 2-d float32 array, "
                        f"got {values.dtype} with shape {values.shape}"
                    )
                factors[key[len(FACTORS) :]] = torch.from_numpy(values.copy())
        return cls(
            step=int(np.asarray(step).reshape(-1)[0]) if step is not None else 0,
            feedback=ErrorFeedbackState.from_state(state),
            sparsifier={
                k[len("sparsifier/") :]: np.array(v, copy=True)
                for k, v in state.items()
                if k.startswith("sparsifier/")
            },
            factors=factors,
        )

    def load(self, other: CodecState) -> None:
        """Take ``other``'s contents in place (codecs sharing this state see them)."""
        self.step = other.step
        self.feedback.load(other.feedback)
        self.sparsifier.clear()
        self.sparsifier.update(other.sparsifier)
        self.factors.clear()
        self.factors.update(other.factors)


@dataclass(frozen=True)
class CompressionStats:
    """Numbers of the last encoded update, plus running totals.

    Attributes
    ----------
    payload_bytes : int
        Length of the last payload (the real frame, header and checksum included).
    dense_bytes : int
        What the same tensors take as dense float32: ``4 * numel``.
    numel, nnz, tensors : int
        Elements, values sent, tensors of the last update.
    updates, total_payload_bytes : int
        Updates encoded by this codec (and its ``with_*`` copies) and their bytes.
    """

    payload_bytes: int = 0
    dense_bytes: int = 0
    numel: int = 0
    nnz: int = 0
    tensors: int = 0
    updates: int = 0
    total_payload_bytes: int = 0

    @property
    def density(self) -> float:
        """Values sent per element."""
        return self.nnz / self.numel if self.numel else 0.0

    @property
    def compression_ratio(self) -> float:
        """Dense float32 bytes per payload byte."""
        return self.dense_bytes / self.payload_bytes if self.payload_bytes else 0.0

    @property
    def bits_per_value(self) -> float:
        """Payload bits per value sent (positions, codes, params and framing)."""
        return 8 * self.payload_bytes / self.nnz if self.nnz else 0.0

    def as_dict(self) -> dict[str, float]:
        """Every number by name, for metrics records."""
        return {
            "payload_bytes": self.payload_bytes,
            "dense_bytes": self.dense_bytes,
            "numel": self.numel,
            "nnz": self.nnz,
            "tensors": self.tensors,
            "density": self.density,
            "compression_ratio": self.compression_ratio,
            "bits_per_value": self.bits_per_value,
            "updates": self.updates,
            "total_payload_bytes": self.total_payload_bytes,
        }


@dataclass
class _StatsBox:
    """The latest stats, shared by a codec and its ``with_*`` copies."""

    stats: CompressionStats = field(default_factory=CompressionStats)


def _complete(config: PipelineConfig, masks: Mapping[str, torch.Tensor] | None) -> PipelineConfig:
    """Fill in what the spec leaves to the codec: the digest of explicit masks."""
    sparsifier = config.sparsifier
    if isinstance(sparsifier, MaskConfig) and sparsifier.density is None:
        if masks is None:
            raise SpecError("mask: without a density the codec needs masks= (explicit masks)")
        if sparsifier.digest is None:
            return replace(config, sparsifier=replace(sparsifier, digest=mask_digest(masks)))
    return config


class UpdateCodec:
    """Compress + frame a model update, and validate + decode one.

    Parameters
    ----------
    spec : str or PipelineConfig
        The pipeline, e.g. ``"topk:0.01+uniform:8+ef"`` (grammar in
        :mod:`fedsync.compression.spec`) or the equivalent typed config.
    seed : int
        Base seed of the stochastic parts; with the step counter it fixes every random
        choice, so the same spec, input, seed and step give the same bytes.
    masks : mapping of str to torch.Tensor, optional
        Shared explicit pruning masks for ``mask`` without a density (both sides).
    limits : FrameLimits
        Bounds the decoder enforces before allocating anything.
    state : CodecState, optional
        Sender memory to share (``with_density`` copies pass theirs); fresh by default.
    specs : mapping of str to TensorSpec, optional
        The model's tensors (:func:`specs_of`), known to both ends. The sender then
        writes frames that carry only an 8-byte digest of them instead of the tensor
        table (see :mod:`fedsync.wire.schema`), and :meth:`decode` checks frames
        against them when it is given no ``expected``.
    schema : {"digest", "table"}, optional
        Override what :meth:`encode` writes: ``"table"`` for a receiver that does not
        know the model. Default: ``"digest"`` when ``specs`` is given, else ``"table"``.

    Raises
    ------
    SpecError
        For an invalid spec or config.

    Notes
    -----
    Not thread-safe: a codec carries mutable sender state. Decoding is pure, so a
    server may decode on several threads with one codec per thread.
    """

    def __init__(
        self,
        spec: str | PipelineConfig = "none+fp32",
        *,
        seed: int = 0,
        masks: Mapping[str, torch.Tensor] | None = None,
        limits: FrameLimits = DEFAULT_LIMITS,
        state: CodecState | None = None,
        specs: Mapping[str, TensorSpec] | None = None,
        schema: str | None = None,
    ) -> None:
        if isinstance(spec, str):
            config = parse_spec(spec)
        elif isinstance(spec, PipelineConfig):
            config = spec
        else:
            raise SpecError(f"spec must be a str or PipelineConfig, got {type(spec).__name__}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(limits, FrameLimits):
            raise ValueError(f"limits must be a FrameLimits, got {type(limits).__name__}")
        if schema is None:
            schema = "digest" if specs is not None else "table"
        if schema not in ("digest", "table") or (schema == "digest" and specs is None):
            raise ValueError(
                f"schema must be 'table', or 'digest' with specs= given; got {schema!r}"
            )
        self._specs = dict(specs) if specs is not None else None
        self._schema = schema
        self._digest = schema_digest(self._specs) if self._specs is not None else None
        self._config = _complete(config, masks)
        self._spec = self._config.to_spec()
        self._masks = masks
        self._context = BuildContext(masks=masks)
        self.seed = seed
        self.limits = limits
        self.state = state if state is not None else CodecState()
        self._pipeline = build_pipeline(self._config, self._context)
        # The sparsifier's memory is the codec state's dict (shared with copies).
        self._pipeline.sparsifier.state = self.state.sparsifier
        self._pipeline.sparsifier.memory = self.state.factors
        self._compressor: Compressor = self._pipeline
        if self._config.feedback is not None:
            self._compressor = self._config.feedback.wrap(self._pipeline, self.state.feedback)
        self._decoders: OrderedDict[str, Pipeline] = OrderedDict()
        self._stats = _StatsBox()

    # -- description ---------------------------------------------------------------------

    @property
    def spec(self) -> str:
        """The canonical spec (what every frame this codec writes carries)."""
        return self._spec

    @property
    def config(self) -> PipelineConfig:
        """The typed config."""
        return self._config

    def __repr__(self) -> str:
        return f"UpdateCodec({self._spec!r}, seed={self.seed})"

    def with_density(self, density: float) -> UpdateCodec:
        """A codec keeping a fraction ``density`` per tensor, sharing this one's state.

        Raises
        ------
        SpecError
            If the sparsifier has no density (``none``, explicit masks) or it is out
            of range.
        """
        return self._derived(self._config.with_density(density))

    def with_bits(self, bits: int) -> UpdateCodec:
        """A codec with ``bits`` bits per value (uniform, qsgd), sharing this one's state.

        Raises
        ------
        SpecError
            If the quantizer's width is fixed or ``bits`` is out of range.
        """
        return self._derived(self._config.with_bits(bits))

    def _derived(self, config: PipelineConfig) -> UpdateCodec:
        twin = UpdateCodec(
            config,
            seed=self.seed,
            masks=self._masks,
            limits=self.limits,
            state=self.state,
            specs=self._specs,
            schema=self._schema,
        )
        twin._stats = self._stats  # running totals count the copies' encodes too
        return twin

    # -- sender --------------------------------------------------------------------------

    def encode(self, update: Mapping[str, torch.Tensor], *, seed: int | None = None) -> bytes:
        """Compress ``update`` (name -> tensor, any float dtype and device) to a frame.

        Parameters
        ----------
        update : mapping of str to torch.Tensor
            The model update; order is kept in the frame.
        seed : int, optional
            This call's seed; default derives one from the codec's seed and the step.

        Raises
        ------
        NonFiniteInputError
            If a value that would be sent is NaN or Inf.
        ValueError, TypeError
            For non-float tensors, a model that changed under error feedback, or an
            update whose tensors are not the codec's ``specs``.
        """
        call_seed = seed if seed is not None else derive_seed(self.seed, "step", self.state.step)
        tensors: list[CompressedTensor] = []
        numel = 0
        for name, tensor in update.items():
            spec, flat = flatten(name, tensor)
            tensors.append(self._compressor.compress(spec, flat, call_seed).tensor)
            numel += spec.numel
        if self._digest is not None and schema_digest([t.spec for t in tensors]) != self._digest:
            raise ValueError(
                "the update's tensors (names, shapes, dtypes) are not the codec's specs="
            )
        # A rotating codec's frame carries its seed even with no tensors to carry it.
        frame_seed = self._pipeline.frame_seed(call_seed)
        payload = encode_frame(self._spec, tensors, schema=self._schema, seed=frame_seed)
        self.state.step += 1
        totals = self._stats.stats
        self._stats.stats = CompressionStats(
            payload_bytes=len(payload),
            dense_bytes=4 * numel,
            numel=numel,
            nnz=sum(len(t.values) for t in tensors),
            tensors=len(tensors),
            updates=totals.updates + 1,
            total_payload_bytes=totals.total_payload_bytes + len(payload),
        )
        return payload

    def compression_stats(self) -> CompressionStats:
        """Numbers of the last encode and running totals (see :class:`CompressionStats`)."""
        return self._stats.stats

    def to_state(self) -> dict[str, np.ndarray]:
        """The sender state as plain arrays (for Flower's ``context.state``)."""
        return self.state.to_state()

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`to_state` output (in place: ``with_*`` copies see it too)."""
        self.state.load(CodecState.from_state(state))

    # -- receiver ------------------------------------------------------------------------

    def _decoder(self, codec: str) -> Pipeline:
        pipeline = self._decoders.get(codec)
        if pipeline is not None:
            self._decoders.move_to_end(codec)
            return pipeline
        try:
            config = parse_spec(codec)
            pipeline = build_pipeline(config, self._context)
        except SpecError as exc:
            raise UnknownCodec(str(exc), field="codec", got=codec) from exc
        self._decoders[codec] = pipeline
        if len(self._decoders) > _DECODER_CACHE:
            self._decoders.popitem(last=False)
        return pipeline

    def _check_header(self, codec: str, seed: int | None) -> None:
        """The frame-level rules of a frame's codec, on its header: the codec is one
        this receiver can build, and its frames carry a seed exactly when it rotates
        (whatever the tensor count)."""
        self._decoder(codec).check_frame_seed(seed)

    def decode(
        self,
        payload: bytes | bytearray | memoryview | np.ndarray,
        expected: Mapping[str, TensorSpec] | None = None,
        *,
        device: torch.device | str = "cpu",
        own_spec_only: bool = False,
    ) -> SparseUpdate:
        """Validate and decode a frame into a sparse update (never densified).

        The codec description and the frame seed are checked on the header, before
        the schema and the table: :class:`UnknownCodec` for a codec this receiver
        cannot build, :class:`CodecMismatch` for a rotating codec's frame without a
        seed or a seed in another codec's frame, with or without tensors.

        Parameters
        ----------
        payload : bytes-like or uint8 array
            A frame from :meth:`encode` (of any codec spec, unless ``own_spec_only``).
        expected : mapping of str to TensorSpec, optional
            The model's tensors (see :func:`specs_of`); default: the codec's
            ``specs``. When known, the frame must hold exactly these names with these
            shapes and dtypes; a frame that carries only its schema digest needs
            them (:class:`~fedsync.wire.SchemaRequired` otherwise).
        device : torch.device or str
            Where the decoded indices and values go.
        own_spec_only : bool
            Accept only frames that name this codec's own :attr:`spec` (the one the
            sender was assigned): a frame of any other codec raises
            :class:`UnexpectedCodec` as soon as its header is read, before its schema,
            its table or a pipeline for it. Default: any codec.

        Raises
        ------
        PayloadError
            Any fault, as a subclass naming it: the wire's errors for a broken frame,
            :class:`UnexpectedCodec` (``own_spec_only``: another codec's frame),
            :class:`UnknownCodec`, :class:`CodecMismatch`, :class:`UpdateMismatch`
            (the frame's schema is not ``expected``), :class:`NonFiniteUpdate` for a
            well-formed frame that is still wrong; :class:`~fedsync.wire.SchemaRequired`
            for a digest-only frame with no specs to resolve it.
        """
        if expected is None:
            expected = self._specs
        try:
            codec, tensors = decode_frame(
                payload,
                limits=self.limits,
                expected=expected,
                expected_codec=self._spec if own_spec_only else None,
                check_header=self._check_header,
            )
        except SchemaMismatch as exc:
            raise UpdateMismatch(
                exc.problem, field=exc.field, tensor=exc.tensor, expected=exc.expected, got=exc.got
            ) from exc
        pipeline = self._decoder(codec)
        return pipeline.decompress_update(tensors, device)
