"""The DCT top-k stage and DeMo's decoupled momentum, through the real frame codec."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.compression import (
    CodecMismatch,
    DCTConfig,
    DeMoConfig,
    NonFiniteUpdate,
    PipelineConfig,
    SpecError,
    UnknownCodec,
)
from fedsync.compression.sparsifiers import dct
from fedsync.compression.sparsifiers.dct import (
    MATRIX_CACHE_BYTES,
    MAX_CHUNK,
    DCTMatrixCache,
    chunk_counts,
    dct_matrix,
)
from fedsync.updates import CompressedTensor, QuantizedValues, TensorSpec
from fedsync.wire import PayloadError, decode_frame, encode_frame


def _reference(x: np.ndarray, chunk: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Kept positions and the receiver's tensor, computed independently (scipy, float64)."""
    n = x.size
    coeffs = np.zeros(n)
    kept = []
    for start in range(0, n, chunk):
        block = x[start : start + chunk].astype(np.float64)
        c = scipy.fft.dct(block, type=2, norm="ortho")
        coeffs[start : start + block.size] = c
        order = np.argsort(-np.abs(c), kind="stable")[: min(k, block.size)]
        kept.extend(start + order)
    kept_arr = np.sort(np.array(kept, dtype=np.int64))
    masked = np.zeros(n)
    masked[kept_arr] = coeffs[kept_arr]
    out = np.zeros(n)
    for start in range(0, n, chunk):
        out[start : start + chunk] = scipy.fft.idct(
            masked[start : start + chunk], type=2, norm="ortho"
        )
    return kept_arr, out


def test_dct_matrix_is_orthonormal_and_matches_scipy() -> None:
    for n in (2, 7, 64):
        d = dct_matrix(n).double()
        assert torch.allclose(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-6)
        x = np.random.default_rng(n).standard_normal(n)
        ours = (d @ torch.from_numpy(x)).numpy()
        assert np.allclose(ours, scipy.fft.dct(x, type=2, norm="ortho"), atol=1e-5)


def test_dct_matrix_is_built_exactly_as_in_one_float64_product() -> None:
    """Built a block of rows at a time, each entry is still the one float64 formula
    rounded once: the same bytes on every machine, whatever the block size."""
    for n in (1, 3, 255, 256, 300, 513):
        freq = np.arange(n, dtype=np.float64)[:, None]
        pos = np.arange(n, dtype=np.float64)[None, :]
        want = np.cos(np.pi * (2.0 * pos + 1.0) * freq / (2.0 * n)) * np.sqrt(2.0 / n)
        want[0, :] /= np.sqrt(2.0)
        got = DCTMatrixCache().get(n)
        assert torch.equal(got, torch.from_numpy(want.astype(np.float32))), n


def test_matrix_cache_is_bounded_in_bytes_and_evicts_the_least_recently_used() -> None:
    size = {n: 4 * n * n for n in (64, 48, 32, 40)}
    cache = DCTMatrixCache(max_bytes=size[64] + size[48] + size[32])
    a, _, _ = cache.get(64), cache.get(48), cache.get(32)
    assert cache.nbytes == size[64] + size[48] + size[32] and len(cache) == 3
    assert cache.get(64) is a  # a hit, and now the most recently used
    cache.get(40)  # no room: 48, the least recently used, makes way
    assert cache.nbytes == size[64] + size[32] + size[40] and len(cache) == 3
    assert cache.get(64) is a
    cache.get(48)  # 32, then 40 make way; 64 was used last
    assert cache.nbytes == size[64] + size[48] <= cache.max_bytes and len(cache) == 2
    assert cache.get(64) is a
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


def test_matrix_cache_checks_the_size_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(n: int) -> torch.Tensor:
        raise AssertionError(f"built a {n} x {n} matrix")

    monkeypatch.setattr(dct, "_build_matrix", refuse)
    cache = DCTMatrixCache()
    for n in (0, -1, MAX_CHUNK + 1, 1 << 20, True, 2.0):
        with pytest.raises(ValueError, match=f"in \\[1, {MAX_CHUNK}\\]"):
            cache.get(n)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        dct_matrix(MAX_CHUNK + 1)
    assert len(cache) == 0


