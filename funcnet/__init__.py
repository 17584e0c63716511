"""funcnet: PyTorch's core ideas as pure JAX functions.

The library imports jax, optax, flax and numpy; never torch (``funcnet.interop``
imports it lazily, inside the functions that need it).
"""

from funcnet import autodiff, checkpoint, data, init, interop, losses, memory, nn, parallel, precision, profile, train
from funcnet.state import StateDictError, load_state_dict, state_dict
from funcnet.checkpoint import CheckpointError
from funcnet.train import Position, TrainState, create_train_state, evaluate, fit, make_step, run_epoch

__version__ = "0.1.0"

__all__ = [
    "autodiff",
    "checkpoint",
    "CheckpointError",
    "Position",
    "data",
    "memory",
    "parallel",
    "precision",
    "profile",
    "init",
    "interop",
    "train",
    "TrainState",
    "create_train_state",
    "make_step",
    "run_epoch",
    "evaluate",
    "fit",
    "losses",
    "nn",
    "state_dict",
    "load_state_dict",
    "StateDictError",
]
