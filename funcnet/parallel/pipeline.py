"""Pipeline parallelism (GPipe and 1F1B) for the GPT's stack of blocks, as a tick loop in shard_map + ppermute.

torch counterpart: ``torch.distributed.pipelining``: ``PipelineStage(stage_module, i, P, device)``
wraps each rank's slice of the model, and ``ScheduleGPipe(stage, M, loss_fn)`` or
``Schedule1F1B(stage, M, loss_fn)`` runs the microbatches through the stages, each rank
sending its activations to the next with ``send``/``recv`` in the forward and the
gradients back in the backward. JAX has no pipeline API: here the schedule is data (a
table of which stage does which microbatch's forward ``F`` or backward ``B`` at each tick),
and one program, ``jax.shard_map`` over a ``pipe`` mesh axis, runs it as a ``lax.scan`` over
the ticks: each stage looks up its action, runs it, and ``jax.lax.ppermute`` passes the
activations one stage on and the gradients one stage back.

- ``schedule(kind, stages, microbatches)``: the table, derived by running each stage's
  order of actions (GPipe: every forward, then every backward; 1F1B: ``P - s - 1`` warm-up
  forwards on stage ``s``, then one forward and one backward in turn) tick by tick, an action
  waiting until what it needs was done at an earlier tick (the forward of the stage before,
  the backward of the stage after). ``Schedule.bubble`` counts its idle slots, to read
  against GPipe's ``(P - 1) / (M + P - 1)``; ``Schedule.held`` is how many microbatches'
  stage inputs a stage holds at once: M under GPipe, at most P under 1F1B.
- ``make_value_and_grad(config, mesh, microbatches, kind)``: ``(loss, grads)`` of the GPT's
  cross entropy, ``grads`` as ``jax.value_and_grad`` gives them on one device. The blocks'
  params are stacked (``gpt.stack_blocks``) and split over ``pipe`` (``L / P`` blocks per
  stage); the embeddings, final LayerNorm and tied head are replicated, used by the first
  stage (embedding) and the last (head and loss), and their gradients summed over ``pipe``
  (torch's pipelining leaves that all-reduce of a tied weight to the user).
- Each stage keeps its *inputs* (``held`` slots of ``(B / M, T, C)``) and reruns its blocks
  in the backward (``jax.vjp``), as ``GPT(remat="full")`` does per block: the activation
  memory a schedule holds is then its slots, which the compiled program's temps show.
- ``make_step(config, tx, mesh, microbatches, kind)``: one optax step on ``(rest, blocks)``.

The GPT must have ``dropout == 0`` and ``n_layer`` divisible by P; the batch, by M.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import gpt as _gpt
from funcnet import losses as _losses

__all__ = [
    "KINDS",
    "Schedule",
    "check_config",
    "from_orders",
    "join_params",
    "make_step",
    "make_value_and_grad",
    "mesh",
    "schedule",
    "split_params",
]

KINDS = ("gpipe", "1f1b")
IDLE, FORWARD, BACKWARD = 0, 1, 2


class Schedule(NamedTuple):
    """``table[t, s] = (action, microbatch)``, action ``IDLE``, ``FORWARD`` or ``BACKWARD``."""

    kind: str
    stages: int
    microbatches: int
    table: np.ndarray  # (ticks, stages, 2) int32

    @property
    def ticks(self) -> int:
        """The table's length: forward and backward slots included, idle ones too."""
        return int(self.table.shape[0])

    @property
    def bubble(self) -> float:
        """Idle slots / all slots of the table (each F and B takes one tick)."""
        return float(np.mean(self.table[:, :, 0] == IDLE))

    def tick_of(self, action: int) -> np.ndarray:
        """``[s, m]``: the tick at which stage ``s`` runs ``action`` of microbatch ``m``."""
        out = np.full((self.stages, self.microbatches), -1)
        t, s = np.nonzero(self.table[:, :, 0] == action)
        out[s, self.table[t, s, 1]] = t
        return out

    @property
    def held(self) -> int:
        """The most microbatches whose input a stage holds at once: from its arrival (the end of
        the previous stage's forward; the first stage's own forward) to its backward."""
        f, b = self.tick_of(FORWARD), self.tick_of(BACKWARD)
        arrive = np.concatenate([f[:1], f[:-1] + 1])
        return int(max(np.sum((arrive <= t) & (t <= b), axis=1).max() for t in range(self.ticks)))

    @property
    def grads_held(self) -> int:
        """The most output gradients a stage holds between their arrival and its backward."""
        b = self.tick_of(BACKWARD)
        if self.stages == 1:
            return 1
        arrive = b[1:] + 1
        return int(max(1, max(np.sum((arrive <= t) & (t <= b[:-1]), axis=1).max() for t in range(self.ticks))))

    def draw(self) -> str:
        """The table as text: a row per stage, a column per tick, ``F3`` / ``B3`` / ``.``."""
        w = len(str(self.microbatches - 1)) + 1
        head = "tick     " + " ".join(f"{t:>{w}}" for t in range(self.ticks))
        rows = [head]
        for s in range(self.stages):
            cells = [("." if a == IDLE else ("F" if a == FORWARD else "B") + str(m)).rjust(w)
                     for a, m in self.table[:, s]]
            rows.append(f"stage {s}  " + " ".join(cells))
        return "\n".join(rows)


