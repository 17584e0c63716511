"""Tensor parallelism (Megatron-LM) by a plan, alone or on a 2-D/3-D mesh with FSDP, as sharding rules.

torch counterpart: ``torch.distributed.tensor.parallel.parallelize_module(model, mesh,
{"blocks.*.mlp.fc": ColwiseParallel(), "blocks.*.mlp.proj": RowwiseParallel(), ...})`` on
DTensor. Here there is no parallel layer and no second model: a plan, ``{module-path pattern:
style}`` with the styles ``ColwiseParallel()``, ``RowwiseParallel()``, ``Shard(dim)`` and
``Replicate()``, gives each parameter of any funcnet or converted model (``interop.convert``;
the paths are its ``state_dict`` keys less ``.weight``/``.bias``, ``*`` matching any run of
characters) a ``PartitionSpec`` over a mesh ``(data, fsdp, model)``, the step is
``jax.jit``-ed with those shardings, and XLA's partitioner inserts the collectives Megatron
writes by hand (``collective_stats`` reads them from the compiled HLO). A plan is a layout,
not a rewrite: any plan computes the model's own function, and a good one (column then row,
as below) needs no communication between the pair. ``make_tp_step(..., plan=)`` and
``fit(strategy=Strategy("tp", plan=...))`` take one; a pattern that matches no parameter, a
plan that splits nothing, or a model other than the GPT without a plan is refused.

Sequence parallelism (torch's ``SequenceParallel`` for the norms, splitting activations
along the sequence) is not offered: a norm's params stay whole (``Replicate``), which is what
torch's style does with them too.

The GPT's plan is ``gpt_plan(vocab)``; its rules (Shoeybi et al. 2019, "Megatron-LM", section 3), on the ``model`` axis:

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

import ast
import fnmatch
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import losses as _losses
from funcnet import step as _step
from funcnet.nn.functional.activation import gelu

__all__ = [
    "AXES",
    "MEGATRON_ALL_REDUCES_PER_LAYER",
    "ColwiseParallel",
    "Replicate",
    "RowwiseParallel",
    "Shard",
    "check_config",
    "check_plan",
    "collective_stats",
    "make_tp_step",
    "mesh",
    "gpt_config_of",
    "gpt_plan",
    "mlp_shard_map",
    "pack_qkv",
    "param_spec",
    "plan_spec",
    "regroup_qkv",
    "state_shardings",
    "unpack_qkv",
]

AXES = ("data", "fsdp", "model")
MEGATRON_ALL_REDUCES_PER_LAYER = 4  # 2 forward (after attn.c_proj, mlp.c_proj), 2 backward (Megatron's f)
VOCAB = ("split", "replicate")


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


class ColwiseParallel(NamedTuple):
    """torch's ``ColwiseParallel``: the module's output features split over ``model``: a Linear's
    weight ``(out, in)`` along ``out`` and its bias with it; an Embedding's ``(num, dim)`` along ``dim``."""


class RowwiseParallel(NamedTuple):
    """torch's ``RowwiseParallel``: the module's input features split over ``model``: a Linear's (or a
    convolution's) weight along its axis 1, the bias whole (added once after the all-reduce); an
    Embedding's ``(num, dim)`` along ``num`` (the vocabulary: a masked local lookup + an all-reduce)."""


class Shard(NamedTuple):
    """The matched parameters split along axis ``dim`` over ``model`` (torch's ``Shard(dim)``
    placement); parameters with fewer axes stay whole."""

    dim: int


class Replicate(NamedTuple):
    """The matched parameters whole on every ``model`` device (torch's ``Replicate()``); what every
    parameter no pattern matches gets."""


STYLES = (ColwiseParallel, RowwiseParallel, Shard, Replicate)


