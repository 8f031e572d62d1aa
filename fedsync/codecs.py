"""fedsync's codec: a model update to bytes and back, and everything its state holds.

One module, two doors onto the same machinery:

* :class:`Codec` is the codec as a library, for users who move updates themselves
  (their own Flower messages, ``torch.distributed``, files). It compresses a
  ``{name: tensor}`` mapping (a model's state dict, an update, gradients) into one
  self-checking frame and decompresses a frame back into dense tensors, checked
  against the tensors the receiver expects (``docs/codecs.md``)::

      >>> import torch
      >>> from fedsync.codecs import Codec
      >>> update = {"w": torch.randn(100, 10), "b": torch.randn(10)}
      >>> sender, receiver = Codec("topk:0.1+uniform:8+ef"), Codec("topk:0.1+uniform:8+ef")
      >>> dense = receiver.decompress(sender.compress(update), like=update)
      >>> sorted(dense), dense["w"].shape
      (['b', 'w'], torch.Size([100, 10]))

* :class:`UpdateCodec` is what fedsync's engine, ClientApp and DDP hook use (and
  :attr:`Codec.update_codec`): it glues the compressor pipeline
  (:mod:`fedsync.compression`) to the wire format (:mod:`fedsync.wire`), decodes into
  sparse updates the server aggregates without densifying, and hands out per-task
  densities and bit widths (:meth:`UpdateCodec.with_density`,
  :meth:`UpdateCodec.with_bits`)::

      >>> from fedsync.codecs import UpdateCodec, tensor_specs
      >>> codec = UpdateCodec("topk:0.1+uniform:8+ef", seed=0)
      >>> payload = codec.encode(update)                     # bytes for one Flower Array
      >>> sparse = codec.decode(payload, expected=tensor_specs(update))
      >>> sorted(sparse), sparse["w"].nnz
      (['b', 'w'], 100)

:class:`Codec`'s rules, the same on both ends:

* **Only floating-point tensors are compressed** (float32, float16, bfloat16, float64).
  Other entries of a state dict (BatchNorm's ``num_batches_tracked``, integer buffers,
  boolean masks) are skipped by :meth:`Codec.compress` and by the ``like=`` of
  :meth:`Codec.decompress`, which returns the floating-point tensors only: merge them
  into the model with ``model.load_state_dict(out, strict=False)``, or send the others
  your own way (:func:`float_tensors` names what is sent).
* **The receiver uses the sender's spec.** :meth:`Codec.decompress` accepts only frames
  written by a codec of its own spec: a frame of another codec raises
  :class:`UnexpectedCodec`, read off the frame's header before anything is allocated.
  Any other fault of the bytes (truncated, corrupt, another model's tensors, NaN)
  raises a :class:`PayloadError` subclass that names it; nothing else.
* **Tensors stay on their device.** A CUDA update is compressed on the GPU (fedsync's
  Triton kernels; the frame's sections come to the host once), and decompressed tensors
  land on the device of the ``like=`` tensors (or ``device=``).
* **The sender is stateful** (error-feedback residuals, a step counter that varies the
  seed of stochastic stages): :meth:`Codec.state_dict` / :meth:`Codec.load_state_dict`
  carry it between processes as CPU tensors (``torch.save``-able); a fresh codec of the
  same spec and seed that loads it writes the same bytes as the original would have.

The sender's side is stateful (error-feedback residuals, SIDCo's stage counts,
PowerSGD's warm-start factors, a step counter that varies the seed per call); all of
it lives in one :class:`CodecState`, exported as a plain ``dict[str, numpy.ndarray]``
(:meth:`UpdateCodec.to_state`) for Flower's ``context.state``. The keys of that dict
are this module's: :data:`STEP_KEY` and the prefixes :data:`STATE_PREFIXES`
(:func:`is_state_key`, :func:`state_step`, :func:`tensor_memory` read them). The
receiver's side is stateless: :meth:`UpdateCodec.decode` rebuilds the pipeline from the
codec description in the frame, so one server codec decodes every client's spec. A
receiver that knows which spec the sender was given decodes with a codec of that spec
and ``own_spec_only=True`` instead (what :meth:`Codec.decompress` always does): a frame
of any other codec is refused on its header (:class:`UnexpectedCodec`), before a
pipeline is built or anything allocated for it.

The spec grammar is in ``docs/compression.md`` and :mod:`fedsync.compression.spec`;
:func:`codec_names` lists the stage names. Nothing here imports Flower.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

import numpy as np
import torch

from fedsync.compression.config import STAGE_ORDER, BuildContext
from fedsync.compression.error_feedback import ErrorFeedbackState
from fedsync.compression.errors import (
    CodecMismatch,
    NonFiniteInputError,
    NonFiniteUpdate,
    SpecError,
    UnknownCodec,
    UpdateMismatch,
)
from fedsync.compression.pipeline import (
    DTYPE_NAMES,
    Compressor,
    Pipeline,
    build_pipeline,
    flatten,
)
from fedsync.compression.registry import REGISTRY
from fedsync.compression.seeding import derive_seed
from fedsync.compression.sparsifiers.mask import MaskConfig, mask_digest
from fedsync.compression.spec import PipelineConfig, parse_spec
from fedsync.updates import CompressedTensor, SparseUpdate, TensorSpec, tensor_specs
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
    "FACTORS",
    "MOMENTUM",
    "RESIDUAL",
    "SPARSIFIER",
    "STATE_PREFIXES",
    "STEP_KEY",
    "TENSOR_MEMORY",
    "Codec",
    "CodecMismatch",
    "CodecState",
    "CompressionStats",
    "NonFiniteInputError",
    "NonFiniteUpdate",
    "PayloadError",
    "SpecError",
    "TensorSpec",
    "UnexpectedCodec",
    "UnknownCodec",
    "UpdateCodec",
    "UpdateMismatch",
    "array_to_payload",
    "codec_names",
    "float_tensors",
    "is_state_key",
    "payload_to_array",
    "state_step",
    "tensor_memory",
    "tensor_specs",
]

# --- the codec state's layout: the one place its keys are written -------------------------

STEP_KEY: Final = "codec/step"
"""State key of the encodes so far (int64, one value)."""
RESIDUAL: Final = "residual/"
"""Key prefix of error feedback's residuals (flat float32, one value per element)."""
MOMENTUM: Final = "momentum/"
"""Key prefix of DGC's velocities (flat float32, one value per element)."""
SPARSIFIER: Final = "sparsifier/"
"""Key prefix of the sparsifier's host memory (SIDCo's stage counts)."""
FACTORS: Final = "factors/"
"""Key prefix of the sparsifier's device memory (PowerSGD's ``Q``, 2-d float32)."""
STATE_PREFIXES: Final = (RESIDUAL, MOMENTUM, SPARSIFIER, FACTORS)
"""Every key of a codec state but :data:`STEP_KEY` starts with one of these."""
TENSOR_MEMORY: Final = (RESIDUAL, MOMENTUM)
"""The prefixes whose arrays hold one value per element of the tensor they name."""


