"""The models of ``benchmarks/models.py`` written with the other JAX ways: by hand, flax NNX, equinox.

Each peer is the same network as the funcnet model (same layers, same math as torch
defines it), loaded from the same weights (funcnet's params, which are torch's
``state_dict``), trained with the same optax optimizer, and returns the same metrics
(``{"loss", "accuracy"}``) as ``funcnet.make_step``'s step:

- ``raw JAX``: ``jax.lax`` / ``jnp`` written by hand over funcnet's params dict (torch's
  names and layouts), the loss through ``jax.value_and_grad``; what a JAX user writes with
  no library.
- ``flax nnx``: ``nnx.Module`` classes in flax's idiom (channels-last convolutions, kernels
  ``(in, out)``), trained the way flax's "Performance considerations" guide recommends for
  a hot loop: ``nnx.split`` once, a pure step under ``jax.jit`` that ``nnx.merge``-s,
  optax on the ``nnx.Param`` state.
- ``equinox``: ``eqx.Module`` classes in equinox's idiom (one example at a time under
  ``jax.vmap``, ``eqx.nn.BatchNorm(mode="batch")`` with its ``eqx.nn.State``); the step
  is a pure function of the model's arrays (``eqx.partition`` once, ``eqx.combine``
  inside) under ``jax.jit``.

A peer is ``Peer(carry, step, values)``: ``step(carry, (x, y)) -> (carry, metrics)`` is pure
(the harness jits it, donating the carry); ``values(carry)`` gives the parameters under
torch's names as numpy arrays, for the check against torch. BatchNorm's running
statistics are compared for raw JAX only: flax keeps the biased batch variance and
equinox a debiased moving average, neither torch's form (the training math is the same).

The LSTM LM: torch's LSTM has two biases per layer (``b_ih``, ``b_hh``), flax's and equinox's
cells one; both are kept as parameters here (flax: a bias on the cell's input Linear; equinox:
a second leaf added to the cell's bias), so every peer trains torch's parameters.

Adding a model: one ``<model>_<peer>(spec)`` function per peer and an entry in ``PEERS``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import funcnet

__all__ = ["Peer", "PEERS", "build"]


class Peer(NamedTuple):
    carry: Any
    step: Callable
    values: Callable


def _metrics(logits, y, loss):
    return {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}


def _xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def _np(a):
    return np.asarray(a)


# ---------------------------------------------------------------------------------- conv net
def _conv_net_sizes(spec):
    p = spec.params
    c1, c2 = p["conv1"]["weight"].shape[0], p["conv2"]["weight"].shape[0]
    image = math.isqrt(spec.x.shape[1])
    return c1, c2, image


def convnet_raw(spec) -> Peer:
    c1, c2, image = _conv_net_sizes(spec)
    tx, eps, momentum = spec.tx, 1e-5, 0.1

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def batch_norm(x, p, s):
        mean, var = jnp.mean(x, (0, 2, 3)), jnp.var(x, (0, 2, 3))
        y = (x - mean[:, None, None]) * jax.lax.rsqrt(var[:, None, None] + eps)
        y = y * p["weight"][:, None, None] + p["bias"][:, None, None]
        n = x.size // x.shape[1]
        mean, var = jax.lax.stop_gradient((mean, var))
        new = {"running_mean": (1 - momentum) * s["running_mean"] + momentum * mean,
               "running_var": (1 - momentum) * s["running_var"] + momentum * var * n / (n - 1),
               "num_batches_tracked": s["num_batches_tracked"] + 1}
        return y, new

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def forward(p, s, x):
        x = x.reshape(-1, 1, image, image)
        x, s1 = batch_norm(conv(x, p["conv1"]["weight"]), p["bn1"], s["bn1"])
        x = pool(jax.nn.relu(x))
        x, s2 = batch_norm(conv(x, p["conv2"]["weight"]), p["bn2"], s["bn2"])
        x = pool(jax.nn.relu(x))
        logits = x.reshape(x.shape[0], -1) @ p["fc"]["weight"].T + p["fc"]["bias"]
        return logits, {"bn1": s1, "bn2": s2}

    def loss_fn(p, s, x, y):
        logits, s = forward(p, s, x)
        loss = _xent(logits, y)
        return loss, (logits, s)

    def step(carry, batch):
        params, opt_state, model_state = carry
        x, y = batch
        (loss, (logits, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, model_state), _metrics(logits, y, loss)

    params = _copy(spec.params)
    carry = (params, tx.init(params), _copy(spec.model_state))

    def values(carry):
        return {k: _np(v) for k, v in funcnet.state_dict(carry[0], carry[2]).items()}

    return Peer(carry, step, values)


def convnet_flax(spec) -> Peer:
    from flax import nnx

    c1, c2, image = _conv_net_sizes(spec)
    side = image // 4

    class ConvNet(nnx.Module):
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(1, c1, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, rngs=rngs)
            self.bn1 = nnx.BatchNorm(c1, momentum=0.9, epsilon=1e-5, rngs=rngs)
            self.conv2 = nnx.Conv(c1, c2, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, rngs=rngs)
            self.bn2 = nnx.BatchNorm(c2, momentum=0.9, epsilon=1e-5, rngs=rngs)
            self.fc = nnx.Linear(c2 * side * side, 10, rngs=rngs)

        def __call__(self, x):
            x = x.reshape(-1, image, image, 1)  # channels-last, flax's layout
            x = nnx.max_pool(jax.nn.relu(self.bn1(self.conv1(x))), (2, 2), (2, 2))
            x = nnx.max_pool(jax.nn.relu(self.bn2(self.conv2(x))), (2, 2), (2, 2))
            return self.fc(x.reshape(x.shape[0], -1))

    model = ConvNet(nnx.Rngs(0))
    p = spec.params
    model.conv1.kernel[...] = jnp.transpose(p["conv1"]["weight"], (2, 3, 1, 0))  # OIHW -> HWIO
    model.conv2.kernel[...] = jnp.transpose(p["conv2"]["weight"], (2, 3, 1, 0))
    for bn in ("bn1", "bn2"):
        getattr(model, bn).scale[...] = p[bn]["weight"]
        getattr(model, bn).bias[...] = p[bn]["bias"]
    # torch flattens (C, H, W), a channels-last net (H, W, C): the same Linear, its inputs permuted
    w = p["fc"]["weight"].reshape(-1, c2, side, side).transpose(0, 2, 3, 1).reshape(-1, c2 * side * side)
    model.fc.kernel[...] = w.T
    model.fc.bias[...] = p["fc"]["bias"]
    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    params, stats = _copy((params, stats))  # the step donates them; spec's arrays stay for the other rows
    tx = spec.tx

    def loss_fn(params, stats, x, y):
        m = nnx.merge(graphdef, params, stats, copy=True)
        logits = m(x)
        return _xent(logits, y), (logits, nnx.state(m, nnx.BatchStat))

    def step(carry, batch):
        params, opt_state, stats = carry
        x, y = batch
        (loss, (logits, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, stats), _metrics(logits, y, loss)

    def values(carry):
        m = nnx.merge(graphdef, carry[0], carry[2])
        fc = _np(m.fc.kernel[...]).T.reshape(-1, side, side, c2).transpose(0, 3, 1, 2).reshape(-1, c2 * side * side)
        return {"conv1.weight": _np(m.conv1.kernel[...]).transpose(3, 2, 0, 1),
                "conv2.weight": _np(m.conv2.kernel[...]).transpose(3, 2, 0, 1),
                "bn1.weight": _np(m.bn1.scale[...]), "bn1.bias": _np(m.bn1.bias[...]),
                "bn2.weight": _np(m.bn2.scale[...]), "bn2.bias": _np(m.bn2.bias[...]),
                "fc.weight": fc, "fc.bias": _np(m.fc.bias[...])}

    return Peer((params, tx.init(params), stats), step, values)


def convnet_equinox(spec) -> Peer:
    import equinox as eqx

    c1, c2, image = _conv_net_sizes(spec)
    side = image // 4

    class ConvNet(eqx.Module):
        conv1: eqx.nn.Conv2d
        bn1: eqx.nn.BatchNorm
        conv2: eqx.nn.Conv2d
        bn2: eqx.nn.BatchNorm
        pool: eqx.nn.MaxPool2d
        fc: eqx.nn.Linear

        def __init__(self, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.conv1 = eqx.nn.Conv2d(1, c1, 3, padding=1, use_bias=False, key=k1)
            self.bn1 = eqx.nn.BatchNorm(c1, axis_name="batch", momentum=0.9, eps=1e-5, mode="batch")
            self.conv2 = eqx.nn.Conv2d(c1, c2, 3, padding=1, use_bias=False, key=k2)
            self.bn2 = eqx.nn.BatchNorm(c2, axis_name="batch", momentum=0.9, eps=1e-5, mode="batch")
            self.pool = eqx.nn.MaxPool2d(2, 2)
            self.fc = eqx.nn.Linear(c2 * side * side, 10, key=k3)

        def __call__(self, x, state):  # one example, (image * image,)
            x = x.reshape(1, image, image)
            x, state = self.bn1(self.conv1(x), state)
            x = self.pool(jax.nn.relu(x))
            x, state = self.bn2(self.conv2(x), state)
            x = self.pool(jax.nn.relu(x))
            return self.fc(x.reshape(-1)), state

    model, state = eqx.nn.make_with_state(ConvNet)(jax.random.key(0))
    p = spec.params
    model = eqx.tree_at(lambda m: (m.conv1.weight, m.conv2.weight, m.bn1.weight, m.bn1.bias, m.bn2.weight,
                                   m.bn2.bias, m.fc.weight, m.fc.bias), model,
                        (p["conv1"]["weight"], p["conv2"]["weight"], p["bn1"]["weight"], p["bn1"]["bias"],
                         p["bn2"]["weight"], p["bn2"]["bias"], p["fc"]["weight"], p["fc"]["bias"]))
    model = _copy_arrays(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tx = spec.tx

    def loss_fn(params, state, x, y):
        m = eqx.combine(params, static)
        logits, state = jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
        return _xent(logits, y), (logits, state)

    def step(carry, batch):
        params, opt_state, state = carry
        x, y = batch
        (loss, (logits, state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, state), _metrics(logits, y, loss)

    def values(carry):
        m = carry[0]
        return {"conv1.weight": _np(m.conv1.weight), "conv2.weight": _np(m.conv2.weight),
                "bn1.weight": _np(m.bn1.weight), "bn1.bias": _np(m.bn1.bias), "bn2.weight": _np(m.bn2.weight),
                "bn2.bias": _np(m.bn2.bias), "fc.weight": _np(m.fc.weight), "fc.bias": _np(m.fc.bias)}

    return Peer((params, tx.init(params), state), step, values)


def _copy_arrays(tree):
    return jax.tree.map(lambda a: jnp.copy(a) if isinstance(a, jax.Array) else a, tree)


# ---------------------------------------------------------------------------------------- GPT
def _attention(q, k, v):
    """nanoGPT's attention (its non-flash branch), q/k/v ``(B, nh, T, hs)``."""
    T = q.shape[-2]
    att = (q @ jnp.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(k.shape[-1]))
    att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
    return jax.nn.softmax(att, axis=-1) @ v


