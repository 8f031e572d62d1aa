"""The seeded initial model is the same bits in every process that builds it.

A shared downlink (``downlink-kind = "shared"``) starts every device from version 0 of
the global model without sending it: the device builds it from the model's factory and
the run's seed, and checks the digest the task carries. These tests build every
bundled model in fresh processes with one and with two torch threads, and in this
process, and compare digests; on the CPU only (this machine has no GPU: CPU against
CUDA is untested).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedsync.config import RunConfig
from fedsync.data import load_dataset
from fedsync.models import build_model
from fedsync.models.initial import seeded_model, seeded_state, state_digest
from fedsync.recipe import model_for, model_state

ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
MODELS = {  # name -> (input shape, classes): every bundled model
    "mlp": ((64,), 10),
    "mlp-wide": ((784,), 10),
    "cnn": ((1, 28, 28), 10),
    "char-lstm": ((80,), 64),
    "char-lstm-small": ((80,), 64),
    "char-gpt": ((32,), 65),
    "char-gpt-5m": ((32,), 65),
    "logreg": ((60,), 10),
}

SCRIPT = """
import json, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
from fedsync.models import build_model
from fedsync.models.initial import seeded_state, state_digest
models = json.loads(sys.argv[2])
seed = int(sys.argv[3])
out = {"threads": torch.get_num_threads(), "scoped": {}, "global": {}}
for name, (shape, classes) in models.items():
    out["scoped"][name] = state_digest(
        seeded_state(lambda: build_model(name, classes, shape), seed)
    )
    torch.manual_seed(seed)  # how fedsync.recipe.model_for seeds: the global generator
    model = build_model(name, classes, shape)
    state = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    out["global"][name] = state_digest(state)
print(json.dumps(out))
"""


def digests_in_fresh_process(threads: int) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(threads), json.dumps(MODELS), str(SEED)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["threads"] == threads
    return result


def built_here(name: str, seed: int = SEED) -> str:
    shape, classes = MODELS[name]
    return state_digest(seeded_state(lambda: build_model(name, classes, shape), seed))


def test_the_initial_model_is_bit_identical_across_thread_counts_and_processes() -> None:
    one, two = digests_in_fresh_process(1), digests_in_fresh_process(2)
    here = {name: built_here(name) for name in MODELS}
    assert one["scoped"] == two["scoped"] == here
    # seeding the global generator (fedsync's app: fedsync.recipe.model_for) builds the same
    assert one["global"] == two["global"] == here


def test_the_apps_initial_model_is_the_seeded_one() -> None:
    # What fedsync's ServerApp sends as initial_arrays and each ClientApp builds fresh.
    settings = RunConfig.of(dataset="digits", seed=SEED).training
    splits = load_dataset("digits", None, seed=SEED)
    built = seeded_state(
        lambda: build_model("auto", splits.num_classes, splits.input_shape, dataset="digits"),
        SEED,
    )
    assert state_digest(model_state(model_for(settings))) == state_digest(built)


def test_the_build_leaves_the_callers_rng_threads_and_dtype_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.manual_seed(7)
    dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)  # a caller's setting the build ignores
        model = seeded_model(lambda: build_model("mlp", 10, (64,)), SEED)
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(dtype)
    assert torch.equal(torch.rand(3), expected)  # the caller's generator did not move
    assert torch.get_num_threads() == threads
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert state_digest(model_state(model)) == state_digest(
        seeded_state(lambda: build_model("mlp", 10, (64,)), SEED)
    )


def test_the_digest_sees_every_bit_name_and_dtype() -> None:
    state = seeded_state(lambda: build_model("logreg", 10, (60,)), SEED)
    digest = state_digest(state)
    flipped = {k: v.clone() for k, v in state.items()}
    name = next(iter(flipped))
    flipped[name].view(-1).view(torch.int32)[0] ^= 1  # the lowest mantissa bit
    assert state_digest(flipped) != digest
    assert state_digest({f"x.{k}": v for k, v in state.items()}) != digest
    assert state_digest({k: v.double() for k, v in state.items()}) != digest
    assert state_digest(seeded_state(lambda: build_model("logreg", 10, (60,)), SEED + 1)) != digest


@pytest.mark.parametrize("seed", [0, 2**31 - 1])
def test_seeds_give_distinct_models(seed: int) -> None:
    a = seeded_state(lambda: build_model("cnn", 10, (1, 28, 28)), seed)
    b = seeded_state(lambda: build_model("cnn", 10, (1, 28, 28)), seed)
    assert state_digest(a) == state_digest(b)
    assert state_digest(a) != state_digest(
        seeded_state(lambda: build_model("cnn", 10, (1, 28, 28)), 5)
    )