def _order(kind: str, stages: int, microbatches: int, s: int) -> list:
    M = microbatches
    if kind == "gpipe":
        return [(FORWARD, m) for m in range(M)] + [(BACKWARD, m) for m in range(M)]
    warm = min(stages - s - 1, M)
    out = [(FORWARD, m) for m in range(warm)]
    for m in range(warm, M):  # steady state: one forward, one backward
        out += [(FORWARD, m), (BACKWARD, m - warm)]
    return out + [(BACKWARD, m) for m in range(M - warm, M)]


def schedule(kind: str, stages: int, microbatches: int) -> Schedule:
    """The tick table of ``kind`` ("gpipe" or "1f1b") for ``stages`` x ``microbatches``."""
    if kind not in KINDS:
        raise ValueError(f"pipeline schedule must be one of {KINDS}, got {kind!r}")
    for name, n in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"pipeline: {name} must be a positive int, got {n!r}")
    return from_orders(kind, microbatches, [_order(kind, stages, microbatches, s) for s in range(stages)])


def from_orders(kind: str, microbatches: int, orders: list) -> Schedule:
    """The table of each stage's ``orders`` (lists of ``(FORWARD | BACKWARD, microbatch)``) laid
    out tick by tick: an action runs at the first tick after what it needs (the previous
    stage's forward, the next stage's backward, its own forward) and after the stage's
    previous action. Refuses orders that never finish (a backward before its forward)."""
    stages, orders = len(orders), [list(o) for o in orders]
    done = {}  # (action, stage, microbatch) -> tick
    ticks, t = [], 0
    while any(orders):
        row = []
        for s in range(stages):
            act = orders[s][0] if orders[s] else None
            if act is not None:
                a, m = act
                need = [(FORWARD, s - 1, m)] if a == FORWARD and s > 0 else []
                if a == BACKWARD:
                    need = [(FORWARD, s, m)] + ([(BACKWARD, s + 1, m)] if s < stages - 1 else [])
                if all(done.get(k, t) < t for k in need):
                    orders[s].pop(0)
                    done[(a, s, m)] = t
                    row.append((a, m))
                    continue
            row.append((IDLE, 0))
        if all(a == IDLE for a, _ in row) and any(orders):
            raise ValueError(f"pipeline: these orders never finish: stage(s) wait on actions that never come "
                             f"({[o[0] for o in orders if o]}); each backward needs its forward first")
        ticks.append(row)
        t += 1
    return Schedule(kind, stages, microbatches, np.asarray(ticks, np.int32))


def mesh(stages: int, devices=None) -> Mesh:
    """A 1-D mesh of the first ``stages`` devices with the axis ``pipe``."""
    devices = jax.devices() if devices is None else list(devices)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= len(devices):
        raise ValueError(f"pipeline.mesh: stages must be an int in [1, {len(devices)}] (the devices there are), got "
                         f"{stages!r}; on CPU simulate more with XLA_FLAGS=--xla_force_host_platform_device_count="
                         f"{stages} before JAX starts (funcnet.parallel.simulate_cpu_devices)")
    return Mesh(np.asarray(devices[:stages], dtype=object), ("pipe",))


