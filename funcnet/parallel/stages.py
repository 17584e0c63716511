"""Pipeline any model: its traced forward split into stages at named modules, run by ``pipeline``'s tables.

torch counterpart: ``torch.distributed.pipelining.pipeline(module, mb_args, split_spec={"layers.2":
SplitPoint.BEGINNING})`` traces the module to one graph, cuts it where the named submodules
begin and hands each rank its piece (``PipelineStage``), run by ``ScheduleGPipe`` /
``Schedule1F1B``. Here:

- ``split(model, loss_fn, params, x, y, stages, split_points=None)`` traces ``loss_fn(model(x), y)``
  for one microbatch to a jaxpr (``jax.make_jaxpr``). Every child a ``Composite`` or
  ``Sequential`` runs is under a ``jax.named_scope`` of its dotted path (``transformer.h.2``,
  ``2``), the path of its params, so each equation knows the module it belongs to: a stage
  begins at the first equation of its split point's module. ``split_points=None`` splits
  evenly by layer: the longest ``ModuleList`` (or the root ``Sequential``'s children).
  A value made before a cut and used after it crosses to the next stage (passed through the
  stages between), unless it depends on the batch alone (positions, masks): then the stage
  that uses it recomputes it. Each parameter belongs to the one stage that reads it; one read
  by several (a tied embedding and head) is *shared*: replicated, its gradient summed over ``pipe``.
- A stage's params are packed into one flat buffer per dtype, padded to the largest stage's,
  stacked ``(P, L)`` and split over ``pipe``: device ``s`` holds stage ``s``'s alone. The values
  crossing each cut are flattened into one buffer per dtype, padded to the largest cut's, so
  every tick sends the same shape whatever each stage's activations are.
- ``make_value_and_grad(plan, mesh, microbatches, kind)``: the ``(loss, grads)`` of the packed
  params, the schedule run as in ``pipeline``: a ``lax.switch`` on the stage index runs the
  device's own stage (forward, or ``jax.vjp`` of it rerun in the backward, as ``remat``),
  ``ppermute`` passes the buffers on. ``plan.pack(params)`` / ``plan.unpack(packed)`` go between
  the model's params and the packed ``(shared, stages)`` pair the optimizer updates.

The loss must be a mean over the batch (the pipeline's is the mean of its microbatches'); the
model must keep no state (BatchNorm's running statistics) and the optimizer act on each
array element by element or by global norms (optax's sgd, adam, adamw, clipping by global
norm): it sees the packed buffers, not the model's arrays. Refusals name the fix before compiling.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from funcnet.nn.module import Module, call

__all__ = ["Plan", "split", "even_split_points", "make_value_and_grad"]


class Plan(NamedTuple):
    """A model cut into ``stages``: ``split_points`` (where stages 1.. begin), ``owner[i]`` (the
    stage of param leaf ``i``, -1: shared), ``sizes[s]`` (param elements per stage), ``cuts``
    (``[(dtype, shape), ...]`` crossing each cut); ``pack`` / ``unpack`` / ``run`` as the module
    docstring says."""

    stages: int
    split_points: tuple
    owner: tuple
    sizes: tuple
    cuts: tuple
    pack: Callable
    unpack: Callable
    run: Callable  # run(s, stage_bufs, shared, x, y, key, act) -> (act_out, loss)
    act_shapes: dict  # dtype -> buffer length
    loss_dtype: Any


def _layer_lists(model: Module, prefix: str = "") -> list:
    """``(dotted path, [names of the children with params])`` of every ModuleList and Sequential
    in ``model`` (a Sequential's activations are not layers of their own)."""
    out = []
    head = model.name.split("(")[0]
    kids = [(n, c) for n, c in model.children if isinstance(c, Module)]
    if head in ("ModuleList", "Sequential") and kids:
        held = [n for n, c in kids if jax.tree.leaves(jax.eval_shape(c.init, jax.random.key(0)))]
        out.append((prefix, held))
    for n, c in kids:
        out += _layer_lists(c, f"{prefix}.{n}" if prefix else n)
    return out


def even_split_points(model: Module, stages: int) -> tuple:
    """Split points that cut the longest ``ModuleList`` / ``Sequential`` of ``model`` into
    ``stages`` runs of (nearly) equal length: its children ``round(i * L / stages)``."""
    lists = _layer_lists(model)
    if not lists:
        raise ValueError(f"strategy='pipe': {model.name:.60} has no ModuleList or Sequential to split evenly; "
                         f"name where stages begin: Strategy('pipe', split_points=('<module path>', ...))")
    path, names = max(lists, key=lambda e: len(e[1]))
    if len(names) < stages:
        raise ValueError(f"strategy='pipe': the longest layer list of {model.name:.60} ({path or '<root>'}, "
                         f"{len(names)} layers) does not split into {stages} stages; use at most {len(names)} stages "
                         f"or name the split points")
    return tuple(f"{path}.{names[round(i * len(names) / stages)]}" if path else names[round(i * len(names) / stages)]
                 for i in range(1, stages))


def _dotted(eqn) -> str:
    return str(eqn.source_info.name_stack).replace("/", ".")


def _in(name: str, point: str) -> bool:
    return name == point or name.startswith(point + ".")


def _nested_names(eqns) -> list:
    """The module paths of the equations inside ``eqns``' sub-jaxprs (jit, scan, checkpoint)."""
    from jax.extend.core import jaxprs_in_params

    out = []
    for e in eqns:
        for sub in jaxprs_in_params(e.params):
            sub = getattr(sub, "jaxpr", sub)
            out += [_dotted(x) for x in sub.eqns] + _nested_names(sub.eqns)
    return out


def _read(env, v):
    return v.val if isinstance(v, Literal) else env[v]


def _eval(eqns, env):
    """jax.core.eval_jaxpr's loop over ``eqns``, writing into ``env``."""
    for eqn in eqns:
        params = eqn.primitive.get_bind_params(eqn.params)
        with eqn.ctx.manager:
            ans = eqn.primitive.bind(*[_read(env, v) for v in eqn.invars], **params)
        outs = ans if eqn.primitive.multiple_results else [ans]
        for v, a in zip(eqn.outvars, outs):
            env[v] = a
    return env


class _Packer(NamedTuple):
    """Arrays of given (shape, dtype)s, one flat buffer per dtype of ``length[dtype]`` elements."""

    specs: tuple  # ((shape, dtype), ...)
    offsets: tuple  # element offset of each array in its dtype's buffer
    length: dict

    @staticmethod
    def of(specs, length=None):
        used, offsets = {}, []
        for shape, dtype in specs:
            d = np.dtype(dtype).name
            offsets.append(used.get(d, 0))
            used[d] = used.get(d, 0) + int(np.prod(shape, dtype=np.int64))
        return _Packer(tuple(specs), tuple(offsets), dict(used) if length is None else length)

    def pack(self, arrays, xp=jnp):
        parts = {d: [] for d in self.length}
        for a, (shape, dtype) in zip(arrays, self.specs):
            parts[np.dtype(dtype).name].append(xp.ravel(a))
        out = {}
        for d, n in self.length.items():
            flat = xp.concatenate(parts[d]) if parts[d] else xp.zeros((0,), d)
            out[d] = xp.pad(flat, (0, n - flat.shape[0])) if flat.shape[0] < n else flat
        return out

    def unpack(self, bufs):
        out = []
        for (shape, dtype), off in zip(self.specs, self.offsets):
            n = int(np.prod(shape, dtype=np.int64))
            out.append(bufs[np.dtype(dtype).name][off:off + n].reshape(shape))
        return out


def split(model: Module, loss_fn: Callable, params, x, y, stages: int, split_points=None) -> Plan:
    """The ``Plan`` of ``model`` (its ``params``, or their shapes) for microbatches shaped as
    ``x``, ``y`` (one microbatch), cut at ``split_points`` (dotted module paths, where stages 1..
    begin; None: ``even_split_points``)."""
    where = f"strategy='pipe' on {model.name:.60}"
    if model.init_state is not None:
        raise ValueError(f"{where}: the model keeps state (running statistics, buffers it updates), which the "
                         f"pipeline's stages do not carry; train it with strategy='shard_map' or 'fsdp', or use "
                         f"LayerNorm/GroupNorm instead of BatchNorm")
    if model.apply is None:
        raise ValueError(f"{where}: a container without a forward (ModuleList/ModuleDict) cannot be trained; "
                         f"pass the model that runs it")
    points = even_split_points(model, stages) if split_points is None else tuple(split_points)
    if len(points) != stages - 1 or not all(isinstance(p, str) and p for p in points):
        raise ValueError(f"{where}: split_points={points!r} must be {stages - 1} dotted module paths (where stages "
                         f"1..{stages - 1} begin) for pipeline={stages}; e.g. ('layers.2',)")
    leaves, treedef = jax.tree.flatten(params)
    shapes = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in leaves]

    def loss(leaves, x, y, key):
        out = call(model, jax.tree.unflatten(treedef, leaves), None, x, key=key, train=True)[0]
        return loss_fn(out, y)

    closed = jax.make_jaxpr(loss)(shapes, x, y, jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != 1 or jaxpr.outvars[0].aval.shape != ():
        raise ValueError(f"{where}: loss_fn(model(x), y) must be one scalar (the mean over the batch), got "
                         f"{[v.aval.str_short() for v in jaxpr.outvars]}")
    eqns = jaxpr.eqns
    names = [_dotted(e) for e in eqns]
    starts = []
    for p in points:
        hit = [i for i, n in enumerate(names) if _in(n, p)]
        if not hit:
            known = sorted({n.split(".")[0] if "." not in p else ".".join(n.split(".")[:p.count(".") + 1])
                            for n in names if n})
            nested = any(_in(n, p) for n in _nested_names(eqns))
            why = " (it runs inside a jit, scan or checkpoint: cut at a module outside it)" if nested else ""
            raise ValueError(f"{where}: split point {p!r} names no module the forward runs{why}; modules at that "
                             f"depth: {', '.join(known[:12]) or 'none'}")
        starts.append(hit[0])
    if any(b <= a for a, b in zip(starts, starts[1:])) or (starts and starts[0] == 0):
        raise ValueError(f"{where}: split points {points} must name modules in the order the forward runs them, "
                         f"each after some work of the stage before")
    bounds = [0, *starts, len(eqns)]
    stage_of_eqn = np.zeros(len(eqns), int)
    for s in range(stages):
        stage_of_eqn[bounds[s]:bounds[s + 1]] = s

    param_vars = jaxpr.invars[:len(leaves)]
    xv, yv, kv = jaxpr.invars[len(leaves):]
    constvars = list(jaxpr.constvars)
    is_param = {v: i for i, v in enumerate(param_vars)}
    free, made_in, producer = set([xv, yv, kv, *constvars]), {}, {}
    for i, e in enumerate(eqns):
        ins = [v for v in e.invars if not isinstance(v, Literal)]
        if all(v in free for v in ins):
            free.update(e.outvars)
        for v in e.outvars:
            made_in[v], producer[v] = int(stage_of_eqn[i]), i
    # which stage reads which param; which values cross each cut
    readers = [set() for _ in leaves]
    uses = [set() for _ in range(stages)]  # non-literal vars each stage's own equations read
    for i, e in enumerate(eqns):
        s = int(stage_of_eqn[i])
        for v in e.invars:
            if isinstance(v, Literal):
                continue
            uses[s].add(v)
            if v in is_param:
                readers[is_param[v]].add(s)
    out_v = jaxpr.outvars[0]
    if not isinstance(out_v, Literal):
        uses[stages - 1].add(out_v)
    owner = tuple(-1 if len(r) > 1 else (min(r) if r else 0) for r in readers)
    crossing = []  # crossing[c]: values entering stage c + 1
    for c in range(stages - 1):
        later = set().union(*uses[c + 1:])
        vals = sorted((v for v in later if v in made_in and made_in[v] <= c and v not in free), key=producer.get)
        for v in vals:
            if not jnp.issubdtype(v.aval.dtype, jnp.inexact):
                raise ValueError(f"{where}: a value of type {v.aval.str_short()} made before split point {points[c]!r} is "
                                 f"used after it, and only float activations cross between stages; move the split "
                                 f"point so that the value is made and used in one stage")
        crossing.append(vals)
    # the batch-only values a stage recomputes: those it (or a recomputed one) reads from an earlier stage
    recompute = []
    for s in range(stages):
        need, todo = set(), [v for v in uses[s] if v in free and v in made_in and made_in[v] < s]
        while todo:
            v = todo.pop()
            i = producer[v]
            if i in need:
                continue
            need.add(i)
            todo += [u for u in eqns[i].invars if not isinstance(u, Literal) and u in made_in]
        recompute.append(sorted(need))
    cut_specs = [[(tuple(v.aval.shape), v.aval.dtype) for v in vals] for vals in crossing]
    act_len: dict = {}
    for specs in cut_specs:
        for d, n in _Packer.of(specs).length.items():
            act_len[d] = max(act_len.get(d, 0), n)
    if not act_len:
        act_len = {np.dtype(closed.out_avals[0].dtype).name: 0}
    cut_packers = [_Packer.of(specs, act_len) for specs in cut_specs]
    stage_leaves = [[i for i, o in enumerate(owner) if o == s] for s in range(stages)]
    shared_leaves = [i for i, o in enumerate(owner) if o == -1]
    stage_len: dict = {}
    for idx in stage_leaves:
        for d, n in _Packer.of([(shapes[i].shape, shapes[i].dtype) for i in idx]).length.items():
            stage_len[d] = max(stage_len.get(d, 0), n)
    for sh in shapes:  # every dtype has a buffer, so all stages' pytrees match
        stage_len.setdefault(np.dtype(sh.dtype).name, 0)
    stage_packers = [_Packer.of([(shapes[i].shape, shapes[i].dtype) for i in idx], stage_len) for idx in stage_leaves]

    def pack(params):
        """The model's params (or a tree shaped like them) -> ``(shared, stages)``: ``shared`` the
        list of shared leaves, ``stages`` ``{dtype: (P, L)}``."""
        lv = jax.tree.leaves(params)
        bufs = [stage_packers[s].pack([lv[i] for i in stage_leaves[s]]) for s in range(stages)]
        return [lv[i] for i in shared_leaves], {d: jnp.stack([b[d] for b in bufs]) for d in stage_len}

    def unpack(packed):
        shared, bufs = packed
        lv: list = [None] * len(leaves)
        for i, a in zip(shared_leaves, shared):
            lv[i] = a
        for s in range(stages):
            for i, a in zip(stage_leaves[s], stage_packers[s].unpack({d: b[s] for d, b in bufs.items()})):
                lv[i] = a
        return jax.tree.unflatten(treedef, lv)

    consts = closed.consts
    loss_dtype = closed.out_avals[0].dtype

    def branch(s):
        def run(bufs, shared, x, y, key, act):
            env = dict(zip(constvars, consts))
            env.update({xv: x, yv: y, kv: key})
            for i, a in zip(shared_leaves, shared):
                env[param_vars[i]] = a
            for i, a in zip(stage_leaves[s], stage_packers[s].unpack(bufs)):
                env[param_vars[i]] = a
            if s > 0:
                env.update(zip(crossing[s - 1], cut_packers[s - 1].unpack(act)))
            _eval([eqns[i] for i in recompute[s]], env)
            _eval(eqns[bounds[s]:bounds[s + 1]], env)
            if s == stages - 1:
                zero = {d: jnp.zeros((n,), d) for d, n in act_len.items()}
                return zero, _read(env, out_v).astype(loss_dtype)
            return cut_packers[s].pack([env[v] for v in crossing[s]]), jnp.zeros((), loss_dtype)

        return run

    branches = [branch(s) for s in range(stages)]

    def run(s, bufs, shared, x, y, key, act):
        return jax.lax.switch(s, branches, bufs, shared, x, y, key, act)

    sizes = tuple(sum(int(np.prod(shapes[i].shape)) for i in idx) for idx in stage_leaves)
    return Plan(stages, points, owner, sizes, tuple(tuple(c) for c in cut_specs), pack, unpack, run, act_len,
                loss_dtype)


def make_value_and_grad(plan: Plan, mesh: Mesh, microbatches: int, kind: str = "1f1b"):
    """``f(packed, x, y, key) -> (loss, grads)``: the mean of ``loss_fn`` over the microbatches of
    ``x``, ``y`` (split on their first axis; ``key``: microbatch ``m`` draws from
    ``fold_in(key, m)``) and its gradients w.r.t. ``packed`` (``plan.pack``'s pair), computed by
    the ``kind`` schedule on ``mesh``'s ``pipe`` axis (and ``data``: each microbatch split over it)."""
    from funcnet.parallel import pipeline as _pp

    manual = _pp._check_mesh(mesh)
    if any(mesh.shape[a] > 1 for a in ("model", "fsdp") if a in mesh.shape):
        raise ValueError("strategy='pipe': tensor_parallel and fsdp inside stages are for funcnet's GPT; pipeline "
                         "this model with pipeline= and the data axis alone")
    data = "data" in manual
    stages = int(mesh.shape["pipe"])
    if stages != plan.stages:
        raise ValueError(f"pipeline: the plan has {plan.stages} stages, the mesh's pipe axis {stages}")
    sched = _pp.schedule(kind, stages, microbatches)
    slots, gslots, table = sched.held, sched.grads_held, jnp.asarray(sched.table)
    M, last = microbatches, stages - 1

    def local(shared, bufs, x, y, key):
        s = jax.lax.axis_index("pipe")
        bufs = {d: b[0] for d, b in bufs.items()}
        act = {d: jnp.zeros((n,), d) for d, n in plan.act_shapes.items()}
        zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)  # noqa: E731
        zloss = jnp.zeros((), plan.loss_dtype)

        def keyed(m):
            return jax.random.fold_in(key, m)

        def idle(carry, m):
            return act, act, zloss, zeros(shared), zeros(bufs)

        def forward(carry, m):
            xin = {d: b[m % slots] for d, b in carry["x"].items()}
            out, loss = plan.run(s, bufs, shared, x[m], y[m], keyed(m), xin)
            return out, act, loss, zeros(shared), zeros(bufs)

        def backward(carry, m):
            xin = {d: b[m % slots] for d, b in carry["x"].items()}
            (_, loss), vjp = jax.vjp(lambda b, sh, a: plan.run(s, b, sh, x[m], y[m], keyed(m), a), bufs, shared, xin)
            gy = {d: jnp.where(s == last, jnp.zeros_like(g[m % gslots]), g[m % gslots]) for d, g in carry["g"].items()}
            gb, gsh, gx = vjp((gy, jnp.asarray(1.0 / M, loss.dtype)))
            return act, gx, zloss, gsh, gb

        def tick(carry, row):
            a, m = row[s, 0], row[s, 1]
            y_out, gx, loss, gsh, gb = jax.lax.switch(a, (idle, forward, backward), carry, m)
            fwd = [(i, i + 1) for i in range(stages - 1)]
            bwd = [(i + 1, i) for i in range(stages - 1)]
            y_in = jax.lax.ppermute(y_out, "pipe", fwd)
            g_in = jax.lax.ppermute(gx, "pipe", bwd)
            prev, nxt = row[jnp.maximum(s - 1, 0)], row[jnp.minimum(s + 1, last)]
            put_x = (s > 0) & (prev[0] == _pp.FORWARD)
            put_g = (s < last) & (nxt[0] == _pp.BACKWARD)
            new = {"x": {d: jnp.where(put_x, b.at[prev[1] % slots].set(y_in[d]), b) for d, b in carry["x"].items()},
                   "g": {d: jnp.where(put_g, b.at[nxt[1] % gslots].set(g_in[d]), b) for d, b in carry["g"].items()},
                   "loss": carry["loss"] + loss,
                   "shared": jax.tree.map(jnp.add, carry["shared"], gsh),
                   "bufs": jax.tree.map(jnp.add, carry["bufs"], gb)}
            return new, None

        carry = {"x": {d: jnp.zeros((slots, n), d) for d, n in plan.act_shapes.items()},
                 "g": {d: jnp.zeros((gslots, n), d) for d, n in plan.act_shapes.items()},
                 "loss": zloss, "shared": zeros(shared), "bufs": zeros(bufs)}
        carry = jax.lax.scan(tick, carry, table)[0]
        loss = jax.lax.psum(carry["loss"], "pipe") / M  # only the last stage's is not 0
        grads = (jax.lax.psum(carry["shared"], "pipe"), {d: g[None] for d, g in carry["bufs"].items()})
        if data:
            loss, grads = jax.lax.pmean((loss, grads), "data")
        return loss, grads

    def value_and_grad(packed, x, y, key):
        shared, bufs = packed
        b = x.shape[0]
        per = microbatches * (mesh.shape["data"] if data else 1)
        if b % per:
            raise ValueError(f"strategy='pipe': a batch of {b} does not split into {microbatches} microbatches"
                             f"{' over a data axis of %d' % mesh.shape['data'] if data else ''}; pick a batch_size "
                             f"that is a multiple of {per}")
        x = x.reshape(M, b // M, *x.shape[1:])
        y = y.reshape(M, b // M, *y.shape[1:])
        batch = P(None, "data") if data else P()
        specs = (P(), P("pipe"), batch, batch, P())
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(P(), (P(), P("pipe"))),
                             axis_names=manual, check_vma=False)(shared, bufs, x, y, key)

    value_and_grad.schedule = sched
    return value_and_grad