def test_a_matrix_larger_than_the_budget_is_returned_not_kept() -> None:
    small = DCTMatrixCache(max_bytes=4 * 16 * 16)
    small.get(16)
    big = small.get(17)
    assert big.shape == (17, 17) and small.nbytes == 4 * 16 * 16 and len(small) == 1
    # the shared cache holds the largest matrix a spec may name and a shorter one, no more
    assert dct.MATRICES.max_bytes == MATRIX_CACHE_BYTES == 8 * MAX_CHUNK * MAX_CHUNK == 128 << 20


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(1, 700),
    chunk=st.integers(2, 96),
    k_frac=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_round_trip_matches_an_independent_dct(
    numel: int, chunk: int, k_frac: float, seed: int
) -> None:
    k = max(1, min(chunk, round(k_frac * chunk)))
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal(numel).astype(np.float32))
    codec = UpdateCodec(f"dct:{k},chunk={chunk}+fp32")
    payload = codec.encode({"w": x})
    _, tensors = decode_frame(payload)
    kept, expected = _reference(x.numpy(), chunk, k)
    assert tensors[0].indices is not None
    # Positions: k per chunk (fewer in a short tail), the largest magnitudes.
    assert len(tensors[0].indices) == chunk_counts(numel, chunk, k)[2]
    ties_possible = len(np.unique(np.abs(x.numpy()))) < numel
    if not ties_possible:
        overlap = np.intersect1d(kept, tensors[0].indices).size / kept.size
        assert overlap > 0.95  # float32 vs float64 may reorder near-equal magnitudes
    decoded = codec.decode(payload, expected=tensor_specs({"w": x}))["w"].to_dense()
    got_energy = float(((decoded.double() - x.double()) ** 2).sum())
    ref_energy = float(((expected - x.numpy().astype(np.float64)) ** 2).sum())
    # Parseval: the error is exactly the energy of the dropped coefficients.
    assert got_energy == pytest.approx(ref_energy, rel=1e-3, abs=1e-6)
    if k == chunk:
        assert torch.allclose(decoded, x, atol=1e-5)


@pytest.mark.parametrize("quant", ["fp32", "fp16", "uniform:8", "qsgd:16"])
def test_sender_and_receiver_agree_through_quantizers(quant: str) -> None:
    update = {"conv": torch.randn(8, 3, 5, 5), "fc": torch.randn(10, 33), "b": torch.randn(10)}
    codec = UpdateCodec(f"dct:4,chunk=32+{quant}+demo:0.9", seed=3)
    old = {n: torch.zeros(t.numel()) for n, t in update.items()}
    for _ in range(3):
        payload = codec.encode(update)
        decoded = codec.decode(payload, expected=tensor_specs(update))
        for name, tensor in update.items():
            memory = codec.state.feedback.residuals[name]
            # m_new = beta * m_old + x - sent, with sent what the receiver decodes
            sent = 0.9 * old[name] + tensor.reshape(-1) - memory
            assert torch.allclose(decoded[name].to_dense().reshape(-1), sent, atol=1e-4)
            old[name] = memory.clone()


def test_demo_with_every_coefficient_sends_everything() -> None:
    x = torch.randn(1000)
    codec = UpdateCodec("dct:16,chunk=16+fp32+demo:0.5")
    decoded = codec.decode(codec.encode({"w": x}))["w"].to_dense()
    assert torch.allclose(decoded, x, atol=1e-5)
    assert float(codec.state.feedback.residuals["w"].abs().max()) < 1e-5