def check_config(config, stages: int, microbatches: int, batch: int | None = None) -> None:
    """Raise, naming the fix, unless the GPT ``config`` (and ``batch``) split into the pipeline."""
    if config.dropout:
        raise ValueError(f"pipeline: the GPT must have dropout=0 (the backward reruns each stage), got "
                         f"dropout={config.dropout}; pass GPTConfig(..., dropout=0.0)")
    if config.n_layer % stages:
        raise ValueError(f"pipeline: n_layer={config.n_layer} blocks do not split into {stages} stages; pick a "
                         f"stage count among the divisors of {config.n_layer}")
    if batch is not None and batch % microbatches:
        raise ValueError(f"pipeline: a batch of {batch} sequences does not split into {microbatches} microbatches; "
                         f"pick a batch that is a multiple of {microbatches}")


def split_params(params: dict) -> tuple[dict, dict]:
    """A GPT's params -> ``(rest, blocks)``: ``rest`` = embeddings and final LayerNorm, ``blocks``
    stacked along a first layer axis (``gpt.stack_blocks``)."""
    t = params["transformer"]
    rest = {"transformer": {k: v for k, v in t.items() if k != "h"}}
    return rest, _gpt.stack_blocks(t["h"])


def join_params(rest: dict, blocks: dict, like: dict) -> dict:
    """``split_params``' inverse, into the structure of the GPT params ``like`` (the tied head kept)."""
    n = jax.tree.leaves(blocks)[0].shape[0]
    h = {str(i): jax.tree.map(lambda a, i=i: a[i], blocks) for i in range(n)}
    return {**like, "transformer": {**rest["transformer"], "h": h}}


AXES = ("data", "fsdp", "model", "pipe")


def _check_mesh(mesh: Mesh) -> frozenset:
    """The axes the pipeline runs by hand (``pipe``, and ``data`` when the mesh has it); the
    others (``model``, ``fsdp``) are left to the partitioner, inside each stage."""
    names = tuple(mesh.axis_names)
    if "pipe" not in names or not set(names) <= set(AXES) or len(set(names)) != len(names):
        raise ValueError(f"pipeline: the mesh's axes must be 'pipe' and any of 'data', 'fsdp', 'model', got {names}; "
                         f"build it with funcnet.parallel.pipeline.mesh(stages) or "
                         f"funcnet.parallel.strategy.mesh(data=, fsdp=, model=, pipe=)")
    return frozenset(a for a in names if a in ("data", "pipe"))


