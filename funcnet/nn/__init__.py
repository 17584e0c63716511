"""Layers as pure functions with torch's names, signatures, layouts and defaults.

One file per layer family; the contract (``Module``, state, ``call``) is in
``funcnet.nn.module``, composites and containers in ``funcnet.nn.containers``.
"""

from funcnet.nn.activation import Identity, ReLU, Sigmoid, Tanh
from funcnet.nn.containers import MLP, Composite, ModuleDict, ModuleList, Parameter, Sequential
from funcnet.nn.linear import Dropout, Flatten, Linear
from funcnet.nn.module import Module, Tied, call, initial_state

__all__ = [
    "Module", "Tied", "call", "initial_state",
    "Composite", "Parameter", "Sequential", "ModuleList", "ModuleDict", "MLP",
    "Linear", "Dropout", "Flatten",
    "ReLU", "Tanh", "Sigmoid", "Identity",
]
