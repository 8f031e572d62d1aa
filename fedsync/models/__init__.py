"""Models and the loops that train and test them.

* :func:`build_model` -- a model by registry name (``mlp``, ``cnn``, ``char-lstm``,
  ``char-gpt``, ``logreg``, or ``auto`` with the dataset's default, see :func:`default_model_for`);
* :func:`train` / :func:`evaluate` -- SGD with an optional FedProx term, and
  loss/accuracy, over :class:`fedsync.data.ArrayDataset` arrays.
"""

from fedsync.models.char_lstm import CharLSTM
from fedsync.models.char_transformer import CharTransformer
from fedsync.models.cnn import LeNet5
from fedsync.models.logreg import LogisticRegression
from fedsync.models.mlp import MLP
from fedsync.models.registry import build_model, default_model_for, model_names
from fedsync.models.training import EvalResult, TrainResult, as_tensors, evaluate, train

__all__ = [
    "MLP",
    "CharLSTM",
    "CharTransformer",
    "EvalResult",
    "LeNet5",
    "LogisticRegression",
    "TrainResult",
    "as_tensors",
    "build_model",
    "default_model_for",
    "evaluate",
    "model_names",
    "train",
]
