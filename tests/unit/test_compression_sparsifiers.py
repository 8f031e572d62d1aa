"""Sparsifiers: what each keeps, on tensors of every size, and how it fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsync.compression import (
    BuildContext,
    NonFiniteInputError,
    SpecError,
    parse_spec,
    target_count,
)
from fedsync.compression.base import Sparsifier
from fedsync.compression.sparsifiers import DGC, SIDCo
from fedsync.compression.sparsifiers.sidco import fit_threshold
from fedsync.updates import TensorSpec


def sparsifier(spec: str, masks: dict[str, torch.Tensor] | None = None) -> Sparsifier:
    config = parse_spec(spec).sparsifier
    assert config is not None
    return config.build(BuildContext(masks=masks))


def data(seed: int, n: int, kind: str = "normal") -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = {
        "normal": lambda: rng.standard_normal(n),
        "heavy": lambda: rng.standard_t(2.0, n),
        "laplace": lambda: rng.laplace(size=n),
        "ties": lambda: rng.integers(-2, 3, n).astype(np.float64),
    }[kind]()
    return torch.from_numpy(x.astype(np.float32))


def reference_topk(x: torch.Tensor, k: int) -> np.ndarray:
    a = x.numpy()
    order = np.lexsort((np.arange(a.size), -np.abs(a)))
    return np.sort(order[:k])


def test_target_count_keeps_at_least_one_of_a_non_empty_tensor() -> None:
    assert target_count(0, 0.5) == 0
    assert target_count(1, 1e-9) == 1
    assert target_count(10, 0.01) == 1
    assert target_count(1000, 0.01) == 10
    assert target_count(10, 1.0) == 10


SPARSE = [
    "topk:{d}",
    "randomk:{d}",
    "dgc:{d}",
    "sidco:{d}",
    "sidco:{d},dist=gpd",
    "sidco:{d},dist=gamma-gpd",
    "mask:{d},seed=3",
]


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(SPARSE),
    st.sampled_from([0.001, 0.01, 0.1, 0.5, 1.0]),
    st.sampled_from([0, 1, 3, 100, 5000, 100_000]),
    st.sampled_from(["normal", "heavy", "ties"]),
    st.integers(0, 2**31),
)
def test_kept_positions_and_values(spec: str, d: float, n: int, kind: str, seed: int) -> None:
    sp = sparsifier(spec.format(d=d))
    x = data(seed, n, kind)
    kept = sp.select("t", x, seed)
    k = target_count(n, d)
    tspec = TensorSpec("t", (n,))
    assert kept.positions is not None
    pos = kept.positions.numpy()
    assert (np.diff(pos) > 0).all() and (pos.size == 0 or (pos[0] >= 0 and pos[-1] < n))
    assert torch.equal(kept.values, x[kept.positions])
    assert kept.values.dtype == torch.float32
    assert len(pos) <= sp.max_count(tspec)
    assert sp.index_mode(tspec) == kept.mode
    if n:
        assert len(pos) >= 1  # k >= 1 when numel > 0
    if spec.startswith(("topk", "randomk", "mask")):
        assert len(pos) == k
    if spec.startswith("topk"):
        np.testing.assert_array_equal(pos, reference_topk(x, k))
    if spec.startswith("dgc"):
        assert isinstance(sp, DGC)
        lo, hi = sp.bounds(k)
        assert lo <= len(pos) <= hi or len(pos) == k
        # Whatever DGC keeps is a top set: nothing left out is larger than what is in.
        if 0 < len(pos) < n:
            left = np.ones(n, bool)
            left[pos] = False
            assert x[torch.from_numpy(left)].abs().max() <= x[kept.positions].abs().min()
    if spec.startswith("mask"):
        assert kept.mode == "mask"
        np.testing.assert_array_equal(pos, sp.mask_positions(tspec))


def test_dgc_adapts_a_bad_sample_and_falls_back_to_exact() -> None:
    x = data(3, 400_000, "heavy")
    k = target_count(x.numel(), 0.01)
    sp = sparsifier("dgc:0.01,sample=0.001,lower=0.99,upper=1.01,iters=4")
    kept = sp.select("t", x, 0)
    assert k * 0.99 <= kept.values.numel() <= k * 1.01 or kept.values.numel() == k
    exact = sparsifier("dgc:0.01,lower=1,upper=1,iters=0").select("t", x, 0)
    assert exact.positions is not None
    np.testing.assert_array_equal(exact.positions.numpy(), reference_topk(x, k))


def test_dgc_on_a_mostly_zero_tensor_still_sends_k() -> None:
    x = torch.zeros(200_000)
    x[::1000] = 1.0  # 200 non-zeros, density asks for 2000
    kept = sparsifier("dgc:0.01").select("t", x, 0)
    assert kept.values.numel() == 2000 and float(kept.values.abs().sum()) == 200.0


@pytest.mark.parametrize("dist", ["exp", "gpd", "gamma-gpd"])
def test_sidco_lands_near_the_target_and_adapts_stages(dist: str) -> None:
    sp = sparsifier(f"sidco:0.01,dist={dist}")
    assert isinstance(sp, SIDCo)
    k = target_count(200_000, 0.01)
    counts = []
    for step in range(8):
        kept = sp.select("w", data(step, 200_000, "laplace"), step)
        counts.append(kept.values.numel())
    assert all(1 <= c <= 4 * k for c in counts)
    # After adapting, the count is within a factor 2 of the target.
    assert k / 2 <= counts[-1] <= 2 * k, counts
    assert "stages/w" in sp.state and 1 <= int(sp.state["stages/w"][0]) <= 4


def test_sidco_adds_stages_when_the_tail_is_heavier_than_the_fit() -> None:
    # Student-t magnitudes have a heavier tail than the exponential: one stage keeps
    # too many, so the adaptation adds a stage; Laplace data fit it and keep one.
    sp = sparsifier("sidco:0.01")
    assert isinstance(sp, SIDCo)
    sp.select("heavy", data(0, 200_000, "heavy"), 0)
    assert sp.stages_for("heavy") == 2
    for step in range(3):
        sp.select("laplace", data(step, 200_000, "laplace"), step)
    assert sp.stages_for("laplace") == 1


def test_sidco_falls_back_when_the_family_misfits_badly() -> None:
    # Gaussian magnitudes: a one-stage exponential fit keeps ~2% of k. Fitting all
    # entries (sample=1), the count guard sends the exact top-k instead of almost
    # nothing.
    x = data(0, 300_000, "normal")
    k = target_count(x.numel(), 0.01)
    kept = sparsifier("sidco:0.01,sample=1.0").select("w", x, 0)
    assert kept.positions is not None
    np.testing.assert_array_equal(kept.positions.numpy(), reference_topk(x, k))


def test_sidco_takes_the_sample_quantile_when_the_sample_contradicts_the_fit() -> None:
    # With a sample, the misfit shows on the sample before any pass over the tensor:
    # the threshold becomes the sample's own quantile, one pass, near k.
    x = data(0, 300_000, "normal")
    k = target_count(x.numel(), 0.01)
    sp = sparsifier("sidco:0.01")
    kept = sp.select("w", x, 0)
    assert kept.positions is not None
    count = kept.positions.numel()
    assert k / 2 <= count <= 2 * k and count != k
    mags = x.abs()
    unkept = torch.ones(x.numel(), dtype=torch.bool)
    unkept[kept.positions] = False
    assert float(mags[kept.positions].min()) > float(mags[unkept].max())


def test_sidco_sampled_moments_are_close_to_full_ones() -> None:
    # Laplace magnitudes fit the exponential. A 1 % sample of 1M is 10k magnitudes:
    # the mean is within ~1 %, the threshold (4.6 means) within ~5 %, so counts stay
    # within 15 % of the full fit's (which is within 10 % of k).
    x = data(1, 1_000_000, "laplace")
    k = target_count(x.numel(), 0.01)
    full = sparsifier("sidco:0.01,sample=1.0").select("w", x, 0).values.numel()
    sampled = [sparsifier("sidco:0.01").select("w", x, seed).values.numel() for seed in range(4)]
    assert abs(full - k) <= 0.1 * k
    assert all(abs(c - full) <= 0.15 * k for c in sampled), (full, sampled)


def test_fit_threshold_families() -> None:
    # Exponential magnitudes with mean 1: tail mass delta lies above ln(1/delta).
    assert fit_threshold("exp", 1.0, 1.0, 0.01) == pytest.approx(np.log(100))
    # GPD with var = mean**2 is the exponential (xi = 0).
    assert fit_threshold("gpd", 1.0, 1.0, 0.01) == pytest.approx(np.log(100))
    # Gamma with shape 1 is the exponential too.
    assert fit_threshold("gamma", 1.0, 1.0, 0.01) == pytest.approx(np.log(100))
    assert fit_threshold("gpd", 1.0, 0.0, 0.01) is None
    assert fit_threshold("exp", 0.0, 1.0, 0.01) is None


def test_randomk_is_seeded_per_tensor() -> None:
    sp = sparsifier("randomk:0.01")
    x = data(0, 10_000)
    a, b, c = sp.select("t", x, 1), sp.select("t", x, 1), sp.select("t", x, 2)
    assert torch.equal(a.positions, b.positions)  # type: ignore[arg-type]
    assert not torch.equal(a.positions, c.positions)  # type: ignore[arg-type]


def test_seeded_mask_is_fixed_across_calls_and_shared() -> None:
    a, b = sparsifier("mask:0.05,seed=9"), sparsifier("mask:0.05,seed=9")
    spec = TensorSpec("w", (40, 50))
    np.testing.assert_array_equal(a.mask_positions(spec), b.mask_positions(spec))
    other = sparsifier("mask:0.05,seed=10").mask_positions(spec)
    assert not np.array_equal(a.mask_positions(spec), other)
    x1, x2 = data(1, 2000), data(2, 2000)
    assert torch.equal(a.select("w", x1, 0).positions, a.select("w", x2, 5).positions)  # type: ignore[arg-type]


def test_explicit_masks() -> None:
    masks = {"w": torch.rand(30, 20) < 0.1}
    sp = sparsifier("mask", masks)
    kept = sp.select("w", data(0, 600), 0)
    assert kept.mode == "mask"
    np.testing.assert_array_equal(kept.positions.numpy(), np.flatnonzero(masks["w"].reshape(-1)))  # type: ignore[union-attr]
    # A tensor without a mask travels whole.
    assert sp.select("b", data(0, 20), 0).mode == "dense"
    assert sp.index_mode(TensorSpec("b", (20,))) == "dense"
    with pytest.raises(SpecError, match="need the shared masks"):
        sparsifier("mask")
    with pytest.raises(SpecError, match="digest"):
        sparsifier("mask:digest=0123456789abcdef", masks)


def test_dense_keeps_everything_without_positions() -> None:
    sp = sparsifier("none")
    x = data(0, 17)
    kept = sp.select("t", x, 0)
    assert kept.mode == "dense" and kept.positions is None and torch.equal(kept.values, x)


@pytest.mark.parametrize("spec", ["topk:0.01", "dgc:0.01", "sidco:0.01", "randomk:1.0", "none"])
def test_non_finite_values_that_would_be_sent_are_rejected(spec: str) -> None:
    from fedsync.compression import build_pipeline

    x = data(0, 100_000)
    x[4321] = float("nan")
    x[999] = float("inf")
    pipeline = build_pipeline(parse_spec(spec))
    with pytest.raises(NonFiniteInputError, match="NaN or Inf"):
        pipeline.compress(TensorSpec("t", (100_000,)), x, 0)