def is_state_key(key: str) -> bool:
    """Whether ``key`` is a key of a codec state (:meth:`UpdateCodec.to_state`)."""
    return key == STEP_KEY or key.startswith(STATE_PREFIXES)


def state_step(state: Mapping[str, np.ndarray]) -> int:
    """The encodes a codec state has counted (0 when it holds no step)."""
    step = state.get(STEP_KEY)
    return int(np.asarray(step).reshape(-1)[0]) if step is not None else 0


def tensor_memory(state: Mapping[str, np.ndarray]) -> Iterator[tuple[str, str, np.ndarray]]:
    """``(prefix, tensor name, array)`` of each per-tensor entry of a codec state (the
    residuals and velocities, :data:`TENSOR_MEMORY`; the key is ``prefix + name``), in
    the state's order."""
    for key, array in state.items():
        for prefix in TENSOR_MEMORY:
            if key.startswith(prefix):
                yield prefix, key[len(prefix) :], array
                break


_DECODER_CACHE = 32
"""Pipelines kept per codec string on the receiving side (masks are cached in them)."""

Like: TypeAlias = Mapping[str, torch.Tensor] | Mapping[str, TensorSpec]
"""What a receiver expects: a state dict (or any name -> tensor mapping) of the model,
or the :class:`TensorSpec` of each tensor (:func:`tensor_specs`)."""

