"""The module contract: a layer is data plus pure functions, never an object that mutates.

A ``Module`` is a NamedTuple:

- ``init(key) -> params``: a nested dict of arrays whose names, shapes and layouts are
  those of the matching torch module, so a torch ``state_dict`` loads with no renaming.
- ``apply(params, *inputs, key=None, train=False) -> y`` for a module without state, or
  ``apply(params, *inputs, state, key=None, train=False) -> (y, new_state)`` for one with
  state. ``train`` plays the part of ``module.train()`` / ``module.eval()``; stochastic
  layers (Dropout) need ``key`` when ``train=True``. Treat ``train`` as static under jit.
- ``init_state() -> state`` (None for a module without state): torch's buffers
  (BatchNorm's ``running_mean``, ``running_var``, ``num_batches_tracked``) as a nested
  dict shaped like ``params``. State is never differentiated and never seen by an
  optimizer; it goes in and the new state comes out, nothing is mutated.
- ``children``: ``((name, Module), ...)`` of containers and composites; ``name``: the
  torch-style description used in messages and ``repr``.
- ``batch_axis``: which axis of the input is the batch: 0 (batch-first, or a layer that does
  not care, such as Linear), 1 for torch's sequence-first layers (``batch_first=False``:
  MultiheadAttention, TransformerEncoder(Layer) with inputs ``(S, N, E)``), None when it is
  not known (a composite whose children disagree). ``make_step(accum_steps=k)`` splits that
  axis into micro-batches, or refuses when it is None.

``call(model, params, state, *inputs, ...) -> (y, state)`` is the one form that works for
every module, with or without state; the training loop and composites use it.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> model = nn.Linear(3, 1)
    >>> params = model.init(jax.random.key(0))  # a plain pytree, held by the caller
    >>> jax.grad(lambda p: model.apply(p, jnp.ones((2, 3))).sum())(params)["bias"].tolist()
    [2.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["Module", "call", "initial_state", "Tied", "check_params", "require_state", "refuse_state", "describe",
           "children_batch_axis"]

Params = Any
State = Any


class Module(NamedTuple):
    """``init(key) -> params``; ``apply(params, *inputs, [state,] key=None, train=False)``;
    ``init_state() -> state`` (None: the module has no state). See the module docstring."""

    init: Callable[..., Params]
    apply: Callable[..., Any]
    init_state: Callable[[], State] | None = None
    children: tuple = ()
    name: str = "Module"
    batch_axis: int | None = 0

    def __call__(self, *inputs, **kwargs):
        """Not torch's ``model(x)``: a funcnet module holds no weights, so say how it is called."""
        head = self.name.split("(")[0]
        how = ("y, state = model.apply(params, x, state=state) with state = model.init_state(), or "
               "nn.call(model, params, state, x)" if self.has_state else
               "model.apply(params, x), or nn.call(model, params, {}, x) for any module")
        raise TypeError(f"{head} is a funcnet module, not a torch one: it holds no weights, so it is not called as "
                        f"model(x); call {how}, with params = model.init(jax.random.key(0))")

    @property
    def has_state(self) -> bool:
        """True when ``apply`` takes ``state=`` and returns ``(y, new_state)``."""
        return self.init_state is not None

    def __repr__(self) -> str:
        """torch's ``repr``: a layer's one line; a module with children prints their tree as
        ``print(torch_module)`` does (ModuleList folds equal neighbours into ``(0-2): 3 x ...``)."""
        listed = [(n, c) for n, c in self.children if isinstance(c, Module)]
        if not self.children:
            return self.name
        head = self.name.split("(")[0]
        reprs = [(n, repr(c)) for n, c in listed]
        if head == "ModuleList":
            runs: list[list] = []
            for i, (n, r) in enumerate(reprs):
                if runs and runs[-1][2] == r:
                    runs[-1][1] = n
                else:
                    runs.append([n, n, r])
            lines = [f"({a}): {r}" if a == b else f"({a}-{b}): {int(b) - int(a) + 1} x {r}" for a, b, r in runs]
        else:
            lines = [f"({n}): {r}" for n, r in reprs]
        if not lines:
            return head + "()"
        return head + "(\n  " + "\n  ".join(line.replace("\n", "\n  ") for line in lines) + "\n)"


