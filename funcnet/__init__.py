"""funcnet: PyTorch's core ideas as pure JAX functions.

The library imports jax, optax, flax and numpy; never torch (``funcnet.interop``
imports it lazily, inside the functions that need it).
"""

from funcnet import init, losses, nn
from funcnet.state import StateDictError, load_state_dict, state_dict

__version__ = "0.1.0"

__all__ = [
    "init",
    "losses",
    "nn",
    "state_dict",
    "load_state_dict",
    "StateDictError",
]
