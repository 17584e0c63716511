"""One mesh for every axis: data x fsdp x tensor (``model``) x pipeline (``pipe``), and the GPT's
pipelined train step on it that ``fit(strategy=Strategy("pipe", ...))`` runs.

torch counterpart: ``init_device_mesh("cuda", (dp, fsdp, tp, pp), mesh_dim_names=("dp", "fsdp",
"tp", "pp"))`` with each slice handed to its API (``fully_shard(mesh=mesh["fsdp"])``,
``parallelize_module(mesh=mesh["tp"])``, ``PipelineStage(group=mesh["pp"].get_group())``), as
torchtitan composes them. Here the composition is one program:

- ``mesh(data, fsdp, model, pipe)``: a ``Mesh`` with the four axes (size 1 where unused).
- The pipeline (``parallel.pipeline.make_value_and_grad``) runs ``pipe`` and ``data`` by hand
  in ``shard_map`` (each microbatch split over ``data``, the loss and gradients averaged over
  it); ``model`` and ``fsdp`` stay automatic: the blocks' params carry ``parallel.tensor``'s
  Megatron specs behind their ``pipe`` axis and jit's partitioner inserts the tensor-parallel
  all-reduces and the fsdp all-gathers inside each stage.
- ``pipe_parallel``: that step as a ``parallel.DataParallel`` for ``fit``. Its train state
  holds the params as ``(rest, blocks)`` (``pipeline.split_params``: the blocks stacked and
  split over ``pipe``), the optimizer state likewise; ``get`` gives the GPT's own layout back,
  so callbacks, checkpoints and the returned state look as on one device.

This GPT path runs only when the model IS a ``funcnet.gpt.GPT`` with ``dropout=0``
(``gpt.config_of``, the identity of its apply), trained on its cross entropy; any other model
is cut into stages by ``parallel.stages`` (``pipeline`` and ``data`` axes alone). Both: the
per-step metrics are the loss alone, no loss scale or ``accum_steps`` (the microbatches are
the accumulation), one process.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import gpt as _gpt
from funcnet import losses as _losses
from funcnet import step as _step
from funcnet.parallel import data as _data
from funcnet.parallel import pipeline as _pipeline
from funcnet.parallel import stages as _stages
from funcnet.parallel import tensor as _tensor

__all__ = ["AXES", "mesh", "to_pipeline", "from_pipeline", "pipe_parallel"]

AXES = ("data", "fsdp", "model", "pipe")


def _updated(tx, state, loss, grads, shardings):
    """One optimizer step of a pipelined train state from its loss and gradients, kept in its shardings."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state, step=state.step + 1)
    return jax.lax.with_sharding_constraint(new, shardings), {"loss": loss}


def mesh(data: int = 1, fsdp: int = 1, model: int = 1, pipe: int = 1, devices=None) -> Mesh:
    """A ``(data, fsdp, model, pipe)`` mesh of the first ``data * fsdp * model * pipe`` devices;
    neighbouring devices share a ``pipe`` stage's ``model`` group last-axis first (as
    ``init_device_mesh`` lays out its last dimension)."""
    sizes = {"data": data, "fsdp": fsdp, "model": model, "pipe": pipe}
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"parallel.mesh.mesh: {name} must be a positive int, got {n!r}")
    devices = jax.devices() if devices is None else list(devices)
    n = data * fsdp * model * pipe
    if n > len(devices):
        raise ValueError(f"parallel.mesh.mesh: data x fsdp x model x pipe = {data} x {fsdp} x {model} x {pipe} = {n} "
                         f"devices, but {len(devices)} exist; on CPU simulate more with "
                         f"funcnet.parallel.simulate_cpu_devices({n}) before JAX starts")
    return Mesh(np.asarray(devices[:n], dtype=object).reshape(data, fsdp, model, pipe), AXES)


