"""Tensor parallelism (Megatron-LM) for the GPT, alone or on a 2-D/3-D mesh with FSDP, as sharding rules.

torch counterpart: ``torch.distributed.tensor.parallel.parallelize_module(block, mesh,
{"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(), ...})`` on DTensor.
Here there is no parallel layer and no second model: the rules below give each parameter
of ``funcnet.gpt.GPT`` a ``PartitionSpec`` over a mesh ``(data, fsdp, model)``, the step
is ``jax.jit``-ed with those shardings, and XLA's partitioner inserts the collectives
Megatron writes by hand (``collective_stats`` reads them from the compiled HLO).

The rules (Shoeybi et al. 2019, "Megatron-LM", section 3), on the ``model`` axis:

- ``attn.c_attn`` and ``mlp.c_fc`` are **column-parallel**: weight ``(out, in)`` split
  along ``out``, bias too. Each device computes its slice of the outputs from the whole
  (replicated) input: no communication. For ``c_attn`` the slice must hold whole heads
  with their q, k and v, so the GPT packs its 3C outputs in ``qkv_groups`` groups of
  ``[q, k, v]`` (``pack_qkv``; Megatron packs per head for the same reason); heads then
  split over the devices and attention runs locally.
- ``attn.c_proj`` and ``mlp.c_proj`` are **row-parallel**: weight split along ``in``,
  bias replicated. Each device multiplies its slice of the features by its slice of
  the weight: a partial sum, which one all-reduce completes (Megatron's ``g``). The
  GELU sits between the two MLP matmuls, elementwise on the split features, which is
  why the column-then-row order needs no communication inside the pair.
- Per layer that is 2 all-reduces forward (after each row-parallel linear) and 2
  backward (the gradient of the replicated input of each column-parallel pair,
  Megatron's ``f``): ``MEGATRON_ALL_REDUCES_PER_LAYER = 4``.
- ``transformer.wte`` (tied to ``lm_head``) is **split by vocabulary** (``vocab="split"``,
  Megatron's VocabParallelEmbedding and parallel cross entropy): it is the largest
  matrix of a small-vocabulary-times-wide model (50257 x 4096 = 0.2B in GPT-2's vocab),
  and replicating it would keep 1/t of nothing; the lookup becomes a masked local gather
  plus an all-reduce, the logits stay split and the softmax's max and sum are
  all-reduced. ``vocab="replicate"`` keeps it whole on every model device (fewer
  collectives; right when V x C is small against the blocks).
- ``wpe`` and the LayerNorms are replicated over ``model`` (tiny; their inputs are whole).

On the ``fsdp`` axis each matrix is also split along its other axis (ZeRO-3, as
``funcnet.parallel.fsdp``), and the batch is split over ``data`` x ``fsdp``. Optimizer state
follows the params leaf for leaf.

``mlp_shard_map(mesh)``: the MLP block written out with ``jax.shard_map`` and an explicit
``psum``: the collective that jit inserts, by hand (torch's RowwiseParallel does the same
``all_reduce`` inside its output hook).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import losses as _losses
from funcnet import step as _step

__all__ = [
    "AXES",
    "MEGATRON_ALL_REDUCES_PER_LAYER",
    "check_config",
    "collective_stats",
    "make_tp_step",
    "mesh",
    "mlp_shard_map",
    "pack_qkv",
    "param_spec",
    "regroup_qkv",
    "state_shardings",
    "unpack_qkv",
]

AXES = ("data", "fsdp", "model")
MEGATRON_ALL_REDUCES_PER_LAYER = 4  # 2 forward (after attn.c_proj, mlp.c_proj), 2 backward (Megatron's f)
VOCAB = ("split", "replicate")
_COLUMN = (("attn", "c_attn"), ("mlp", "c_fc"))
_ROW = (("attn", "c_proj"), ("mlp", "c_proj"))


def mesh(data: int = 1, fsdp: int = 1, model: int = 1, devices=None) -> Mesh:
    """A ``(data, fsdp, model)`` mesh of the first ``data * fsdp * model`` devices; ``model``
    is the innermost axis (neighbouring devices: on GPUs the NVLink-connected ones)."""
    devices = jax.devices() if devices is None else list(devices)
    sizes = {"data": data, "fsdp": fsdp, "model": model}
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"parallel.tensor.mesh: {name} must be a positive int, got {n!r}")
    n = data * fsdp * model
    if n > len(devices):
        raise ValueError(f"parallel.tensor.mesh: data x fsdp x model = {data} x {fsdp} x {model} = {n} devices, but "
                         f"{len(devices)} are there; on CPU simulate more with XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={n} before JAX starts")
    return Mesh(np.asarray(devices[:n], dtype=object).reshape(data, fsdp, model), AXES)


def _axis_size(mesh: Mesh, name: str) -> int:
    return int(mesh.shape[name]) if name in mesh.shape else 1


def check_config(config, mesh: Mesh, vocab: str = "split") -> None:
    """Raise, naming the fix, unless the GPT ``config`` splits over ``mesh``'s model axis."""
    t = _axis_size(mesh, "model")
    if vocab not in VOCAB:
        raise ValueError(f"vocab must be one of {VOCAB}, got {vocab!r}")
    if config.n_head % t:
        raise ValueError(f"tensor parallelism splits heads: n_head={config.n_head} must be divisible by the model "
                         f"axis ({t}); pick a model axis among the divisors of {config.n_head}")
    if config.qkv_groups % t:
        raise ValueError(f"tensor parallelism over {t} devices needs c_attn packed in a multiple of {t} groups: "
                         f"GPTConfig(..., qkv_groups={t}) and its params through parallel.tensor.pack_qkv(params, "
                         f"{t}); got qkv_groups={config.qkv_groups}")
    if vocab == "split" and config.vocab_size % t:
        raise ValueError(f"vocab='split' needs vocab_size={config.vocab_size} divisible by the model axis ({t}); "
                         f"pad the vocabulary (nanoGPT pads 50257 to 50304) or pass vocab='replicate'")


