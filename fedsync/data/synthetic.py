"""FedProx's Synthetic(alpha, beta) data: heterogeneity you can dial.

Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020), section 5.1.
For each client k:

* model heterogeneity: ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (60 x 10) and
  ``b_k ~ N(u_k, 1)`` (10);
* data heterogeneity: ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` (60), and
  ``x ~ N(v_k, Sigma)`` with ``Sigma`` diagonal, ``Sigma_jj = j ** -1.2``;
* labels: ``y = argmax(softmax(W_k^T x + b_k))``;
* sizes: ``n_k = floor(lognormal(4, 2)) + 50`` samples, so a few clients are large.

``alpha`` and ``beta`` are used as *standard deviations*, as the authors' generator
does. ``alpha = beta = 0`` still differs per client through the unit-variance draws;
the ``iid`` variant shares one ``W, b`` and ``v = 0`` across clients. Each client's
samples are split 90/10 into train and test; the natural partition is the generating
client (``groups``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedsync.data.types import ArrayDataset, DatasetError, DatasetSplits

TEST_FRACTION = 0.1


def generate_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    iid: bool = False,
    num_clients: int = 30,
    dim: int = 60,
    num_classes: int = 10,
    seed: int = 0,
) -> DatasetSplits:
    """Generate Synthetic(alpha, beta); same arguments, same arrays.

    Parameters
    ----------
    alpha : float
        Spread of the clients' model means (how much the labelling rules differ).
    beta : float
        Spread of the clients' feature means (how much the inputs differ).
    iid : bool
        One shared model and zero feature mean for all clients.
    num_clients : int
        Number of generating clients (natural groups).
    dim, num_classes : int
        Input dimension and number of classes (60 and 10 in the paper).
    seed : int
        Seed of everything above.
    """
    if alpha < 0 or beta < 0:
        raise DatasetError(f"synthetic: alpha and beta must be >= 0, got {alpha}, {beta}")
    if num_clients < 1 or dim < 1 or num_classes < 2:
        raise DatasetError(
            f"synthetic: need num_clients >= 1, dim >= 1, num_classes >= 2; got "
            f"{num_clients}, {dim}, {num_classes}"
        )
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50
    std_x = np.arange(1, dim + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt of Sigma's diagonal

    # The IID variant's one labelling rule (drawn either way; only IID uses it, with v = 0).
    shared = (rng.normal(0.0, 1.0, (dim, num_classes)), rng.normal(0.0, 1.0, num_classes))
    train_x, train_y, test_x, test_y, groups = [], [], [], [], []
    for k in range(num_clients):
        if iid:
            (w, b), v = shared, np.zeros(dim)
        else:
            u = rng.normal(0.0, alpha)
            w = rng.normal(u, 1.0, (dim, num_classes))
            b = rng.normal(u, 1.0, num_classes)
            v = rng.normal(rng.normal(0.0, beta), 1.0, dim)
        x = v + rng.standard_normal((int(sizes[k]), dim)) * std_x
        y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
        n_test = round(len(y) * TEST_FRACTION)
        order = rng.permutation(len(y))
        test, train = order[:n_test], order[n_test:]
        train_x.append(x[train])
        train_y.append(y[train])
        test_x.append(x[test])
        test_y.append(y[test])
        groups.append(np.full(len(train), k, dtype=np.int64))

    return DatasetSplits(
        train=_dataset(train_x, train_y),
        test=_dataset(test_x, test_y),
        num_classes=num_classes,
        input_shape=(dim,),
        groups=np.concatenate(groups),
        name="synthetic" if not iid else "synthetic-iid",
        group_names=tuple(f"client-{k}" for k in range(num_clients)),
    )


def load_synthetic(
    files: Mapping[str, Path],
    *,
    seed: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    num_clients: int = 30,
) -> DatasetSplits:
    """Registry adapter for :func:`generate_synthetic` (``files`` is unused)."""
    del files
    return generate_synthetic(alpha, beta, iid=iid, num_clients=num_clients, seed=seed)


def _dataset(xs: list[np.ndarray], ys: list[np.ndarray]) -> ArrayDataset:
    return ArrayDataset(np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64))