def _params_like(tree, params_def, fn):
    """``fn`` on every subtree of ``tree`` with the structure ``params_def`` (the params, Adam's
    mu and nu, ...); other leaves (step counts) unchanged."""
    hit = lambda n: jax.tree.structure(n) == params_def  # noqa: E731
    return jax.tree.map(lambda n: fn(n) if hit(n) else n, tree, is_leaf=hit)


def to_pipeline(state: _step.TrainState) -> _step.TrainState:
    """A GPT's ``TrainState`` with its params and their optimizer state as ``(rest, blocks)``."""
    params_def = jax.tree.structure(state.params)
    split = lambda p: _pipeline.split_params(p)  # noqa: E731
    return state._replace(params=split(state.params), opt_state=_params_like(state.opt_state, params_def, split))


def from_pipeline(state: _step.TrainState, like) -> _step.TrainState:
    """``to_pipeline``'s inverse; ``like``: the GPT's params (or their shapes)."""
    pipe_def = jax.tree.structure(state.params)
    join = lambda t: _pipeline.join_params(*t, like)  # noqa: E731
    return state._replace(params=join(state.params), opt_state=_params_like(state.opt_state, pipe_def, join))


def _shardings(state: _step.TrainState, m: Mesh, vocab: str) -> _step.TrainState:
    """The placement of a ``to_pipeline`` state: ``rest`` by the tensor rules, ``blocks`` by the
    rules behind a leading ``pipe`` axis; optimizer state leaf for leaf; the rest replicated."""

    def rest(t):
        return jax.tree_util.tree_map_with_path(lambda path, a: NamedSharding(m, _tensor.param_spec(
            _tensor._names(path), tuple(a.shape), m, vocab=vocab)), t)

    def blocks(t):
        return jax.tree_util.tree_map_with_path(lambda path, a: NamedSharding(m, P("pipe", *_tensor.param_spec(
            _tensor._names(path), tuple(a.shape[1:]), m, vocab=vocab))), t)

    both = lambda t: (rest(t[0]), blocks(t[1]))  # noqa: E731
    replicated = NamedSharding(m, P())
    rep = lambda t: jax.tree.map(lambda _: replicated, t)  # noqa: E731
    opt = _params_like(state.opt_state, jax.tree.structure(state.params), both)
    opt = jax.tree.map(lambda s: s if isinstance(s, NamedSharding) else replicated, opt,
                       is_leaf=lambda s: isinstance(s, NamedSharding))
    return state._replace(params=both(state.params), opt_state=opt, step=replicated, key=replicated,
                          loss_scale=rep(state.loss_scale), model_state=rep(state.model_state))


