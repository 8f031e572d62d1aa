"""SparseLoCo's pieces: per-block top-k, 2-bit bin means, decaying error feedback and
the mean over the replicas that selected each coordinate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedsync.aggregation import validate_update
from fedsync.aggregation.buffer import UpdateBuffer
from fedsync.codecs import UpdateCodec, tensor_specs
from fedsync.compression import SpecError, parse_spec
from fedsync.compression.config import BuildContext
from fedsync.compression.sparsifiers.chunked import block_shape
from fedsync.config import RunConfig, SettingsError
from fedsync.strategies import Strategy
from fedsync.updates import SparseTensor, TensorSpec, densify


def kept_positions(spec: str, x: torch.Tensor) -> torch.Tensor:
    config = parse_spec(spec).sparsifier
    assert config is not None
    sparsifier = config.build(BuildContext())
    tensor_spec = TensorSpec("t", tuple(x.shape))
    kept = sparsifier.select_for(tensor_spec, x.reshape(-1), 0)
    assert kept.positions is not None
    assert kept.positions.numel() == sparsifier.max_count(tensor_spec)
    return kept.positions


def test_every_block_keeps_its_own_largest_magnitudes() -> None:
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(0))
    positions = kept_positions("chunktopk:128", x)
    assert positions.numel() == 16 * 128  # 2 x 8 blocks of 64 x 64, 3.1 % kept
    assert bool((positions.diff() > 0).all())
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[positions] = True
    for r in range(0, 128, 64):
        for c in range(0, 512, 64):
            block = x[r : r + 64, c : c + 64].abs()
            chosen = mask.view(128, 512)[r : r + 64, c : c + 64]
            assert int(chosen.sum()) == 128
            assert float(block[chosen].min()) >= float(block[~chosen].max())


def test_blocks_follow_the_largest_divisors_and_small_ones_travel_whole() -> None:
    assert block_shape((65, 128), 64) == (65, 128, 13, 64)  # a 65-character embedding
    assert block_shape((384, 128), 64) == (384, 128, 64, 64)
    assert block_shape((128,), 64) == (1, 128, 1, 64)
    assert block_shape((67,), 64) == (1, 67, 1, 1)  # a prime: blocks of one value
    assert block_shape((), 64) == (1, 1, 1, 1)
    bias = torch.randn(128)
    assert kept_positions("chunktopk:128", bias).numel() == 128  # k covers the chunk


def test_ties_go_to_the_lower_position() -> None:
    # Two 2 x 2 blocks: the left one all ties (positions 0, 1, 4, 5), the right one
    # 1.0, 0.5, 0.0, 2.0 at positions 2, 3, 6, 7.
    x = torch.tensor([[1.0, -1.0, 1.0, 0.5], [1.0, 1.0, 0.0, 2.0]])
    assert kept_positions("chunktopk:2,block=2", x).tolist() == [0, 1, 2, 7]


def test_bin_means_are_the_means_of_the_values_in_each_bin() -> None:
    values = torch.randn(1000, generator=torch.Generator().manual_seed(1)) ** 3
    config = parse_spec("none+binmean:2").quantizer
    assert config is not None
    quantizer = config.build(BuildContext())
    q = quantizer.quantize(values, 0)
    host = values.double().numpy()
    centered = host - host.mean()
    step = 6.0 * np.sqrt((centered**2).sum() / (host.size - 1)) / 4
    codes = np.clip(np.rint(centered / step + 2), 0, 3)
    assert np.array_equal(np.asarray(q.codes), codes)
    table = [host[codes == b].mean() if (codes == b).any() else 0.0 for b in range(4)]
    np.testing.assert_allclose(np.asarray(q.params["table"]), table, rtol=1e-6)
    decoded = quantizer.dequantize(q)
    # The decoded values keep each bin's sum (up to float32 rounding of the means).
    for b in range(4):
        np.testing.assert_allclose(
            decoded.double().numpy()[codes == b].sum(), host[codes == b].sum(), rtol=1e-5
        )
    constant = quantizer.dequantize(quantizer.quantize(torch.full((5,), 0.25), 0))
    assert torch.equal(constant, torch.full((5,), 0.25))


@pytest.mark.parametrize("spec", ["none+binmean:9", "none+binmean:2,range=0", "chunktopk:0"])
def test_bad_stage_settings_are_refused(spec: str) -> None:
    with pytest.raises(SpecError):
        parse_spec(spec)


def test_the_buffer_divides_each_coordinate_by_the_weight_of_its_senders() -> None:
    spec = TensorSpec("w", (6,))
    specs = {"w": spec}
    sends = [
        ([0, 1, 2], [1.0, 2.0, 3.0], 1.0),
        ([1, 2, 4], [4.0, 5.0, 6.0], 1.0),
        ([2, 5], [7.0, 8.0], 0.5),
    ]
    buffer = UpdateBuffer(specs, capacity=3, normalization="selected")
    for positions, values, weight in sends:
        update = {"w": SparseTensor(spec, torch.tensor(positions), torch.tensor(values))}
        buffer.add(validate_update(update, specs), weight)
    got = buffer.take().update["w"]
    # By hand: slot 0 only the first sent (1.0); slot 1 the first two ((2 + 4) / 2);
    # slot 2 all three ((3 + 5 + 0.5 * 7) / 2.5); slot 3 nobody (0); slot 4 the second
    # (6.0); slot 5 the third (0.5 * 8 / 0.5).
    expected = torch.tensor([1.0, 3.0, 11.5 / 2.5, 0.0, 6.0, 8.0])
    torch.testing.assert_close(got, expected)


def test_a_sparseloco_round_is_the_selector_mean_of_what_the_sites_sent() -> None:
    g = torch.Generator().manual_seed(2)
    deltas = [
        {"w": torch.randn(8, 8, generator=g), "b": torch.randn(8, generator=g)} for _ in range(3)
    ]
    spec = "chunktopk:4,block=4+binmean:2+demo:0.95"
    specs = tensor_specs(deltas[0])
    buffer = UpdateBuffer(specs, capacity=3, normalization="selected")
    decoded = []
    for site, delta in enumerate(deltas):
        payload = UpdateCodec(spec, seed=site).encode(delta)
        update = UpdateCodec(spec).decode(payload, specs)
        decoded.append(update)
        buffer.add(validate_update(update, specs), 1.0)
    got = buffer.take().update
    for name, tensor_spec in specs.items():
        total = np.zeros(tensor_spec.numel)
        senders = np.zeros(tensor_spec.numel)
        for update in decoded:
            sparse = update[name]
            assert isinstance(sparse, SparseTensor)
            total[sparse.indices.numpy()] += sparse.values.double().numpy()
            senders[sparse.indices.numpy()] += 1
        hand = np.where(senders > 0, total / np.maximum(senders, 1), 0.0)
        np.testing.assert_allclose(got[name].reshape(-1).numpy(), hand, rtol=1e-6, atol=0)
        if name == "w":  # overlaps and gaps both occur
            assert (senders > 1).any() and (senders == 0).any()
    # Each site sent 4 of every 16 values of w (4 blocks of 4 x 4) and the whole bias.
    assert all(int(u["w"].nnz) == 16 and int(u["b"].nnz) == 8 for u in decoded)
    assert densify(decoded[0])["w"].shape == (8, 8)


def test_buffer_mean_overrides_the_strategys_and_is_checked() -> None:
    settings: dict[str, Any] = {"strategy": "diloco", "buffer-mean": "selected"}
    config = RunConfig.from_run_config(settings)
    strategy = Strategy.from_run_config(config)
    assert strategy.mean == "selected" and strategy.describe()["normalization"] == "selected"
    plain = RunConfig.from_run_config({"strategy": "teasq"})
    assert Strategy.from_run_config(plain).mean == "weight"
    with pytest.raises(SettingsError, match="buffer-mean"):
        RunConfig.from_run_config({"buffer-mean": "median"})