def _heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def _merge_heads(y):
    B, nh, T, hs = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)


def _gpt_step(loss_fn, tx):
    def step(carry, batch):
        params, opt_state = carry
        x, y = batch
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), _metrics(logits, y, loss)

    return step


def _gpt_loss(forward):
    def loss_fn(params, x, y):
        logits = forward(params, x)
        return _xent(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), logits

    return loss_fn


def gpt_raw(spec) -> Peer:
    config = spec.ours_config

    def layer_norm(x, p):
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["weight"] + p["bias"]

    def linear(x, p):
        return x @ p["weight"].T + p["bias"]

    def forward(params, idx):
        t = params["transformer"]
        x = t["wte"]["weight"][idx] + t["wpe"]["weight"][: idx.shape[1]]
        for i in range(config.n_layer):
            b = t["h"][str(i)]
            q, k, v = jnp.split(linear(layer_norm(x, b["ln_1"]), b["attn"]["c_attn"]), 3, axis=2)
            y = _attention(*(_heads(a, config.n_head) for a in (q, k, v)))
            x = x + linear(_merge_heads(y), b["attn"]["c_proj"])
            h = jax.nn.gelu(linear(layer_norm(x, b["ln_2"]), b["mlp"]["c_fc"]), approximate=False)
            x = x + linear(h, b["mlp"]["c_proj"])
        return layer_norm(x, t["ln_f"]) @ t["wte"]["weight"].T  # the tied LM head

    tx = spec.tx
    # funcnet's params dict as plain arrays (its tied lm_head entry holds no array)
    params = _copy({"transformer": spec.params["transformer"]})

    def values(carry):
        return {k: _np(v) for k, v in funcnet.state_dict(carry[0]).items()}

    return Peer((params, tx.init(params)), _gpt_step(_gpt_loss(forward), tx), values)