def make_value_and_grad(config, mesh: Mesh, microbatches: int, kind: str = "1f1b"):
    """``f(rest, blocks, idx, targets) -> (loss, (grad_rest, grad_blocks))``: the GPT's mean
    cross entropy over the batch ``idx``/``targets`` ``(B, T)`` and its gradients, computed by
    the pipeline. ``f.schedule`` is the table it runs.

    ``mesh``: ``pipe`` alone, or with ``data`` (each microbatch split over it, the loss and
    gradients averaged over it: data parallelism around the pipeline) and ``model`` / ``fsdp``
    (left to jit's partitioner inside each stage: the blocks' params placed by
    ``parallel.tensor``'s rules are multiplied as ``make_tp_step`` does)."""
    manual = _check_mesh(mesh)
    data = "data" in manual
    stages = int(mesh.shape["pipe"])
    check_config(config, stages, microbatches)
    plan = schedule(kind, stages, microbatches)
    slots, gslots, table = plan.held, plan.grads_held, jnp.asarray(plan.table)
    top = dict(dict(_gpt.GPT(config).children)["transformer"].children)
    M, last = microbatches, stages - 1

    def stage_fn(s, blocks, rest, x, idx, tgt):
        t = rest["transformer"]
        emb = top["wte"].apply(t["wte"], idx) + top["wpe"].apply(t["wpe"], jnp.arange(idx.shape[1]))
        x = jnp.where(s == 0, emb.astype(x.dtype), x)
        y = _gpt.scan_blocks(config, blocks, x)
        logits = top["ln_f"].apply(t["ln_f"], y) @ t["wte"]["weight"].T  # the tied head
        loss = jnp.where(s == last, _losses.cross_entropy(logits, tgt), 0.0)
        return y, loss

    def local(rest, blocks, idx, tgt):  # one stage: idx, tgt (M, B/M, T); blocks its L/P
        s = jax.lax.axis_index("pipe")
        mb, T = idx.shape[1], idx.shape[2]
        dtype = jax.tree.leaves(blocks)[0].dtype
        act = jnp.zeros((mb, T, config.n_embd), dtype)
        zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)

        def idle(carry, m):
            return act, act, jnp.zeros((), dtype), zeros(rest), zeros(blocks)

        def forward(carry, m):
            x = carry["x"][m % slots]
            y, loss = stage_fn(s, blocks, rest, x, idx[m], tgt[m])
            return y, act, loss.astype(dtype), zeros(rest), zeros(blocks)

        def backward(carry, m):
            x = carry["x"][m % slots]
            (_, loss), vjp = jax.vjp(lambda b, r, x: stage_fn(s, b, r, x, idx[m], tgt[m]), blocks, rest, x)
            gy = jnp.where(s == last, jnp.zeros_like(x), carry["g"][m % gslots])
            gb, gr, gx = vjp((gy, jnp.asarray(1.0 / M, loss.dtype)))
            return act, gx, jnp.zeros((), dtype), gr, gb

        def tick(carry, row):
            a, m = row[s, 0], row[s, 1]
            y, gx, loss, gr, gb = jax.lax.switch(a, (idle, forward, backward), carry, m)
            # the activation one stage on, the gradient one stage back (no wrap-around)
            y_in = jax.lax.ppermute(y, "pipe", [(i, i + 1) for i in range(stages - 1)])
            g_in = jax.lax.ppermute(gx, "pipe", [(i + 1, i) for i in range(stages - 1)])
            prev, nxt = row[jnp.maximum(s - 1, 0)], row[jnp.minimum(s + 1, last)]
            x_buf = jnp.where((s > 0) & (prev[0] == FORWARD),
                              carry["x"].at[prev[1] % slots].set(y_in), carry["x"])
            g_buf = jnp.where((s < last) & (nxt[0] == BACKWARD),
                              carry["g"].at[nxt[1] % gslots].set(g_in), carry["g"])
            new = {"x": x_buf, "g": g_buf, "loss": carry["loss"] + loss,
                   "rest": jax.tree.map(jnp.add, carry["rest"], gr),
                   "blocks": jax.tree.map(jnp.add, carry["blocks"], gb)}
            return new, None

        carry = {"x": jnp.zeros((slots, mb, T, config.n_embd), dtype),
                 "g": jnp.zeros((gslots, mb, T, config.n_embd), dtype), "loss": jnp.zeros((), dtype),
                 "rest": zeros(rest), "blocks": zeros(blocks)}
        carry = jax.lax.scan(tick, carry, table)[0]
        loss = jax.lax.psum(carry["loss"], "pipe") / M  # only the last stage's is not 0
        grads = (jax.lax.psum(carry["rest"], "pipe"), carry["blocks"])
        if data:  # DDP's all-reduce: each data replica ran its slice of every microbatch
            loss, grads = jax.lax.pmean((loss, grads), "data")
        return loss, grads

    def value_and_grad(rest, blocks, idx, targets):
        check_config(config, stages, microbatches, idx.shape[0])
        idx = idx.reshape(M, idx.shape[0] // M, *idx.shape[1:])
        targets = targets.reshape(idx.shape)
        if data and idx.shape[1] % mesh.shape["data"]:
            raise ValueError(f"pipeline: a microbatch of {idx.shape[1]} sequences does not split over the data axis "
                             f"of {mesh.shape['data']}; pick a batch that is a multiple of "
                             f"{microbatches * mesh.shape['data']}")
        batch = P(None, "data") if data else P()
        specs = (P(), P("pipe"), batch, batch)
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(P(), (P(), P("pipe"))),
                             axis_names=manual, check_vma=False)(rest, blocks, idx, targets)

    value_and_grad.schedule = plan
    return value_and_grad


def make_step(config, tx, mesh: Mesh, microbatches: int, kind: str = "1f1b"):
    """``step((rest, blocks), opt_state, idx, targets) -> ((rest, blocks), opt_state, loss)``:
    one ``tx`` update from the pipeline's gradients, jit-ed; ``blocks`` (and their optimizer
    state) stay split over ``pipe``. ``step.schedule``: the table; ``step.place(tree)`` puts
    ``(rest, blocks)``-shaped trees on the mesh."""
    import optax

    vg = make_value_and_grad(config, mesh, microbatches, kind)

    def step(params, opt_state, idx, targets):
        loss, grads = vg(*params, idx, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def place(tree):
        rest, blocks = tree
        return (jax.device_put(rest, NamedSharding(mesh, P())), jax.device_put(blocks, NamedSharding(mesh, P("pipe"))))

    jitted = jax.jit(step)
    jitted.schedule, jitted.place, jitted.value_and_grad = vg.schedule, place, vg
    return jitted