def gpt_plan(vocab: str = "split") -> dict:
    """Megatron's rules for ``funcnet.gpt.GPT`` as a plan (the module docstring says why each):
    ``c_attn``, ``c_fc`` column-parallel, both ``c_proj`` row-parallel, the tied embedding split by
    vocabulary (``vocab="split"``) or whole (``"replicate"``). The patterns start with ``*`` so they
    also match the optimizer state's paths and the pipeline's stacked blocks."""
    if vocab not in VOCAB:
        raise ValueError(f"vocab must be one of {VOCAB}, got {vocab!r}")
    return {"*attn.c_attn": ColwiseParallel(), "*mlp.c_fc": ColwiseParallel(),
            "*attn.c_proj": RowwiseParallel(), "*mlp.c_proj": RowwiseParallel(),
            "*wte": Shard(0) if vocab == "split" else Replicate()}


def _style_of(plan: dict, names: tuple):
    """``(pattern, style)`` of the first pattern of ``plan`` matching the parameter at ``names``
    (its module's dotted path or its own), or ``(None, Replicate())``."""
    module, full = ".".join(names[:-1]), ".".join(names)
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(full, pattern):
            return pattern, style
    return None, Replicate()


def _model_dim(style, shape: tuple, embedding: bool) -> int | None:
    """The axis of a parameter of ``shape`` that ``style`` splits over ``model`` (None: whole)."""
    nd = len(shape)
    if isinstance(style, ColwiseParallel):
        return (1 if nd == 2 else None) if embedding else (0 if nd >= 1 else None)
    if isinstance(style, RowwiseParallel):
        return (0 if nd == 2 else None) if embedding else (1 if nd >= 2 else None)
    if isinstance(style, Shard):
        return style.dim if style.dim < nd else None
    return None


def plan_spec(plan: dict, names: tuple, shape: tuple, mesh: Mesh, *, embeddings: frozenset = frozenset()) -> P:
    """The ``PartitionSpec`` of the parameter at ``names`` with ``shape`` under ``plan``: its style's
    axis on ``model``; with an ``fsdp`` axis, every matrix's largest other axis that the fsdp size
    divides on ``fsdp`` too. ``embeddings``: the dotted paths of the model's Embedding modules
    (their weight is ``(num, dim)``, not a Linear's ``(out, in)``). Raises, naming the parameter and
    the fix, when the model axis does not divide the axis the style splits."""
    t, f = _axis_size(mesh, "model"), _axis_size(mesh, "fsdp")
    pattern, style = _style_of(plan, names)
    axes = [None] * len(shape)
    d = _model_dim(style, shape, ".".join(names[:-1]) in embeddings)
    if d is not None and t > 1:
        if shape[d] % t:
            raise ValueError(f"tensor plan: {'.'.join(names)} of shape {tuple(shape)} (pattern {pattern!r}, "
                             f"{type(style).__name__}) is split along axis {d} of size {shape[d]}, which the model "
                             f"axis ({t}) does not divide; pick a model axis among the divisors of {shape[d]} or map "
                             f"{pattern!r} to Replicate()")
        axes[d] = "model"
    if f > 1 and len(shape) >= 2:
        free = [i for i, n in enumerate(shape) if axes[i] is None and n % f == 0]
        if free:
            axes[max(free, key=lambda i: (shape[i], -i))] = "fsdp"
    return P(*axes) if any(axes) else P()


def param_spec(names: tuple, shape: tuple, mesh: Mesh, *, vocab: str = "split") -> P:
    """The ``PartitionSpec`` of the GPT parameter at ``names`` (its path, e.g.
    ``("transformer", "h", "0", "attn", "c_attn", "weight")``; optimizer-state paths end the
    same way) with ``shape``, by ``gpt_plan(vocab)``."""
    return plan_spec(gpt_plan(vocab), names, shape, mesh)