def _check(strategy, loss_fn, step_options, n: int, gpt: bool = True) -> dict:
    kind = "strategy='pipe'"
    if gpt and loss_fn is not _losses.cross_entropy:
        raise ValueError(f"{kind} trains the GPT on its cross entropy (computed on the last stage); leave loss_fn out")
    if step_options.get("accum_steps", 1) != 1 or step_options.get("policy") is not None:
        raise ValueError(f"{kind} runs without accum_steps (the microbatches accumulate) and in float32 params; "
                         f"got accum_steps={step_options.get('accum_steps')}, precision={step_options.get('policy')}")
    if step_options.get("metrics", _step.default_metrics) is not _step.default_metrics:
        raise ValueError(f"{kind} reports the loss alone; leave metrics out")
    sizes = {"pipe": strategy.pipeline, "model": strategy.tensor_parallel or 1, "fsdp": strategy.fsdp}
    for name, v in (("pipeline", sizes["pipe"]), ("tensor_parallel", sizes["model"]), ("fsdp", sizes["fsdp"])):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{kind}: {name} must be a positive int, got {v!r}")
    inner = sizes["pipe"] * sizes["model"] * sizes["fsdp"]
    if n % inner:
        raise ValueError(f"{kind}: pipeline x tensor_parallel x fsdp = {inner} must divide the {n} devices (the rest "
                         f"is the data axis)")
    return {**sizes, "data": n // inner}


def _gpt_config(model, strategy):
    """The model's ``GPTConfig`` when the model IS a ``funcnet.gpt.GPT`` (its apply's identity)
    without dropout, so the stacked-block fast path trains it; None: the model is split by its graph."""
    config = _gpt.config_of(model)
    if config is not None and strategy.config is not None and strategy.config != config:
        raise ValueError(f"strategy='pipe': Strategy(config={strategy.config}) is not the model's {config}; leave "
                         f"config out (the model passed is the model trained)")
    return config if config is not None and not config.dropout else None


def pipe_parallel(model, tx, loss_fn, strategy, devices, state_shapes, step_options,
                  example=None) -> _data.DataParallel:
    """``fit``'s ``"pipe"`` strategy as a ``DataParallel`` whose ``put_state`` takes (and ``get``
    gives) the model's own layout: funcnet's GPT by its stacked blocks on ``mesh(data, fsdp,
    model, pipe)``; any other model split by ``parallel.stages`` (``example``: one batch's
    ``(x, y)`` shapes, to trace it on)."""
    if jax.process_count() > 1:
        raise ValueError("strategy='pipe' in fit runs in one process")
    n = devices or len(jax.devices())
    config = _gpt_config(model, strategy)
    if config is None:
        return _pipe_any(model, tx, loss_fn, strategy, n, state_shapes, step_options, example)
    sizes = _check(strategy, loss_fn, step_options, n)
    m = mesh(**sizes)
    micro = strategy.microbatches or sizes["pipe"]
    vocab = "split" if config.vocab_size % sizes["model"] == 0 else "replicate"
    if sizes["model"] > 1:
        _tensor.check_config(config, m, vocab)
    vg = _pipeline.make_value_and_grad(config, m, micro, strategy.schedule)
    like = jax.eval_shape(state_shapes)
    shardings = _shardings(jax.eval_shape(lambda: to_pipeline(state_shapes())), m, vocab)
    replicated = NamedSharding(m, P())

    def raw(state, batch):
        return _updated(tx, state, *vg(*state.params, *batch), shardings)

    step = jax.jit(raw, in_shardings=(shardings, replicated), out_shardings=(shardings, replicated),
                   donate_argnums=(0,))
    step.raw, step.shardings, step.mesh, step.schedule = raw, shardings, m, vg.schedule

    def put_state(tree):
        if isinstance(tree, _step.TrainState):
            return jax.device_put(to_pipeline(tree), shardings)
        return jax.device_put(tree, replicated)

    def put_batch(batch):
        b = int(np.shape(batch[0])[0])
        if b % (micro * sizes["data"]):
            raise ValueError(f"strategy='pipe': a batch of {b} does not split into {micro} microbatches over a data "
                             f"axis of {sizes['data']}; pick a batch_size that is a multiple of {micro * sizes['data']}")
        return jax.device_put(batch, replicated)

    def get(tree):
        tree = jax.device_put(tree, jax.devices()[0])
        return from_pipeline(tree, like.params) if isinstance(tree, _step.TrainState) else tree

    return _data.DataParallel("pipe", m.devices.size, step, put_state, put_batch, get)


def _pipe_any(model, tx, loss_fn, strategy, n: int, state_shapes, step_options, example) -> _data.DataParallel:
    """The pipelined step of any model: ``parallel.stages`` splits it at ``strategy.split_points``
    (or evenly by layer); the train state holds the params and their optimizer state packed
    (``plan.pack``: shared arrays replicated, each stage's buffer on its ``pipe`` device)."""
    where = f"strategy='pipe' on {model.name:.60}"
    sizes = _check(strategy, loss_fn, step_options, n, gpt=False)
    if sizes["model"] > 1 or sizes["fsdp"] > 1:
        raise ValueError(f"{where}: tensor_parallel and fsdp inside the stages are for funcnet.gpt.GPT (without "
                         f"dropout); pipeline this model with pipeline= (and the data axis) alone")
    if example is None:
        raise ValueError(f"{where}: batches from a Loader are not pipelined for models other than funcnet.gpt.GPT "
                         f"(the split is traced on the batch's shape); pass train_data as (x, y) arrays")
    m = mesh(data=sizes["data"], pipe=sizes["pipe"])
    micro = strategy.microbatches or sizes["pipe"]
    x, y = example
    per = micro * sizes["data"]
    if x.shape[0] % per:
        raise ValueError(f"{where}: a batch of {x.shape[0]} does not split into {micro} microbatches over a data "
                         f"axis of {sizes['data']}; pick a batch_size that is a multiple of {per}")
    mb = lambda a: jax.ShapeDtypeStruct((a.shape[0] // per, *a.shape[1:]), a.dtype)  # noqa: E731
    like = jax.eval_shape(state_shapes)
    if like.model_state:
        raise ValueError(f"{where}: the model keeps state (running statistics), which the pipeline's stages do not "
                         f"carry; train it with strategy='shard_map' or 'fsdp', or use LayerNorm/GroupNorm")
    plan = _stages.split(model, loss_fn, like.params, mb(x), mb(y), sizes["pipe"], strategy.split_points)
    vg = _stages.make_value_and_grad(plan, m, micro, strategy.schedule)
    params_def = jax.tree.structure(like.params)

    def to_packed(state):
        return state._replace(params=plan.pack(state.params),
                              opt_state=_params_like(state.opt_state, params_def, plan.pack))

    packed_like = jax.eval_shape(lambda: to_packed(state_shapes()))
    packed_def = jax.tree.structure(packed_like.params)
    replicated, split = NamedSharding(m, P()), NamedSharding(m, P("pipe"))
    place = lambda t: (jax.tree.map(lambda _: replicated, t[0]), jax.tree.map(lambda _: split, t[1]))  # noqa: E731
    opt = _params_like(packed_like.opt_state, packed_def, place)
    opt = jax.tree.map(lambda s: s if isinstance(s, NamedSharding) else replicated, opt,
                       is_leaf=lambda s: isinstance(s, NamedSharding))
    rep = lambda t: jax.tree.map(lambda _: replicated, t)  # noqa: E731
    shardings = packed_like._replace(params=place(packed_like.params), opt_state=opt, step=replicated,
                                     key=replicated, loss_scale=rep(packed_like.loss_scale),
                                     model_state=rep(packed_like.model_state))

    def raw(state, batch):
        key = jax.random.fold_in(jax.random.fold_in(state.key, 1), state.step)  # make_step's dropout key
        return _updated(tx, state, *vg(state.params, *batch, key), shardings)

    step = jax.jit(raw, in_shardings=(shardings, replicated), out_shardings=(shardings, replicated),
                   donate_argnums=(0,))
    step.raw, step.shardings, step.mesh, step.schedule, step.plan = raw, shardings, m, vg.schedule, plan

    def put_state(tree):
        if isinstance(tree, _step.TrainState):
            return jax.device_put(to_packed(tree), shardings)
        return jax.device_put(tree, replicated)

    def put_batch(batch):
        b = int(np.shape(batch[0])[0])
        if b % per:
            raise ValueError(f"{where}: a batch of {b} does not split into {micro} microbatches over a data axis of "
                             f"{sizes['data']}; pick a batch_size that is a multiple of {per}")
        return jax.device_put(batch, replicated)

    def get(tree):
        tree = jax.device_put(tree, jax.devices()[0])
        if not isinstance(tree, _step.TrainState):
            return tree
        return tree._replace(params=plan.unpack(tree.params),
                             opt_state=_params_like(tree.opt_state, packed_def, plan.unpack))

    return _data.DataParallel("pipe", m.devices.size, step, put_state, put_batch, get)