def children_batch_axis(children) -> int | None:
    """The batch axis of modules that pass their input along (Sequential, ModuleList): 0 unless
    a child says otherwise; None when children disagree or one does not know."""
    axes = {c.batch_axis for _, c in children if isinstance(c, Module)}
    if None in axes:
        return None
    axes.discard(0)
    return axes.pop() if len(axes) == 1 else (0 if not axes else None)


def initial_state(model: Module) -> State:
    """``model.init_state()``, or ``{}`` for a module without state."""
    return {} if model.init_state is None else model.init_state()


def call(model: Module, params: Params, state: State, *inputs, key=None, train: bool = False, **kwargs):
    """``(y, new_state)`` for any module; a module without state returns ``state`` as given."""
    if model.init_state is None:
        return model.apply(params, *inputs, key=key, train=train, **kwargs), state
    return model.apply(params, *inputs, state=state, key=key, train=train, **kwargs)


def describe(value) -> str:
    """A short description of a value for error messages (its type and shape)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))[:8]}"
    return type(value).__name__


def check_params(params, expected: Mapping | set | list | tuple, where: str) -> None:
    """Raise a clear error unless ``params`` is a dict with exactly the ``expected`` keys."""
    expected = sorted(expected)
    if not isinstance(params, Mapping):
        swapped = " (params and input swapped? apply takes params first)" if hasattr(params, "shape") else ""
        raise TypeError(f"{where}: params must be the nested dict from model.init(key), got "
                        f"{describe(params)}{swapped}")
    got = sorted(map(str, params))
    if got != expected:
        dotted = [k for k in got if "." in k]
        hint = (" - this is a flat state_dict; turn it into params with "
                "funcnet.load_state_dict(model.init(key), sd)") if dotted else \
            "; pass the params of this model (model.init(key)), not another model's"
        raise ValueError(f"{where}: params has keys {got}, expected {expected}{hint}")


def require_state(state, expected: Callable[[], State], where: str) -> State:
    """Raise a clear error unless ``state`` has the structure and shapes ``expected()`` would."""
    if state is None:
        raise ValueError(
            f"{where} keeps state (torch's buffers, e.g. running statistics): call "
            f"apply(params, x, state=state, train=...) with state = model.init_state() (or the state a "
            f"previous call returned) and take (y, new_state) back")
    want = jax.eval_shape(expected)
    if jax.tree.structure(state) != jax.tree.structure(want) or any(
            jnp.shape(a) != b.shape for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want))):
        got = {k: jnp.shape(v) for k, v in _flat(state).items()}
        exp = {k: v.shape for k, v in _flat(want).items()}
        raise ValueError(f"{where}: the state does not match the model: got {got}, expected {exp}; pass "
                         f"model.init_state() or a state returned by this model's apply")
    return state


def refuse_state(state, where: str) -> None:
    """The contract for ``state=`` given to a module without state: refused, never ignored
    (``y, s = model.apply(params, x, state=s)`` would otherwise unpack ``y``'s rows)."""
    if state is not None:
        raise TypeError(
            f"{where} has no state (no buffers such as BatchNorm's running statistics), so its apply takes no "
            f"state= and returns y alone; call y = model.apply(params, x), or funcnet.nn.call(model, params, "
            f"state, x), which returns (y, state) for every model")


def _flat(tree) -> dict:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="."): leaf for path, leaf in leaves}


@dataclasses.dataclass(frozen=True)
class Tied:
    """A parameter that is another parameter (torch: ``lm_head.weight = wte.weight``).

    It sits in the params tree where the tied parameter would be, and holds no array: it
    is a pytree with no leaves, so gradients, optimizers and checkpoints see the one
    array it points to, once. ``target`` is the dotted path of that array, relative to
    the composite ``depth`` levels above this entry; ``state_dict`` lists both keys, as
    torch does, and ``load_state_dict`` checks they agree.
    """

    target: str
    depth: int


jax.tree_util.register_static(Tied)