def test_demo_momentum_survives_state_export() -> None:
    codec = UpdateCodec("dct:2,chunk=16+fp32+demo:0.99", seed=1)
    codec.encode({"w": torch.randn(100)})
    twin = UpdateCodec("dct:2,chunk=16+fp32+demo:0.99", seed=1)
    twin.load_state(codec.to_state())
    x = torch.randn(100)
    assert codec.encode({"w": x}) == twin.encode({"w": x})


def test_spec_grammar_and_canonical_form() -> None:
    cfg = PipelineConfig.from_spec("dct:chunk=64,k=8+fp32+demo:beta=0.999")
    assert cfg.to_spec() == "dct:8+fp32+demo:0.999"
    assert PipelineConfig.from_spec(cfg.to_spec()) == cfg
    assert PipelineConfig.from_spec("dct:4,chunk=128+uniform:4+demo:0.9").to_spec() == (
        "dct:4,chunk=128+uniform:4+demo:0.9"
    )
    assert isinstance(cfg.sparsifier, DCTConfig) and isinstance(cfg.feedback, DeMoConfig)
    assert PipelineConfig.from_spec("dct:8+fp32+ef").to_spec() == "dct:8+fp32+ef"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("dct:100,chunk=64", ["k", "chunk=64", "100"]),
        ("dct:0", ["k"]),
        ("dct:4,chunk=1", ["chunk"]),
        ("dct:4,chunk=5000", ["chunk"]),
        ("dct:4.5", ["k", "int"]),
        ("dct:4+fp32+demo:1.0", ["beta"]),
        ("dct:4+fp32+demo:-0.1", ["beta"]),
        ("dct:4,size=3", ["unknown key", "chunk"]),
    ],
)
def test_bad_specs_say_why(spec: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        PipelineConfig.from_spec(spec)
    for word in words:
        assert word in str(info.value)


def _frame(codec: str, indices: np.ndarray, values: np.ndarray, numel: int) -> bytes:
    q = QuantizedValues("fp32", 32, values.astype(np.float32).view(np.uint32))
    tensor = CompressedTensor(TensorSpec("layer.w", (numel,)), "explicit", indices, q)
    return encode_frame(codec, [tensor])


def test_decoder_rejects_too_many_coefficients_in_one_chunk() -> None:
    # 3 positions in chunk 0 under k=2 (the total, 4, passes the count check).
    payload = _frame("dct:2,chunk=8+fp32", np.array([0, 1, 2, 8]), np.ones(4), 16)
    with pytest.raises(CodecMismatch) as info:
        UpdateCodec().decode(payload)
    assert info.value.field == "indices" and "layer.w" in str(info.value)


def test_decoder_rejects_a_wrong_count_and_nan() -> None:
    payload = _frame("dct:1,chunk=8+fp32", np.arange(3) * 5, np.ones(3), 16)
    with pytest.raises(CodecMismatch) as info:
        UpdateCodec().decode(payload)
    assert info.value.field == "value count" and "layer.w" in str(info.value)
    # Fewer than k per chunk: a tiny frame must not make the receiver build a big tensor.
    payload = _frame("dct:1,chunk=8+fp32", np.array([3]), np.ones(1), 1 << 20)
    with pytest.raises(CodecMismatch) as few:
        UpdateCodec().decode(payload)
    assert few.value.field == "value count"
    payload = _frame(
        "dct:2,chunk=8+fp32", np.array([0, 1, 8, 9]), np.array([1.0, 0, 2, np.nan]), 16
    )
    with pytest.raises(NonFiniteUpdate) as nan:
        UpdateCodec().decode(payload)
    assert "layer.w" in str(nan.value)
    payload = _frame("dct:200,chunk=8+fp32", np.array([0]), np.ones(1), 16)
    with pytest.raises(UnknownCodec) as bad:
        UpdateCodec().decode(payload)
    assert bad.value.field == "codec"


def test_inverse_overflow_is_a_payload_error() -> None:
    big = np.full(2, 3e38)
    payload = _frame("dct:2,chunk=2+fp32", np.array([0, 1]), big, 2)
    with pytest.raises(PayloadError):
        UpdateCodec().decode(payload)
