"""Modules made of modules: a custom ``forward`` with named children, and torch's containers.

``Composite(forward, **children)`` is how a torch ``nn.Module`` subclass is written here:

```python
def BasicBlock(inplanes, planes, stride=1):
    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)

    return nn.Composite(forward, conv1=nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False),
                        bn1=nn.BatchNorm2d(planes), relu=nn.ReLU(), ...,
                        downsample=None)
```

Inside ``forward``, ``self.conv1(x)`` applies the child ``conv1`` to its own params
(``params["conv1"]``) and state, with a fresh PRNG key and the caller's ``train`` flag;
``self.training`` is that flag. Children are named as torch attributes, so the params and
the state_dict keys (``conv1.weight``, ``bn1.running_mean``) are torch's. The new state of
every child comes back from ``apply``; nothing is mutated.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> params = model.init(jax.random.key(0))
    >>> sorted(params), model.apply(params, jnp.ones((3, 4))).shape  # torch's keys: the ReLU holds none
    (['0', '2'], (3, 2))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from funcnet.nn.module import (
    Module,
    Tied,
    call,
    check_params,
    children_batch_axis,
    describe,
    refuse_state,
    require_state,
)

__all__ = ["Composite", "Parameter", "Buffer", "Sequential", "ModuleList", "ModuleDict", "MLP"]


class Parameter:
    """A parameter owned by a composite itself (torch: ``self.cls_token = nn.Parameter(...)``).

    ``init`` is an array (the initial value) or a function ``key -> array``. Inside
    ``forward`` the attribute reads the array.
    """

    def __init__(self, init: Any):
        self.init = init if callable(init) else (lambda key, value=jnp.asarray(init): value)

    def __repr__(self) -> str:
        return "Parameter"


class Buffer:
    """A buffer owned by a composite itself (torch: ``self.register_buffer("count", ...)``):
    state, not a parameter. ``init`` is an array or a function ``() -> array``. Inside
    ``forward`` the attribute reads it, and ``self.count = new`` sets the new state that
    ``apply`` returns (torch's ``self.count += 1``)."""

    def __init__(self, init: Any):
        self.init = init if callable(init) else (lambda value=jnp.asarray(init): value)

    def __repr__(self) -> str:
        return "Buffer"


def _is_container(m: Module) -> bool:
    return m.apply is None


def _own_params(children) -> list[str]:
    return [n for n, c in children if isinstance(c, Parameter)]


def _init_children(children, key) -> dict:
    # torch orders a module's own parameters before its children's.
    params: dict = {}
    entries = [(n, c) for n, c in children if c is not None and not isinstance(c, Buffer)]
    keys = jax.random.split(key, max(len(entries), 1))
    for (name, child), k in sorted(zip(entries, keys), key=lambda e: not isinstance(e[0][1], Parameter)):
        p = child.init(k)
        if jax.tree_util.tree_leaves(p) or isinstance(child, Parameter):
            params[name] = p
    return params


def _state_children(children) -> dict:
    # torch orders a module's own buffers before its children's
    own = {name: child.init() for name, child in children if isinstance(child, Buffer)}
    return own | {name: child.init_state() for name, child in children
                  if isinstance(child, Module) and child.init_state is not None}


def _stateful(children) -> bool:
    return any(isinstance(c, Buffer) or (isinstance(c, Module) and c.init_state is not None) for _, c in children)


def _param_names(children) -> Callable[[], set[str]]:
    # Which children own params: found on shapes only, on the first apply (building a model
    # must not start JAX's backend: the number of simulated devices is fixed when it starts).
    cache: list = []

    def names():
        if not cache:
            cache.append(set(_find_param_names(children)))
        return cache[0]

    return names


def _find_param_names(children) -> list[str]:
    names = []
    for name, child in children:
        if child is None or isinstance(child, Buffer):
            continue
        if isinstance(child, Parameter) or jax.tree_util.tree_leaves(jax.eval_shape(child.init, jax.random.key(0))):
            names.append(name)
    return names


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _resolve_ties(params, ties: dict[str, str]):
    if not ties:
        return params
    out = _copy(params)
    for src in ties:
        path = src.split(".")
        node = out
        for p in path[:-1]:
            node = node[p]
        tied = node[path[-1]]
        node[path[-1]] = _get(params, ties[src].split(".")) if isinstance(tied, Tied) else tied
    return out


def _copy(tree):
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


class _Scope:
    """What ``self`` is inside a composite's ``forward``: bound children, ``training``."""

    def __init__(self, owner: str, children: dict, params, state, key, train):
        self._owner, self._children = owner, children
        self._params, self._state = params, state
        self._key, self.training = key, train

    def next_key(self):
        """A fresh PRNG key from the caller's: for a forward that draws noise itself (a VAE's
        ``randn_like``) or runs children itself (a ``lax.scan`` over stacked blocks). Without a
        key it raises, naming the module: pass ``key=`` to apply (``fit`` and ``evaluate`` do
        in training; for eval use ``self.key_or_none()`` and draw only when it is not None)."""
        if self._key is None:
            raise ValueError(
                f"{self._owner}: self.next_key() needs a PRNG key, but apply was called without one; pass "
                f"key=jax.random.key(seed) to apply (evaluate(..., key=) for a model that samples in eval too), "
                f"or use self.key_or_none() in forward and skip the draw when it is None")
        return self._split()

    def key_or_none(self):
        """``next_key()``, or None when apply got no key (a child that needs none)."""
        return None if self._key is None else self._split()

    def _split(self):
        self._key, sub = jax.random.split(self._key)
        return sub

    def _run(self, path, module, inputs, kwargs):
        params = self._params
        for p in path:
            params = params.get(p, {}) if isinstance(params, Mapping) else {}
        state = self._state
        for p in path:
            state = state.get(p, {}) if isinstance(state, Mapping) else {}
        with jax.named_scope(".".join(path)):  # the jaxpr's name stack: where a pipeline split point is found
            y, new_state = call(module, params, state if module.has_state else None, *inputs,
                                key=self.key_or_none(), train=self.training, **kwargs)
        if module.has_state:
            node = self._state
            for p in path[:-1]:
                node[p] = dict(node[p])
                node = node[p]
            node[path[-1]] = new_state
        return y

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._children:
            raise AttributeError(f"{self._owner} has no child {name!r}; its children are "
                                 f"{', '.join(self._children) or 'none'}")
        child = self._children[name]
        if child is None:
            return None
        if isinstance(child, Parameter):
            return self._params[name]
        if isinstance(child, Buffer):
            return self._state[name]
        return _Bound(self, (name,), child)

    def __setattr__(self, name, value):
        if name.startswith("_") or name == "training":
            object.__setattr__(self, name, value)
        elif isinstance(self._children.get(name), Buffer):
            self._state[name] = value  # the new state apply returns; nothing is mutated
        else:
            raise AttributeError(f"{self._owner}: only a Buffer child can be set in forward (the new state apply "
                                 f"returns); {name!r} is {describe(self._children.get(name))}")


class _Bound:
    """A child bound to its params, state and the caller's key and mode: call it like torch's."""

    def __init__(self, scope: _Scope, path: tuple, module: Module):
        self._scope, self._path, self._module = scope, path, module

    def __call__(self, *inputs, **kwargs):
        if _is_container(self._module):
            raise TypeError(f"{'.'.join(self._path)} is a {self._module.name.split('(')[0]}, which has no "
                            f"forward (as in torch); iterate it or index it and call its children")
        return self._scope._run(self._path, self._module, inputs, kwargs)

    def _child(self, name):
        children = dict(self._module.children)
        if name not in children:
            raise KeyError(f"{'.'.join(self._path)} has no child {name!r}; it has {', '.join(children)}")
        return _Bound(self._scope, self._path + (name,), children[name])

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._child(name)

    def __getitem__(self, index):
        if isinstance(index, int):
            n = len(self._module.children)
            if not -n <= index < n:
                raise IndexError(f"index {index} is out of range for {'.'.join(self._path)} of length {n}")
            index = self._module.children[index][0]
        return self._child(str(index))

    def __iter__(self):
        return (self._child(name) for name, _ in self._module.children)

    def __len__(self):
        return len(self._module.children)

    def keys(self):
        return [n for n, _ in self._module.children]

    def items(self):
        return [(n, self._child(n)) for n, _ in self._module.children]

    @property
    def params(self):
        """This child's params (e.g. to use an embedding's weight as an output projection)."""
        return _get(self._scope._params, self._path)

    @property
    def state(self):
        """This child's state (its buffers, e.g. a causal mask or running statistics), read only."""
        return _get(self._scope._state, self._path)


_UNSET: Any = object()


def Composite(forward: Callable, /, *, name: str | None = None, tied: Mapping[str, str] | None = None,
              batch_axis: int | None = _UNSET, **children) -> Module:
    """A module with named children and a custom ``forward(self, *inputs, **kwargs)``.

    ``children``: Modules (named as torch attributes), ``None`` (an absent optional child,
    as torch's ``self.downsample = None``), ``Parameter``s or ``Buffer``s. ``tied``: ``{"lm_head.weight":
    "transformer.wte.weight"}`` makes the first parameter the second one (one array; both
    keys in ``state_dict``). The model has state if any child has.
    """
    if not callable(forward):
        raise TypeError(f"Composite: forward must be a function forward(self, x, ...), got {describe(forward)}")
    name = name or getattr(forward, "__qualname__", "Composite").split(".<locals>")[0]
    for child_name, child in children.items():
        if not (child is None or isinstance(child, (Module, Parameter, Buffer))):
            raise TypeError(f"{name}: child {child_name!r} is {describe(child)}, expected a funcnet.nn.Module, "
                            f"a Parameter, a Buffer or None (call the factory: nn.ReLU(), not nn.ReLU)")
    items = tuple(children.items())
    child_map = dict(items)
    ties = dict(tied or {})
    expected_params = _param_names(items)
    for src, dst in ties.items():
        top = src.split(".")[0]
        if top not in child_map or dst.split(".")[0] not in child_map:
            raise ValueError(f"{name}: tied={{{src!r}: {dst!r}}} names a child that does not exist; children "
                             f"are {', '.join(child_map)}")

    def init(key):
        params = _init_children(items, key)
        for src, dst in ties.items():
            path = src.split(".")
            node = params
            for p in path[:-1]:
                node = node[p]
            if path[-1] not in node:
                raise ValueError(f"{name}: tied parameter {src!r} does not exist")
            node[path[-1]] = Tied(dst, len(path))
        return params

    def init_state():
        return _state_children(items)

    stateful = _stateful(items)

    def apply(params, *inputs, state=None, key=None, train=False, **kwargs):
        check_params(params, expected_params(), name)
        if not stateful:
            refuse_state(state, name)
        if stateful:
            state = _copy(require_state(state, init_state, name))
        scope = _Scope(name, child_map, _resolve_ties(params, ties), state if stateful else {}, key, train)
        y = forward(scope, *inputs, **kwargs)
        return (y, scope._state) if stateful else y

    if batch_axis is _UNSET:
        batch_axis = 0 if children_batch_axis(items) == 0 else None
    return Module(init, apply, init_state if stateful else None, items, name, batch_axis)


def Sequential(*layers: Module) -> Module:
    """Apply ``layers`` in order, as torch.nn.Sequential.

    Children are named "0", "1", ... by position; children without parameters (ReLU,
    Dropout, Flatten) have no entry, so ``Sequential(Linear, ReLU, Linear)`` has params
    ``{"0": ..., "2": ...}`` and torch's state_dict keys. The PRNG key given to ``init``
    / ``apply`` is split once per child. Children with state (BatchNorm) make the
    Sequential a module with state.
    """
    if len(layers) == 1 and isinstance(layers[0], (list, tuple)) and not isinstance(layers[0], Module):
        layers = tuple(layers[0])
    for i, layer in enumerate(layers):
        if not isinstance(layer, Module):
            raise TypeError(
                f"Sequential: child {i} is {type(layer).__name__}, expected a funcnet.nn.Module; "
                f"call the factory (nn.ReLU(), not nn.ReLU)"
            )
    items = tuple((str(i), layer) for i, layer in enumerate(layers))
    name = "Sequential(" + ", ".join(layer.name for layer in layers) + ")"
    expected_params = _param_names(items)
    stateful = _stateful(items)

    def init(key):
        params = {}
        for (i, layer), k in zip(items, jax.random.split(key, max(len(layers), 1))):
            p = layer.init(k)
            if jax.tree_util.tree_leaves(p):
                params[i] = p
        return params

    def init_state():
        return _state_children(items)

    def apply(params, x, *, state=None, key=None, train=False):
        check_params(params, expected_params(), "Sequential")
        if not stateful:
            refuse_state(state, "Sequential")
        if stateful:
            state = dict(require_state(state, init_state, "Sequential"))
        keys = [None] * len(layers) if key is None else list(jax.random.split(key, max(len(layers), 1)))
        for (i, layer), k in zip(items, keys):
            with jax.named_scope(i):
                x, new = call(layer, params.get(i, {}), state.get(i) if stateful else None, x, key=k, train=train)
            if layer.has_state:
                state[i] = new
        return (x, state) if stateful else x

    return Module(init, apply, init_state if stateful else None, items, name, children_batch_axis(items))


def _container(kind: str, items: tuple) -> Module:
    for name, child in items:
        if not isinstance(child, Module):
            raise TypeError(f"{kind}: entry {name!r} is {describe(child)}, expected a funcnet.nn.Module")

    def init(key):
        return _init_children(items, key)

    def init_state():
        return _state_children(items)

    return Module(init, None, init_state if _stateful(items) else None, items,
                  f"{kind}(" + ", ".join(f"{n}={c.name}" for n, c in items) + ")", children_batch_axis(items))


def ModuleList(modules: Sequence[Module]) -> Module:
    """Children "0", "1", ... with no forward of their own, as torch.nn.ModuleList: inside a
    ``Composite``'s forward, ``for block in self.h: x = block(x)`` or ``self.h[0](x)``."""
    return _container("ModuleList", tuple((str(i), m) for i, m in enumerate(modules)))


def ModuleDict(modules: Mapping[str, Module]) -> Module:
    """Named children with no forward of their own, as torch.nn.ModuleDict: inside a
    ``Composite``'s forward, ``self.transformer.wte(idx)`` or ``self.transformer["wte"](idx)``."""
    if not isinstance(modules, Mapping):
        raise TypeError(f"ModuleDict: expected a dict of name -> Module, got {describe(modules)}")
    for name in modules:
        if not isinstance(name, str) or "." in name or not name:
            raise ValueError(f"ModuleDict: child name {name!r} must be a non-empty str without '.'")
    return _container("ModuleDict", tuple(modules.items()))


def MLP(sizes: Sequence[int], activation: Callable[[], Module] | None = None, *, dropout: float = 0.0,
        bias: bool = True) -> Module:
    """Linear layers of ``sizes`` with ``activation()`` between them (none after the last).

    ``MLP([784, 128, 10])`` is ``Sequential(Linear(784, 128), ReLU(), Linear(128, 10))``,
    params ``{"0": ..., "2": ...}``. With ``dropout > 0`` a Dropout follows each activation.
    """
    from funcnet.nn.activation import ReLU
    from funcnet.nn.dropout import Dropout
    from funcnet.nn.linear import Linear

    activation = activation or ReLU
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"MLP: sizes needs at least an input and an output size, got {sizes}")
    layers: list[Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Linear(n_in, n_out, bias))
        if i < len(sizes) - 2:
            layers.append(activation())
            if dropout > 0.0:
                layers.append(Dropout(dropout))
    return Sequential(*layers)