def _embeddings(model) -> frozenset:
    """The dotted paths of ``model``'s ``nn.Embedding`` modules (by their torch-style name)."""
    out = set()

    def visit(m, prefix):
        if str(getattr(m, "name", "")).startswith("Embedding("):
            out.add(prefix[:-1])
        for n, c in getattr(m, "children", None) or ():
            if hasattr(c, "children") and hasattr(c, "init"):
                visit(c, f"{prefix}{n}.")

    if model is not None:
        visit(model, "")
    return frozenset(out)


def gpt_config_of(model):
    """The ``GPTConfig`` of a ``funcnet.gpt.GPT`` (read off its name, which lists the config), or
    None for any other model."""
    from funcnet import gpt

    m = re.fullmatch(r"GPT\((.*)\)", str(getattr(model, "name", "")))
    if m is None:
        return None
    fields = {}
    for item in m.group(1).split(", "):
        key, _, value = item.partition("=")
        if key in gpt.GPTConfig._fields:
            try:
                fields[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                return None
    return gpt.GPTConfig(**fields) if {"vocab_size", "n_head", "n_layer"} <= set(fields) else None


def _module_list(params, most: int = 8) -> str:
    """The dotted paths of the modules owning ``params``' leaves, the first ``most`` of them."""
    modules = []
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        m = ".".join(_names(path)[:-1])
        if m not in modules:
            modules.append(m)
    return ", ".join(modules[:most]) + (", ..." if len(modules) > most else "")


def check_plan(plan: Any, params: Any, mesh: Mesh, *, model=None) -> None:
    """Raise, in one line naming the fix, unless ``plan`` is a dict of pattern -> style whose every
    pattern matches a parameter of ``params`` and which splits some parameter over ``model``."""
    if not isinstance(plan, dict) or not plan:
        raise TypeError(f"tensor plan: expected a dict of module-path pattern -> ColwiseParallel() / "
                        f"RowwiseParallel() / Shard(dim) / Replicate(), e.g. {{'blocks.*.fc': ColwiseParallel()}}, "
                        f"got {plan!r:.80}")
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not isinstance(style, STYLES):
            raise TypeError(f"tensor plan: {pattern!r}: {style!r:.60} is not a style; use ColwiseParallel(), "
                            f"RowwiseParallel(), Shard(dim) or Replicate() from funcnet.parallel.tensor")
    names = [_names(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    for pattern in plan:
        if not any(_style_of({pattern: Replicate()}, n)[0] for n in names):
            raise ValueError(f"tensor plan: pattern {pattern!r} matches no parameter of the model; its modules are "
                             f"{_module_list(params)} ('*' matches any run of characters, dots included)")
    if _axis_size(mesh, "model") > 1:
        emb = _embeddings(model)
        split = [n for n, (_, a) in zip(names, jax.tree_util.tree_flatten_with_path(params)[0])
                 if "model" in plan_spec(plan, n, tuple(a.shape), mesh, embeddings=emb)]
        if not split:
            raise ValueError(f"tensor plan {list(plan)}: no parameter is split over the model axis (every match is "
                             f"Replicate or too small), so each device would hold the whole model; map the large "
                             f"matrices to ColwiseParallel() / RowwiseParallel()")


def state_shardings(state: _step.TrainState, mesh: Mesh, *, vocab: str = "split", plan: dict | None = None,
                    model=None):
    """``NamedSharding``s of a ``TrainState``: params by ``plan`` (default: the GPT's, ``gpt_plan(vocab)``),
    each optimizer-state array as the parameter whose path its own ends with (Adam's ``mu``, ``nu``),
    the rest replicated. ``model``: to tell its Embeddings apart (see ``plan_spec``)."""
    plan = gpt_plan(vocab) if plan is None else plan
    emb = _embeddings(model)
    shapes = {_names(path): tuple(a.shape) for path, a in jax.tree_util.tree_flatten_with_path(state.params)[0]}

    def spec(names, shape):
        for k in range(len(names)):  # the longest suffix that names a parameter of the same shape
            if shapes.get(names[k:]) == shape:
                return plan_spec(plan, names[k:], shape, mesh, embeddings=emb)
        return P()

    def by_plan(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, a: NamedSharding(mesh, spec(_names(path), tuple(a.shape))), tree)

    replicated = NamedSharding(mesh, P())
    rep = lambda tree: jax.tree.map(lambda _: replicated, tree)
    return state._replace(params=by_plan(state.params), opt_state=by_plan(state.opt_state), step=replicated,
                          key=replicated, loss_scale=rep(state.loss_scale), model_state=rep(state.model_state))


def make_tp_step(model, tx, loss_fn: Callable = _losses.cross_entropy, mesh: Mesh | None = None, *, state: Any,
                 plan: dict | None = None, vocab: str = "split", config=None, donate: bool = True, **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: ``funcnet.make_step``'s step jit-ed over a
    ``(data, fsdp, model)`` mesh with the state placed by ``plan`` and the batch split over
    ``data`` x ``fsdp``. ``state``: a ``TrainState`` or its ``jax.eval_shape``. The returned
    step has ``.shardings`` (for ``jax.device_put(state, step.shardings)``), ``.batch_sharding``,
    ``.raw`` and ``.mesh``.

    ``plan``: ``{module-path pattern: style}`` (torch's ``parallelize_module`` plan, e.g.
    ``{"blocks.*.fc": ColwiseParallel(), "blocks.*.proj": RowwiseParallel()}``); checked by
    ``check_plan``. Without one the model must be a ``funcnet.gpt.GPT``, which gets
    ``gpt_plan(vocab)`` and its config checked (``check_config``; ``config`` overrides the
    one read off the model); any other model is refused: a "tensor-parallel" run with every
    parameter whole would be data parallelism that says otherwise."""
    if mesh is None:
        raise ValueError("make_tp_step needs mesh= (parallel.tensor.mesh(data, fsdp, model))")
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(f"make_tp_step: the mesh's axes must be {AXES}, got {mesh.axis_names}; build it with "
                         f"parallel.tensor.mesh(data=, fsdp=, model=)")
    if plan is None:
        config = gpt_config_of(model) if config is None else config
        if config is None:
            kind = str(getattr(model, "name", type(model).__name__)).split("(")[0]
            raise ValueError(f"tensor parallelism needs a plan for this {kind} (only funcnet.gpt.GPT has one built "
                             f"in): pass plan={{'<module path pattern>': ColwiseParallel() or RowwiseParallel(), ...}}"
                             f" (parallel.tensor; make_tp_step(plan=) or Strategy('tp', plan=)) over its modules "
                             f"{_module_list(state.params)}")
        check_config(config, mesh, vocab)
        plan = gpt_plan(vocab)
    else:
        check_plan(plan, state.params, mesh, model=model)
    shardings = state_shardings(state, mesh, plan=plan, model=model)
    split = NamedSharding(mesh, P(("data", "fsdp")))
    raw = _step.make_step(model, tx, loss_fn, donate=False, **step_options).raw

    def sharded(state, batch):
        new_state, metrics = raw(state, batch)
        return jax.lax.with_sharding_constraint(new_state, shardings), metrics

    step = jax.jit(sharded, in_shardings=(shardings, split), out_shardings=(shardings, NamedSharding(mesh, P())),
                   donate_argnums=(0,) if donate else ())
    step.raw, step.shardings, step.batch_sharding, step.mesh, step.plan = sharded, shardings, split, mesh, plan
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
        h = gelu(h)  # the GPT's nn.GELU()
        partial_sum = h @ params["c_proj"]["weight"].T  # this device's share of every output
        return jax.lax.psum(partial_sum, "model") + params["c_proj"]["bias"]

    def mlp(params, x):
        params = {k: {n: params[k][n] for n in ("weight", "bias")} for k in ("c_fc", "c_proj")}
        return jax.shard_map(local, mesh=mesh, in_specs=(spec, P()), out_specs=P())(params, x)

    return mlp