def _gpt_names(config):
    """(torch name, per-block path) of every block parameter."""
    return [f"ln_1.{w}" for w in ("weight", "bias")] + [f"ln_2.{w}" for w in ("weight", "bias")] + \
        [f"{m}.{w}" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj") for w in ("weight", "bias")]


def gpt_flax(spec) -> Peer:
    from flax import nnx

    config = spec.ours_config
    C, nh = config.n_embd, config.n_head

    class Attention(nnx.Module):
        def __init__(self, rngs):
            self.c_attn = nnx.Linear(C, 3 * C, rngs=rngs)
            self.c_proj = nnx.Linear(C, C, rngs=rngs)

        def __call__(self, x):
            q, k, v = jnp.split(self.c_attn(x), 3, axis=2)
            return self.c_proj(_merge_heads(_attention(_heads(q, nh), _heads(k, nh), _heads(v, nh))))

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.c_fc, self.c_proj = nnx.Linear(C, 4 * C, rngs=rngs), nnx.Linear(4 * C, C, rngs=rngs)

        def __call__(self, x):
            return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=False))

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln_1, self.ln_2 = nnx.LayerNorm(C, epsilon=1e-5, rngs=rngs), nnx.LayerNorm(C, epsilon=1e-5, rngs=rngs)
            self.attn, self.mlp = Attention(rngs), MLP(rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nnx.Module):
        def __init__(self, rngs):
            self.wte = nnx.Embed(config.vocab_size, C, rngs=rngs)
            self.wpe = nnx.Embed(config.block_size, C, rngs=rngs)
            self.h = nnx.List([Block(rngs) for _ in range(config.n_layer)])
            self.ln_f = nnx.LayerNorm(C, epsilon=1e-5, rngs=rngs)

        def __call__(self, idx):
            x = self.wte(idx) + self.wpe(jnp.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            return self.wte.attend(self.ln_f(x))  # the tied LM head

    model = GPT(nnx.Rngs(0))
    sd = funcnet.state_dict(spec.params)
    model.wte.embedding[...] = sd["transformer.wte.weight"]
    model.wpe.embedding[...] = sd["transformer.wpe.weight"]
    model.ln_f.scale[...], model.ln_f.bias[...] = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
    for i, block in enumerate(model.h):
        for name in _gpt_names(config):
            path, kind = name.rsplit(".", 1)
            layer = block
            for part in path.split("."):
                layer = getattr(layer, part)
            value = sd[f"transformer.h.{i}.{name}"]
            if path.startswith("ln"):
                (layer.scale if kind == "weight" else layer.bias)[...] = value
            else:
                (layer.kernel if kind == "weight" else layer.bias)[...] = value.T if kind == "weight" else value
    graphdef, params = nnx.split(model, nnx.Param)
    params = _copy(params)  # the step donates them; spec's arrays stay for the other rows

    def forward(params, idx):
        return nnx.merge(graphdef, params, copy=True)(idx)

    def values(carry):
        m = nnx.merge(graphdef, carry[0])
        out = {"transformer.wte.weight": _np(m.wte.embedding[...]), "transformer.wpe.weight": _np(m.wpe.embedding[...]),
               "transformer.ln_f.weight": _np(m.ln_f.scale[...]), "transformer.ln_f.bias": _np(m.ln_f.bias[...])}
        for i, block in enumerate(m.h):
            for name in _gpt_names(config):
                path, kind = name.rsplit(".", 1)
                layer = block
                for part in path.split("."):
                    layer = getattr(layer, part)
                if path.startswith("ln"):
                    v = (layer.scale if kind == "weight" else layer.bias)[...]
                else:
                    v = layer.kernel[...].T if kind == "weight" else layer.bias[...]
                out[f"transformer.h.{i}.{name}"] = _np(v)
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return out

    tx = spec.tx
    return Peer((params, tx.init(params)), _gpt_step(_gpt_loss(forward), tx), values)


def gpt_equinox(spec) -> Peer:
    import equinox as eqx

    config = spec.ours_config
    C, nh = config.n_embd, config.n_head

    class Block(eqx.Module):
        ln_1: eqx.nn.LayerNorm
        c_attn: eqx.nn.Linear
        c_proj: eqx.nn.Linear
        ln_2: eqx.nn.LayerNorm
        c_fc: eqx.nn.Linear
        mlp_proj: eqx.nn.Linear

        def __init__(self, key):
            k = jax.random.split(key, 4)
            self.ln_1, self.ln_2 = eqx.nn.LayerNorm(C, eps=1e-5), eqx.nn.LayerNorm(C, eps=1e-5)
            self.c_attn, self.c_proj = eqx.nn.Linear(C, 3 * C, key=k[0]), eqx.nn.Linear(C, C, key=k[1])
            self.c_fc, self.mlp_proj = eqx.nn.Linear(C, 4 * C, key=k[2]), eqx.nn.Linear(4 * C, C, key=k[3])

        def __call__(self, x):  # one sequence, (T, C); equinox layers take one vector
            q, k, v = jnp.split(jax.vmap(self.c_attn)(jax.vmap(self.ln_1)(x)), 3, axis=1)
            y = _merge_heads(_attention(*(_heads(a[None], nh) for a in (q, k, v))))[0]
            x = x + jax.vmap(self.c_proj)(y)
            h = jax.nn.gelu(jax.vmap(self.c_fc)(jax.vmap(self.ln_2)(x)), approximate=False)
            return x + jax.vmap(self.mlp_proj)(h)

    class GPT(eqx.Module):
        wte: eqx.nn.Embedding
        wpe: eqx.nn.Embedding
        h: list
        ln_f: eqx.nn.LayerNorm

        def __init__(self, key):
            k = jax.random.split(key, 2 + config.n_layer)
            self.wte = eqx.nn.Embedding(config.vocab_size, C, key=k[0])
            self.wpe = eqx.nn.Embedding(config.block_size, C, key=k[1])
            self.h = [Block(kk) for kk in k[2:]]
            self.ln_f = eqx.nn.LayerNorm(C, eps=1e-5)

        def __call__(self, idx):  # one sequence, (T,)
            x = jax.vmap(self.wte)(idx) + jax.vmap(self.wpe)(jnp.arange(idx.shape[0]))
            for block in self.h:
                x = block(x)
            return jax.vmap(self.ln_f)(x) @ self.wte.weight.T  # the tied LM head

    sd = funcnet.state_dict(spec.params)
    where = {"ln_1.weight": lambda b: b.ln_1.weight, "ln_1.bias": lambda b: b.ln_1.bias,
             "ln_2.weight": lambda b: b.ln_2.weight, "ln_2.bias": lambda b: b.ln_2.bias,
             "attn.c_attn.weight": lambda b: b.c_attn.weight, "attn.c_attn.bias": lambda b: b.c_attn.bias,
             "attn.c_proj.weight": lambda b: b.c_proj.weight, "attn.c_proj.bias": lambda b: b.c_proj.bias,
             "mlp.c_fc.weight": lambda b: b.c_fc.weight, "mlp.c_fc.bias": lambda b: b.c_fc.bias,
             "mlp.c_proj.weight": lambda b: b.mlp_proj.weight, "mlp.c_proj.bias": lambda b: b.mlp_proj.bias}
    top = {"transformer.wte.weight": lambda m: m.wte.weight, "transformer.wpe.weight": lambda m: m.wpe.weight,
           "transformer.ln_f.weight": lambda m: m.ln_f.weight, "transformer.ln_f.bias": lambda m: m.ln_f.bias}
    getters = dict(top)
    for i in range(config.n_layer):
        for name, get in where.items():
            getters[f"transformer.h.{i}.{name}"] = (lambda get, i: lambda m: get(m.h[i]))(get, i)
    model = GPT(jax.random.key(0))
    names = list(getters)
    model = eqx.tree_at(lambda m: [getters[n](m) for n in names], model, [jnp.array(sd[n]) for n in names])
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def forward(params, idx):
        return jax.vmap(eqx.combine(params, static))(idx)

    def values(carry):
        m = carry[0]
        out = {n: _np(get(m)) for n, get in getters.items()}
        out["lm_head.weight"] = out["transformer.wte.weight"]
        return out

    tx = spec.tx
    return Peer((params, tx.init(params)), _gpt_step(_gpt_loss(forward), tx), values)


# --------------------------------------------------------------------------------------- LSTM
def _lstm_sizes(spec):
    rnn = spec.params["rnn"]
    layers = sum(1 for k in rnn if k.startswith("weight_ih_l"))
    return layers, rnn["weight_hh_l0"].shape[1]


def _lstm_gates(lin, c):
    """torch's LSTM cell after its two matmuls: gates i, f, g, o; new (h, c)."""
    i, f, g, o = jnp.split(lin, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def _lstm_step(forward, tx):
    """The step of a language model whose ``forward(params, x)`` gives logits ``(B, T, vocab)``."""

    def loss_fn(params, x, y):
        logits = forward(params, x)
        return _xent(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), logits

    def step(carry, batch):
        params, opt_state = carry
        x, y = batch
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), _metrics(logits, y, loss)

    return step


def lstm_raw(spec) -> Peer:
    """The LSTM by hand: one ``lax.scan`` over time whose body steps every layer (each layer's
    input projection inside the loop, as torch's ``LSTMCell``), the tied decoder after it."""
    layers, hidden = _lstm_sizes(spec)

    def forward(p, idx):
        rnn = p["rnn"]
        emb = p["encoder"]["weight"][idx.T]  # (T, B, E), time first for the scan
        zeros = jnp.zeros((idx.shape[0], hidden), emb.dtype)

        def body(carry, x):
            new = []
            for k, (h, c) in enumerate(carry):
                lin = (x @ rnn[f"weight_ih_l{k}"].T + rnn[f"bias_ih_l{k}"]
                       + h @ rnn[f"weight_hh_l{k}"].T + rnn[f"bias_hh_l{k}"])
                x, c = _lstm_gates(lin, c)
                new.append((x, c))
            return new, x

        _, out = jax.lax.scan(body, [(zeros, zeros)] * layers, emb)
        logits = out @ p["encoder"]["weight"].T + p["decoder"]["bias"]  # the tied decoder
        return logits.swapaxes(0, 1)

    # funcnet's params dict as plain arrays (its tied decoder weight holds no array)
    params = _copy({"encoder": spec.params["encoder"], "rnn": spec.params["rnn"],
                    "decoder": {"bias": spec.params["decoder"]["bias"]}})

    def values(carry):
        p = carry[0]
        out = {"encoder.weight": _np(p["encoder"]["weight"]), "decoder.weight": _np(p["encoder"]["weight"]),
               "decoder.bias": _np(p["decoder"]["bias"])}
        return out | {f"rnn.{k}": _np(v) for k, v in p["rnn"].items()}

    tx = spec.tx
    return Peer((params, tx.init(params)), _lstm_step(forward, tx), values)


def lstm_flax(spec) -> Peer:
    """flax's ``nnx.OptimizedLSTMCell`` (gates i, f, g, o as torch's, one matmul per input) under
    ``nnx.RNN``, one per layer. flax's cell has one bias, on its hidden-state Linear; torch has
    two (``b_ih`` and ``b_hh``), each trained, so the input Linear gets a bias too: the same
    parameters and updates as torch's."""
    from flax import nnx

    layers, hidden = _lstm_sizes(spec)
    vocab, emb = spec.params["encoder"]["weight"].shape

    class LSTMLM(nnx.Module):
        def __init__(self, rngs):
            self.encoder = nnx.Embed(vocab, emb, rngs=rngs)
            self.layers = nnx.List([])
            for k in range(layers):
                cell = nnx.OptimizedLSTMCell(emb if k == 0 else hidden, hidden, rngs=rngs)
                cell.dense_i = nnx.Linear(cell.in_features, 4 * hidden, use_bias=True, rngs=rngs)  # torch's b_ih
                self.layers.append(nnx.RNN(cell, rngs=False))
            self.bias = nnx.Param(jnp.zeros((vocab,)))  # the decoder's; its weight is the encoder's

        def __call__(self, idx):  # (B, T), batch first as nnx.RNN's default
            x = self.encoder(idx)
            zeros = jnp.zeros((idx.shape[0], hidden), x.dtype)
            for layer in self.layers:
                x = layer(x, initial_carry=(zeros, zeros))  # (c, h), as torch's init_hidden
            return self.encoder.attend(x) + self.bias[...]

    model = LSTMLM(nnx.Rngs(0))
    p = spec.params
    model.encoder.embedding[...] = p["encoder"]["weight"]
    model.bias[...] = p["decoder"]["bias"]
    for k, layer in enumerate(model.layers):
        cell, rnn = layer.cell, p["rnn"]
        cell.dense_i.kernel[...] = rnn[f"weight_ih_l{k}"].T
        cell.dense_i.bias[...] = rnn[f"bias_ih_l{k}"]
        cell.dense_h.kernel[...] = rnn[f"weight_hh_l{k}"].T
        cell.dense_h.bias[...] = rnn[f"bias_hh_l{k}"]
    graphdef, params = nnx.split(model, nnx.Param)
    params = _copy(params)  # the step donates them; spec's arrays stay for the other rows

    def forward(params, idx):
        return nnx.merge(graphdef, params, copy=True)(idx)

    def values(carry):
        m = nnx.merge(graphdef, carry[0])
        out = {"encoder.weight": _np(m.encoder.embedding[...]), "decoder.weight": _np(m.encoder.embedding[...]),
               "decoder.bias": _np(m.bias[...])}
        for k, layer in enumerate(m.layers):
            cell = layer.cell
            out |= {f"rnn.weight_ih_l{k}": _np(cell.dense_i.kernel[...]).T,
                    f"rnn.bias_ih_l{k}": _np(cell.dense_i.bias[...]),
                    f"rnn.weight_hh_l{k}": _np(cell.dense_h.kernel[...]).T,
                    f"rnn.bias_hh_l{k}": _np(cell.dense_h.bias[...])}
        return out

    tx = spec.tx
    return Peer((params, tx.init(params)), _lstm_step(forward, tx), values)


def lstm_equinox(spec) -> Peer:
    """``eqx.nn.LSTMCell`` per layer under ``jax.lax.scan``, one sequence at a time (``jax.vmap``
    over the batch), equinox's idiom. Its cell has one bias; torch's two (``b_ih``, ``b_hh``)
    are two leaves here, summed into the cell's bias (``eqx.tree_at``) before the scan."""
    import equinox as eqx

    layers, hidden = _lstm_sizes(spec)
    vocab, emb = spec.params["encoder"]["weight"].shape

    class LSTMLM(eqx.Module):
        encoder: eqx.nn.Embedding
        cells: list
        bias_ih: list
        bias: jax.Array  # the decoder's; its weight is the encoder's

        def __init__(self, key):
            k = jax.random.split(key, 1 + layers)
            self.encoder = eqx.nn.Embedding(vocab, emb, key=k[0])
            self.cells = [eqx.nn.LSTMCell(emb if i == 0 else hidden, hidden, key=k[1 + i]) for i in range(layers)]
            self.bias_ih = [jnp.zeros((4 * hidden,)) for _ in range(layers)]
            self.bias = jnp.zeros((vocab,))

        def __call__(self, idx):  # one sequence, (T,)
            x = jax.vmap(self.encoder)(idx)
            for cell, b_ih in zip(self.cells, self.bias_ih):
                cell = eqx.tree_at(lambda c: c.bias, cell, cell.bias + b_ih)

                def body(carry, x_t, cell=cell):
                    carry = cell(x_t, carry)
                    return carry, carry[0]

                zeros = jnp.zeros((hidden,), x.dtype)
                _, x = jax.lax.scan(body, (zeros, zeros), x)
            return x @ self.encoder.weight.T + self.bias  # the tied decoder

    rnn = spec.params["rnn"]
    model = LSTMLM(jax.random.key(0))
    def layer_leaves(k):
        return {f"rnn.weight_ih_l{k}": lambda m: m.cells[k].weight_ih,
                f"rnn.weight_hh_l{k}": lambda m: m.cells[k].weight_hh,
                f"rnn.bias_hh_l{k}": lambda m: m.cells[k].bias, f"rnn.bias_ih_l{k}": lambda m: m.bias_ih[k]}

    leaves = {"encoder.weight": lambda m: m.encoder.weight, "decoder.bias": lambda m: m.bias}
    for k in range(layers):
        leaves |= layer_leaves(k)
    sd = {"encoder.weight": spec.params["encoder"]["weight"], "decoder.bias": spec.params["decoder"]["bias"]}
    sd |= {f"rnn.{k}": v for k, v in rnn.items()}
    names = list(leaves)
    model = eqx.tree_at(lambda m: [leaves[n](m) for n in names], model, [jnp.array(sd[n]) for n in names])
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def forward(params, idx):
        return jax.vmap(eqx.combine(params, static))(idx)

    def values(carry):
        out = {n: _np(get(carry[0])) for n, get in leaves.items()}
        out["decoder.weight"] = out["encoder.weight"]
        return out

    tx = spec.tx
    return Peer((params, tx.init(params)), _lstm_step(forward, tx), values)


PEERS = {
    "convnet": {"raw JAX": convnet_raw, "flax nnx": convnet_flax, "equinox": convnet_equinox},
    "gpt": {"raw JAX": gpt_raw, "flax nnx": gpt_flax, "equinox": gpt_equinox},
    "lstm": {"raw JAX": lstm_raw, "flax nnx": lstm_flax, "equinox": lstm_equinox},
}


def build(spec, impl: str) -> Peer:
    builders = PEERS.get(spec.name, {})
    if impl not in builders:
        raise ValueError(f"no {impl!r} peer for model {spec.name!r}; peers: {sorted(builders)}")
    return builders[impl](spec)