def regroup_qkv(a, groups_from: int, groups_to: int, n_head: int):
    """``c_attn``'s rows (or bias) packed in ``groups_from`` groups of (q, k, v) heads, repacked in
    ``groups_to`` groups: ``pack_qkv`` and its inverse both go through torch's order (3, heads, hs)."""
    # rows (gf, 3, heads/gf, hs) -> (gt, 3, heads/gt, hs); via the head order (3, heads, hs)
    xp = jnp if isinstance(a, jax.Array) else np
    rows, rest = a.shape[0], a.shape[1:]
    hs = rows // (3 * n_head)
    a = xp.reshape(a, (groups_from, 3, n_head // groups_from, hs) + rest)
    a = xp.moveaxis(a, 0, 1)  # (3, gf, heads/gf, hs, ...) == (3, heads, hs, ...)
    a = xp.reshape(a, (3, groups_to, n_head // groups_to, hs) + rest)
    return xp.reshape(xp.moveaxis(a, 1, 0), (rows,) + rest)


def _map_c_attn(params: dict, fn) -> dict:
    out = jax.tree.map(lambda a: a, params)  # a copy of the containers
    for block in out["transformer"]["h"].values():
        block["attn"]["c_attn"] = {k: fn(v) for k, v in block["attn"]["c_attn"].items()}
    return out


def pack_qkv(params: dict, groups: int, n_head: int, *, current: int = 1) -> dict:
    """The GPT's params with ``c_attn``'s rows regrouped from ``current`` groups of [q, k, v]
    (1: nanoGPT's ``[q | k | v]``) into ``groups`` (for ``GPTConfig(qkv_groups=groups)``):
    the same function of the input, each device's contiguous slice holding its heads."""
    return _map_c_attn(params, lambda a: regroup_qkv(a, current, groups, n_head))


def unpack_qkv(params: dict, groups: int, n_head: int) -> dict:
    """``pack_qkv``'s inverse: back to nanoGPT's ``[q | k | v]`` (to compare with one device or torch)."""
    return _map_c_attn(params, lambda a: regroup_qkv(a, groups, 1, n_head))


def _names(path) -> tuple:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def param_spec(names: tuple, shape: tuple, mesh: Mesh, *, vocab: str = "split") -> P:
    """The ``PartitionSpec`` of the GPT parameter at ``names`` (its path, e.g.
    ``("transformer", "h", "0", "attn", "c_attn", "weight")``; optimizer-state paths end the
    same way) with ``shape``, by the rules in the module docstring."""
    f = _axis_size(mesh, "fsdp")
    fs = lambda d: "fsdp" if f > 1 and d % f == 0 else None
    owner = names[-3:-1]
    if len(shape) == 2 and owner in _COLUMN:
        return P("model", fs(shape[1]))
    if len(shape) == 1 and owner in _COLUMN:
        return P("model")
    if len(shape) == 2 and owner in _ROW:
        return P(fs(shape[0]), "model")
    if len(shape) == 2 and names[-2:] == ("wte", "weight"):
        return P("model", fs(shape[1])) if vocab == "split" else P(fs(shape[0]), None)
    if len(shape) == 2 and names[-2:] == ("wpe", "weight"):
        return P(None, fs(shape[1]))
    return P()  # LayerNorms, row-parallel biases, step counters


def state_shardings(state: _step.TrainState, mesh: Mesh, *, vocab: str = "split"):
    """``NamedSharding``s of a ``TrainState`` (params and optimizer state by ``param_spec``, the rest replicated)."""
    def by_rule(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, a: NamedSharding(mesh, param_spec(_names(path), tuple(a.shape), mesh, vocab=vocab)), tree)

    replicated = NamedSharding(mesh, P())
    rep = lambda tree: jax.tree.map(lambda _: replicated, tree)
    return state._replace(params=by_rule(state.params), opt_state=by_rule(state.opt_state), step=replicated,
                          key=replicated, loss_scale=rep(state.loss_scale), model_state=rep(state.model_state))


def make_tp_step(model, tx, loss_fn: Callable = _losses.cross_entropy, mesh: Mesh | None = None, *, state: Any,
                 vocab: str = "split", config=None, donate: bool = True, **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: ``funcnet.make_step``'s step jit-ed over a
    ``(data, fsdp, model)`` mesh with the state placed by the rules and the batch split over
    ``data`` x ``fsdp``. ``state``: a ``TrainState`` or its ``jax.eval_shape``. The returned
    step has ``.shardings`` (for ``jax.device_put(state, step.shardings)``), ``.batch_sharding``,
    ``.raw`` and ``.mesh``. ``config`` (the ``GPTConfig``), when given, is checked against the
    mesh first (``check_config``)."""
    if mesh is None:
        raise ValueError("make_tp_step needs mesh= (parallel.tensor.mesh(data, fsdp, model))")
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(f"make_tp_step: the mesh's axes must be {AXES}, got {mesh.axis_names}; build it with "
                         f"parallel.tensor.mesh(data=, fsdp=, model=)")
    if config is not None:
        check_config(config, mesh, vocab)
    shardings = state_shardings(state, mesh, vocab=vocab)
    split = NamedSharding(mesh, P(("data", "fsdp")))
    raw = _step.make_step(model, tx, loss_fn, donate=False, **step_options).raw

    def sharded(state, batch):
        new_state, metrics = raw(state, batch)
        return jax.lax.with_sharding_constraint(new_state, shardings), metrics

    step = jax.jit(sharded, in_shardings=(shardings, split), out_shardings=(shardings, NamedSharding(mesh, P())),
                   donate_argnums=(0,) if donate else ())
    step.raw, step.shardings, step.batch_sharding, step.mesh = sharded, shardings, split, mesh
    return step


_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "u64": 8, "s32": 4, "u32": 4, "s16": 2, "u16": 2,
          "s8": 1, "u8": 1, "pred": 1}
_SHAPE = re.compile(r"\b(f64|f32|bf16|f16|s64|u64|s32|u32|s16|u16|s8|u8|pred)\[([0-9,]*)\]")


def collective_stats(compiled_or_text) -> dict[str, dict[str, int]]:
    """Each collective in the compiled HLO: ``{op: {"count": n, "bytes": result bytes summed}}``
    (``-start`` forms counted once; a combined (tuple) collective counts once, its bytes all)."""
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    text = re.sub(r"/\*index=\d+\*/", "", text)  # a long tuple's type holds these; their '=' ends no result
    out = {}
    for op in _OPS:
        count = nbytes = 0
        for m in re.finditer(rf"= ([^=\n]*?) {op}(?:-start)?\(", text):
            count += 1
            shapes = _SHAPE.findall(m.group(1))
            if "-start" in m.group(0) and op != "all-reduce" and len(shapes) > 1:
                shapes = shapes[len(shapes) // 2:]  # an async start's type is (operands, results)
            nbytes += sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d) for t, dims in shapes)
        out[op] = {"count": count, "bytes": nbytes}
    return out


def mlp_shard_map(mesh: Mesh) -> Callable:
    """``mlp(params, x)``: the GPT's MLP (``params`` = a block's ``"mlp"`` entry, x ``(B, T, C)``)
    with the Megatron split written by hand: ``c_fc`` column-parallel, GELU on the local
    features, ``c_proj`` row-parallel, then ``psum`` over ``model``: the all-reduce that jit
    inserts by itself. Differentiable (the psum's transpose is the backward's copy)."""
    spec = {"c_fc": {"weight": P("model", None), "bias": P("model")},
            "c_proj": {"weight": P(None, "model"), "bias": P()}}

    def local(params, x):
        h = x @ params["c_fc"]["weight"].T + params["c_fc"]["bias"]
        h = jax.nn.gelu(h, approximate=False)
        partial_sum = h @ params["c_proj"]["weight"].T  # this device's share of every output
        return jax.lax.psum(partial_sum, "model") + params["c_proj"]["bias"]

    def mlp(params, x):
        params = {k: {n: params[k][n] for n in ("weight", "bias")} for k in ("c_fc", "c_proj")}
        return jax.shard_map(local, mesh=mesh, in_specs=(spec, P()), out_specs=P())(params, x)

    return mlp