_TORCH_DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}


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
        """Plain arrays: :data:`STEP_KEY`, then ``residual/*``, ``momentum/*`` (flat
        float32), ``sparsifier/*``, ``factors/*`` (2-d float32)."""
        feedback = self.feedback
        out = {STEP_KEY: np.array([self.step], dtype=np.int64)}
        out.update(
            {
                RESIDUAL + k: v.detach().to("cpu").numpy().copy()
                for k, v in feedback.residuals.items()
            }
        )
        out.update(
            {MOMENTUM + k: v.detach().to("cpu").numpy().copy() for k, v in feedback.momenta.items()}
        )
        out.update({SPARSIFIER + k: np.array(v, copy=True) for k, v in self.sparsifier.items()})
        out.update(
            {
                FACTORS + k: v.detach().to("cpu", torch.float32).numpy().copy()
                for k, v in self.factors.items()
            }
        )
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> CodecState:
        """Rebuild from :meth:`to_state` output; keys of no prefix of the layout are
        ignored.

        Raises
        ------
        ValueError
            For a residual or velocity that is not a 1-d float32 array, or factors that
            are not a 2-d float32 array.
        """
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
        step = state_step(state)
        feedback = ErrorFeedbackState()
        tables = {RESIDUAL: feedback.residuals, MOMENTUM: feedback.momenta}
        for prefix, name, array in tensor_memory(state):
            values = np.asarray(array)
            if values.dtype != np.float32 or values.ndim != 1:
                raise ValueError(
                    f"error-feedback state {prefix + name!r} must be a 1-d float32 array, "
                    f"got {values.dtype} with shape {values.shape}"
                )
            tables[prefix][name] = torch.from_numpy(values.copy())
        return cls(
            step=step,
            feedback=feedback,
            sparsifier={
                k[len(SPARSIFIER) :]: np.array(v, copy=True)
                for k, v in state.items()
                if k.startswith(SPARSIFIER)
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
        The model's tensors (:func:`tensor_specs`), known to both ends. The sender then
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
            The model's tensors (see :func:`tensor_specs`); default: the codec's
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


# --- the codec as a library: state dicts in, dense tensors out ------------------------------


def _compressible(tensor: torch.Tensor) -> bool:
    return tensor.dtype in DTYPE_NAMES


def float_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of ``tensors`` a :class:`Codec` compresses: the floating-point ones.

    Parameters
    ----------
    tensors : mapping of str to torch.Tensor
        A state dict or update.

    Returns
    -------
    dict of str to torch.Tensor
        The float32, float16, bfloat16 and float64 entries, in order (the tensors
        themselves, not copies). Integer, boolean and complex entries are left out.

    Raises
    ------
    TypeError
        If an entry is not a tensor.
    """
    out = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"entry {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if _compressible(tensor):
            out[name] = tensor
    return out


def _expected(like: Like) -> dict[str, TensorSpec]:
    """What a frame must hold for ``like``: the specs (:func:`tensor_specs`) of its
    floating-point entries, tensors and specs alike (the rule of :func:`float_tensors`).

    Raises
    ------
    TypeError
        If an entry is neither a tensor nor a :class:`TensorSpec`.
    ValueError
        If a spec's name differs from its key.
    """
    return {name: spec for name, spec in tensor_specs(like).items() if spec.dtype in _TORCH_DTYPES}


def codec_names() -> dict[str, list[str]]:
    """The stage names a spec may use, by kind, in spec order.

    Returns
    -------
    dict of str to list of str
        ``{"sparsifier": [...], "rotation": [...], "quantizer": [...], "feedback":
        [...]}``, each sorted (aliases included). A spec is
        ``sparsifier[+rotation][+quantizer][+feedback]``, each stage ``name[:args]``
        (grammar: :mod:`fedsync.compression.spec`).
    """
    return {kind: REGISTRY.names(kind) for kind in STAGE_ORDER}


class Codec:
    """Compress a state dict to bytes, decompress bytes to dense tensors.

    Parameters
    ----------
    spec : str or PipelineConfig
        The pipeline, e.g. ``"topk:0.1+uniform:8+ef"`` (see :func:`codec_names` and
        ``docs/compression.md``). Sender and receiver use the same spec.
    seed : int
        Base seed of the stochastic stages (random-k, stochastic rounding); with the
        step counter in the codec's state it fixes every random choice, so the same
        spec, seed, state and input give the same bytes. Give each sender its own.
    like : mapping of str to torch.Tensor or to TensorSpec, optional
        The model, known to both ends. Frames then carry an 8-byte digest of its
        tensors' names, shapes and dtypes instead of a tensor table, and
        :meth:`decompress` checks against it when called without ``like=``. Both ends
        must then pass it (a receiver without it cannot resolve the digest).
    masks : mapping of str to torch.Tensor, optional
        Shared pruning masks, for a ``mask`` sparsifier without a density (both ends).
    limits : FrameLimits
        Bounds the decoder enforces before allocating anything.

    Raises
    ------
    SpecError
        For an invalid spec.
    ValueError
        For a seed that is not an int or limits that are not :class:`FrameLimits`.

    Notes
    -----
    Not thread-safe (the sender's state is mutable); decompressing is pure.
    """

    def __init__(
        self,
        spec: str | PipelineConfig = "topk:0.1+uniform:8+ef",
        *,
        seed: int = 0,
        like: Like | None = None,
        masks: Mapping[str, torch.Tensor] | None = None,
        limits: FrameLimits = DEFAULT_LIMITS,
    ) -> None:
        self._like = _expected(like) if like is not None else None
        self._codec = UpdateCodec(spec, seed=seed, masks=masks, limits=limits, specs=self._like)

    @property
    def spec(self) -> str:
        """The canonical spec: what every frame of this codec names."""
        return self._codec.spec

    @property
    def update_codec(self) -> UpdateCodec:
        """The :class:`UpdateCodec` underneath (sparse decoding, stats)."""
        return self._codec

    def __repr__(self) -> str:
        return f"Codec({self.spec!r}, seed={self._codec.seed})"

    # -- sender ----------------------------------------------------------------------

    def compress(self, tensors: Mapping[str, torch.Tensor]) -> bytes:
        """Compress the floating-point tensors of ``tensors`` into one frame.

        Parameters
        ----------
        tensors : mapping of str to torch.Tensor
            A state dict, an update or gradients, on any device. Non-float entries are
            skipped (:func:`float_tensors`); their order is kept.

        Returns
        -------
        bytes
            The frame. With error feedback, what it leaves out is remembered and added
            to the next call's tensors (:meth:`state_dict` carries it).

        Raises
        ------
        NonFiniteInputError
            If a value that would be sent is NaN or Inf.
        ValueError
            If the tensors differ from the codec's ``like`` or, under error feedback,
            from the previous call's (reset with a fresh codec).
        """
        return self._codec.encode(float_tensors(tensors))

    def compression_stats(self) -> CompressionStats:
        """Bytes, values sent and ratios of the last :meth:`compress` (and totals)."""
        return self._codec.compression_stats()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The sender's memory, as CPU tensors (copies), for ``torch.save``.

        Keys: those of :meth:`UpdateCodec.to_state` (:data:`STEP_KEY`, the calls so
        far, then the error-feedback residuals and velocities, SIDCo's stage counts and
        PowerSGD's warm start under :data:`STATE_PREFIXES`). Empty memory for specs
        without ``+ef``: only :data:`STEP_KEY`.
        """
        return {key: torch.from_numpy(array) for key, array in self._codec.to_state().items()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Replace the sender's memory with a :meth:`state_dict` (of the same spec).

        The memory moves to the tensors' device on the next :meth:`compress`.

        Raises
        ------
        ValueError
            For a key that is not a codec state key, or a value of the wrong dtype or
            number of dimensions.
        TypeError
            For a value that is not a tensor or array.
        """
        arrays: dict[str, np.ndarray] = {}
        for key, value in state_dict.items():
            if not is_state_key(key):
                raise ValueError(
                    f"unexpected key {key!r} in a codec state dict (keys are "
                    f"{STEP_KEY} and {', '.join(p + '*' for p in STATE_PREFIXES)})"
                )
            if isinstance(value, torch.Tensor):
                arrays[key] = value.detach().numpy(force=True)
            elif isinstance(value, np.ndarray):
                arrays[key] = value
            else:
                raise TypeError(
                    f"codec state {key!r} must be a tensor or array, got {type(value).__name__}"
                )
        self._codec.load_state(arrays)

    # -- receiver --------------------------------------------------------------------

    def decompress(
        self,
        payload: bytes | bytearray | memoryview | np.ndarray,
        like: Like | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Check a frame of this codec's spec and return its tensors, dense.

        Parameters
        ----------
        payload : bytes-like or 1-d uint8 array
            A frame from :meth:`compress` of a codec with the same spec.
        like : mapping of str to torch.Tensor or to TensorSpec, optional
            What the frame must hold: the receiver's state dict or specs (only the
            floating-point entries count). Default: the codec's ``like``; one of the
            two is needed.
        device : torch.device or str, optional
            Where the tensors go. Default: each ``like`` tensor's device (CPU for specs).

        Returns
        -------
        dict of str to torch.Tensor
            The floating-point tensors, dense, in the ``like`` shapes and dtypes.

        Raises
        ------
        UnexpectedCodec
            If the frame was written by a codec of another spec.
        PayloadError
            For any other fault, as a subclass naming it: broken bytes
            (:class:`~fedsync.wire.TruncatedPayload`, ``ChecksumMismatch``, ...),
            :class:`UpdateMismatch` (names, shapes or dtypes that are not ``like``'s),
            :class:`CodecMismatch`, :class:`NonFiniteUpdate`.
        ValueError
            If neither ``like`` nor the codec's ``like`` is given (before the payload
            is read).
        """
        if like is not None:
            expected = _expected(like)
        elif self._like is not None:
            expected = self._like
        else:
            raise ValueError(
                "decompress needs like= (the receiver's state dict or tensor specs), or a "
                "codec built with like="
            )
        devices: dict[str, torch.device] = {}
        if device is not None:
            target = torch.device(device)
        elif like is not None:
            devices = {
                name: item.device
                for name, item in like.items()
                if isinstance(item, torch.Tensor) and name in expected
            }
            target = next(iter(devices.values()), torch.device("cpu"))
        else:
            target = torch.device("cpu")
        update = self._codec.decode(payload, expected=expected, device=target, own_spec_only=True)
        out = {}
        for name, sparse in update.items():
            dense = sparse.to_dense()
            out[name] = dense.to(
                device=devices.get(name, dense.device), dtype=_TORCH_DTYPES[sparse.spec.dtype]
            )
        return out
