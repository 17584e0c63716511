"""The oracle for interop.convert: a zoo model converted, then run beside torch itself.

``check(name, dtype)`` returns the largest relative differences from torch: the eval
forward, the train forward, the loss, the gradients, the state (buffers) after a train
step and the parameters after ``steps`` SGD steps. Run as a script (``python
tests/convert_check.py float64``, with JAX_ENABLE_X64=1) it prints them for every zoo
model as JSON; ``... float64 --transformers bert gpt2 llama`` for transformers models.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

sys.path.insert(0, os.path.dirname(__file__))

from convert_zoo import ZOO, fresh_inputs  # noqa: E402

import funcnet  # noqa: E402
from funcnet import interop, nn  # noqa: E402


def _cast(tree, dtype):
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, (tuple, list)):
        return type(tree)(_cast(t, dtype) for t in tree)
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    return tree


def to_jax(tree):
    if isinstance(tree, torch.Tensor):
        return jnp.asarray(tree.detach().numpy())
    if isinstance(tree, (tuple, list)):
        return type(tree)(to_jax(t) for t in tree)
    if isinstance(tree, dict):
        return {k: to_jax(v) for k, v in tree.items()}
    return tree


def _leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [x for t in tree for x in _leaves(t)]
    if isinstance(tree, dict):
        return [x for t in tree.values() for x in _leaves(t)]
    return [] if tree is None else [tree]


def loss_of(y, xp):
    """The sum of the mean squares of every floating output (a model's own loss is one of them)."""
    total = 0.0
    for t in _leaves(y):
        if xp is torch and t.is_floating_point():
            total = total + t.pow(2).mean()
        elif xp is jnp and jnp.issubdtype(t.dtype, jnp.floating):
            total = total + jnp.mean(t ** 2)
    return total


def rel(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b.detach().numpy() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def dict_rel(ours: dict, theirs: dict) -> float:
    """The largest difference over the entries, relative to the largest value over all of them: a
    gradient that is zero in exact arithmetic (a bias before BatchNorm) is rounding noise in both
    frameworks, and its own scale would turn that noise into a meaningless huge ratio."""
    a = {k: np.asarray(v, dtype=np.float64) for k, v in ours.items()}
    b = {k: np.asarray(v.detach().numpy(), dtype=np.float64) for k, v in theirs.items()}
    if {k: x.shape for k, x in a.items()} != {k: x.shape for k, x in b.items()}:
        return float("inf")
    scale = max(float(np.max(np.abs(x))) for x in b.values()) + 1e-30
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b) / scale


def tree_rel(ours, theirs) -> float:
    if isinstance(ours, dict) and isinstance(theirs, dict):  # by key: transformers' outputs keep their own order
        keys = [k for k, v in theirs.items() if v is not None]
        return max([tree_rel(ours[k], theirs[k]) if k in ours else float("inf") for k in keys], default=0.0)
    a, b = _leaves(ours), _leaves(theirs)
    if len(a) != len(b):
        return float("inf")
    return max([rel(x, y) for x, y in zip(a, b)], default=0.0)


class fixed_noise:
    """``torch.randn_like`` and the converted model's draw give the same fixed values, so a
    model that samples (a VAE) is compared through everything but the random draw itself
    (tests/test_convert.py checks the draw: the key decides it)."""

    def __enter__(self):
        from funcnet.interop import ops

        self.ops, self.saved = ops, (torch.randn_like, ops.OPS["torch.randn_like"])

        def noise(shape):
            n = int(np.prod(shape))
            return np.sin(np.arange(n, dtype=np.float64) * 0.7).reshape(shape)

        torch.randn_like = lambda t, **kw: torch.from_numpy(noise(tuple(t.shape))).to(t.dtype)
        ops.OPS["torch.randn_like"] = ops.Op(lambda t, **kw: jnp.asarray(noise(t.shape), dtype=t.dtype))
        return self

    def __exit__(self, *exc):
        torch.randn_like, self.ops.OPS["torch.randn_like"] = self.saved
        return False


def check(name: str, dtype=torch.float32, steps: int = 3, lr: float = 0.05) -> dict:
    module, args, kwargs = ZOO[name]()
    module = module.to(dtype)
    args, kwargs = _cast(args, dtype), _cast(kwargs, dtype)
    converted = interop.convert(module, *args, **kwargs)  # traced with torch's own randn_like
    fresh = fresh_inputs(name, args, kwargs)
    with fixed_noise():
        return _check(module, args, kwargs, converted, steps, lr, fresh)


def _check(module, args, kwargs, converted, steps: int, lr: float, fresh=None) -> dict:
    model, params, state = converted
    jargs, jkwargs = to_jax(args), to_jax(kwargs)
    out = {}

    module.eval()
    with torch.no_grad():  # jitted: op by op, each new shape of each op compiles on its own (seconds)
        y = jax.jit(lambda p, s: nn.call(model, p, s, *jargs, **jkwargs)[0])(params, state)
        out["eval"] = tree_rel(y, module(*args, **kwargs))
        if fresh is not None:  # values and a batch size it was not traced on: nothing computed is baked in
            fargs, fkwargs = fresh
            y = jax.jit(lambda p, s, a, k: nn.call(model, p, s, *a, **k)[0])(params, state, to_jax(fargs),
                                                                            to_jax(fkwargs))
            out["fresh"] = tree_rel(y, module(*fargs, **fkwargs))

    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    tx = optax.sgd(lr)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, state, opt_state):
        def f(p):
            y, s = nn.call(model, p, state, *jargs, train=True, key=jax.random.key(0), **jkwargs)
            return loss_of(y, jnp), (y, s)

        (loss, (y, new_state)), grads = jax.value_and_grad(f, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, loss, y, grads

    for i in range(steps):
        opt.zero_grad()
        y_t = module(*args, **kwargs)
        loss_t = loss_of(y_t, torch)
        loss_t.backward()
        params, state, opt_state, loss, y, grads = step(params, state, opt_state)
        if i == 0:
            out["train"] = tree_rel(y, y_t)
            out["loss"] = rel(loss, loss_t)
            named = dict(module.named_parameters(remove_duplicate=False))
            out["grads"] = dict_rel(funcnet.state_dict(grads), {k: p.grad for k, p in named.items()})
        opt.step()
    ours = funcnet.state_dict(params, state)
    theirs = module.state_dict()
    out["keys"] = 0.0 if list(ours) == list(theirs) or set(ours) == set(theirs) else float("inf")
    out["params_after"] = dict_rel({k: ours[k] for k in theirs if theirs[k].is_floating_point()},
                                   {k: v for k, v in theirs.items() if v.is_floating_point()})
    out["state_after"] = max([rel(ours[k], theirs[k]) for k in theirs if not theirs[k].is_floating_point()]
                             + [0.0])
    return out


def check_transformers(name: str, dtype=torch.float64, steps: int = 3, lr: float = 0.05) -> dict:
    """``check`` for a transformers model of tests/test_convert_transformers.py (tiny config, no
    download), with every dropout at 0 so that the train steps are deterministic on both sides."""
    from test_convert_transformers import BUILDERS

    torch.manual_seed(0)
    module, trace, fresh = BUILDERS[name]()
    for m in module.modules():  # nn.Dropout layers, and the probabilities attention reads (self.dropout = 0.1)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for attr, value in vars(m).items():
            if "dropout" in attr and isinstance(value, float):
                setattr(m, attr, 0.0)
    module = module.to(dtype)
    trace, fresh = _cast(trace, dtype), _cast(fresh, dtype)
    converted = interop.convert(module, **trace)
    return _check(module, (), trace, converted, steps, lr, ((), fresh))


if __name__ == "__main__":
    dtype = {"float64": torch.float64, "float32": torch.float32}[sys.argv[1]]
    torch.set_num_threads(1)
    if sys.argv[2:3] == ["--transformers"]:  # python tests/convert_check.py float64 --transformers bert gpt2
        print(json.dumps({n: check_transformers(n, dtype) for n in sys.argv[3:]}))
    else:
        names = sys.argv[2:] or list(ZOO)
        print(json.dumps({n: check(n, dtype) for n in names}))
