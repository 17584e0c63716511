"""ZeRO stages 1 and 2: torch ``ZeroRedundancyOptimizer`` and FSDP2 ``reshard_after_forward=False``
(2 gloo processes) against ``funcnet.parallel.zero`` on 2 devices.

The ZeRO paper's first figure: data parallelism keeps the whole optimizer state, gradients and
parameters on every device; stage 1 splits the optimizer state over the N devices, stage 2 the
gradients too. torch: stage 1 is DDP plus ``ZeroRedundancyOptimizer`` (each rank owns the Adam
state of a subset of the parameters, whole tensors, and broadcasts them after its step); close
to stage 2 is FSDP2 ``fully_shard(reshard_after_forward=False)`` (gradients reduce-scattered,
each rank updates its shard; the parameters stay gathered from forward to backward, but unlike
stage 2 are sharded again between steps). JAX: ``zero.make_zero_step(stage=1|2)``, the
optimizer state placed sharded with ``NamedSharding`` (each array split along one axis) and the
step jit-ed with those shardings; XLA inserts the collectives. The same MLP from the same
weights takes the same Adam steps on the same global batches, each process or device with half.

The JAX part needs 2 devices; in a process with fewer (``python -m comparisons``) it runs in a
child process with simulated CPU devices.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from comparisons._core import (
    Options,
    Result,
    Side,
    close,
    equal,
    expect,
    jax_in_child,
    source,
    torch_processes,
)

__all__ = ["TITLE", "run"]

TITLE = "ZeRO-1/2: torch ZeroRedundancyOptimizer and FSDP2 (reshard_after_forward=False) vs funcnet.parallel.zero"

HANG_SECONDS = 1800  # a hang detector, not a speed bar (see data_parallel)
WORLD = 2  # torch processes and JAX devices
STEPS, BATCH, LR, SIZES = 4, 16, 1e-2, (32, 64, 16)
STAGES = ("ddp", "zero1", "zero2")


# ----------------------------------------------------------------------------- torch
def zero_worker(rank, world, rendezvous, workdir, dtype):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    xs, ys = torch.load(f"{workdir}/batches.pt")
    per = xs.shape[1] // world

    def build():
        model = torch.nn.Sequential(torch.nn.Linear(*SIZES[:2]), torch.nn.ReLU(), torch.nn.Linear(*SIZES[1:]))
        model.load_state_dict(torch.load(f"{workdir}/init.pt"))  # the same weights in every process
        return model.to(getattr(torch, dtype))

    def train(model, optimizer):
        losses = []
        for x, y in zip(xs[:, rank * per:(rank + 1) * per], ys[:, rank * per:(rank + 1) * per]):
            loss = F.cross_entropy(model(x.to(getattr(torch, dtype))), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(total.item() / world)
        return losses

    def state_bytes(state):  # Adam's exp_avg and exp_avg_sq this rank holds (the step counts left out)
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
        return sum(local(v).numel() * v.element_size() for s in state.values() for v in s.values()
                   if torch.is_tensor(v) and v.dim() > 0)

    out, start = {}, time.perf_counter()
    # stage 1: DDP all-reduces whole gradients; each rank steps Adam on the parameters it owns, then broadcasts them
    ddp = DDP(build())
    zero1 = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    out["zero1"] = {"losses": train(ddp, zero1), "state_bytes": state_bytes(zero1.optim.state),
                    "params": {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}}
    # ~stage 2: gradients reduce-scattered, each rank updates its shard (params kept gathered through the step)
    fsdp = build()
    fully_shard(fsdp, mesh=init_device_mesh("cpu", (world,)), reshard_after_forward=False)
    adam = torch.optim.Adam(fsdp.parameters(), lr=LR)
    out["fsdp2"] = {"losses": train(fsdp, adam), "state_bytes": state_bytes(adam.state),
                    "params": {k: v.full_tensor().detach() for k, v in fsdp.state_dict().items()}}
    seconds = time.perf_counter() - start
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {k: v["state_bytes"] for k, v in out.items()})
    if rank == 0:
        torch.save({"runs": out, "state_bytes": per_rank, "seconds": seconds}, f"{workdir}/torch.pt")
    dist.barrier()  # neither rank tears its gloo connections down while the other may still use them
    del ddp, zero1  # DDP's reducer freed before the group it holds is destroyed: see comparisons/data_parallel.py
    gc.collect()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- JAX
def jax_zero(params, xs, ys):
    import jax
    import optax

    import funcnet
    from funcnet import memory, nn, train
    from funcnet.parallel import fsdp, zero

    model = nn.Sequential(nn.Linear(*SIZES[:2]), nn.ReLU(), nn.Linear(*SIZES[1:]))
    tx, mesh = optax.adam(LR), fsdp.mesh(WORLD)
    fresh = lambda: train.create_train_state(model, tx, jax.random.key(0), params=jax.tree.map(jax.numpy.array, params))  # noqa: E731
    abstract = jax.eval_shape(fresh)
    batch = (jax.ShapeDtypeStruct(xs.shape[1:], xs.dtype), jax.ShapeDtypeStruct(ys.shape[1:], ys.dtype))
    steps = {"ddp": fsdp.make_fsdp_step(model, tx, mesh=mesh, state=abstract, zero=0),  # plain data parallel
             "zero1": zero.make_zero_step(model, tx, mesh=mesh, stage=1, state=abstract),
             "zero2": zero.make_zero_step(model, tx, mesh=mesh, stage=2, state=abstract)}
    out = {}
    for name, step in steps.items():
        compiled = step.lower(abstract, batch).compile()
        state = fsdp.shard_state(fresh(), step.shardings)
        losses, start = [], time.perf_counter()
        for x, y in zip(xs, ys):
            state, metrics = compiled(state, jax.device_put((x, y), step.batch_sharding))
            losses.append(float(metrics["loss"]))
        seconds = time.perf_counter() - start
        # what device 0 holds of Adam's mu and nu (the step count left out, as on the torch side)
        state_bytes = sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(state.opt_state) if a.ndim)
        out[name] = {"losses": losses, "seconds": seconds, "state_bytes": int(state_bytes),
                     "whole_state_bytes": memory.tree_bytes([a for a in jax.tree.leaves(state.opt_state) if a.ndim]),
                     "per_device_bytes": fsdp.per_device_bytes(compiled), "collectives": fsdp.collectives(compiled),
                     "params": {k: np.asarray(v).tolist() for k, v in funcnet.state_dict(state.params).items()}}
    return out


def _child_main(workdir: str) -> None:
    inputs = np.load(Path(workdir) / "jax_inputs.npz")
    params = _params({k[2:]: inputs[k] for k in inputs.files if k.startswith("p:")})
    (Path(workdir) / "jax.json").write_text(json.dumps(jax_zero(params, inputs["xs"], inputs["ys"])))


def _params(flat: dict):
    import jax

    import funcnet
    from funcnet import nn

    model = nn.Sequential(nn.Linear(*SIZES[:2]), nn.ReLU(), nn.Linear(*SIZES[1:]))
    return funcnet.load_state_dict(model.init(jax.random.key(0)), flat)


# ----------------------------------------------------------------------------- both
def run(opts: Options = Options()) -> Result:
    import jax
    import torch

    dtype = opts.dtype
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(*SIZES[:2]), torch.nn.ReLU(), torch.nn.Linear(*SIZES[1:]))
    sd = {k: v.detach().clone() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((STEPS, BATCH, SIZES[0])).astype(dtype)
    ys = rng.integers(0, SIZES[-1], (STEPS, BATCH)).astype(np.int32)
    flat = {k: v.numpy().astype(dtype) for k, v in sd.items()}
    flat["0.weight"] = flat["0.weight"].copy()
    flat["0.weight"][0, 0] += opts.perturb  # the JAX side's only: the checks against torch must then fail

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        torch.save(sd, workdir / "init.pt")
        torch.save((torch.from_numpy(xs), torch.from_numpy(ys).long()), workdir / "batches.pt")
        ctx = torch_processes(zero_worker, (WORLD, str(workdir / "rendezvous"), str(workdir), dtype), WORLD)
        if jax.device_count() >= WORLD and (dtype == "float32" or jax.config.jax_enable_x64):
            j = json.loads(json.dumps(jax_zero(_params(flat), xs, ys)))
        else:
            np.savez(workdir / "jax_inputs.npz", xs=xs, ys=ys, **{"p:" + k: v for k, v in flat.items()})
            jax_in_child("comparisons.zero", workdir, x64=dtype == "float64", timeout=HANG_SECONDS)
            j = json.loads((workdir / "jax.json").read_text())
        deadline = time.monotonic() + HANG_SECONDS
        while not ctx.join(timeout=10):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"the torch ZeRO processes did not finish within {HANG_SECONDS} s")
        t = torch.load(workdir / "torch.pt")

    eps = float(np.finfo(dtype).eps)
    # Adam moves each weight by about lr a step, scale-free in the gradient: a gradient that differs by the
    # rounding of its sums (reductions up to 64 long: the hidden layer and the batch) moves the update by
    # 64 eps relative, so after STEPS steps the weights by lr * STEPS * 64 eps
    tol = {"rtol": 64 * eps, "atol": LR * STEPS * 64 * eps}
    why = f"{STEPS} Adam steps, lr {LR}; sums of up to 64 terms in other orders (torch vs XLA, 2 ranks)"
    loss_tol = {"rtol": 64 * eps, "atol": 0.0}
    flat_j = {name: _flat(j[name]["params"]) for name in STAGES}
    flat_t = {name: _flat({k: v.numpy() for k, v in t["runs"][name]["params"].items()}) for name in ("zero1", "fsdp2")}
    checks = [
        close("losses per step: JAX zero1 == torch ZeroRedundancyOptimizer", j["zero1"]["losses"],
              t["runs"]["zero1"]["losses"], **loss_tol, why="same weights and batches"),
        close("params after the steps: JAX zero1 == torch ZeroRedundancyOptimizer", flat_j["zero1"], flat_t["zero1"],
              **tol, why=why),
        close("losses per step: JAX zero2 == torch FSDP2 (reshard_after_forward=False)", j["zero2"]["losses"],
              t["runs"]["fsdp2"]["losses"], **loss_tol, why="same weights and batches"),
        close("params after the steps: JAX zero2 == torch FSDP2 (full_tensor)", flat_j["zero2"], flat_t["fsdp2"],
              **tol, why=why),
        close("JAX zero1 and zero2 == plain data parallel (everything replicated)",
              np.concatenate([flat_j["zero1"], flat_j["zero2"]]), np.concatenate([flat_j["ddp"]] * 2), **tol,
              why="the same step; only where the elementwise update runs differs"),
    ]
    whole = j["ddp"]["state_bytes"]
    checks += [
        equal("JAX zero1 and zero2: device 0 holds half of each split Adam array, the whole of the rest",
              [j["zero1"]["state_bytes"], j["zero2"]["state_bytes"]], [_half_of_split(j, whole)] * 2,
              why="arrays of 1024+ elements split along one axis, biases whole (fsdp.param_spec)"),
        expect("torch ZeroRedundancyOptimizer: each rank holds the Adam state of its own parameters, together one copy",
               sum(r["zero1"] for r in t["state_bytes"]) == whole and max(r["zero1"] for r in t["state_bytes"]) < whole,
               f"per rank {[r['zero1'] for r in t['state_bytes']]} bytes, one whole copy {whole:,}"),
        expect("torch FSDP2: each rank holds half of the Adam state",
               sum(r["fsdp2"] for r in t["state_bytes"]) == whole
               and all(r["fsdp2"] == whole // WORLD for r in t["state_bytes"]),
               f"per rank {[r['fsdp2'] for r in t['state_bytes']]} bytes, one whole copy {whole:,}"),
    ]
    rows = ["form    Adam state on device 0  bytes/device (compiled)  all-gather  reduce-scatter  all-reduce"]
    for name in STAGES:
        c = j[name]["collectives"]
        rows.append(f"{name:6}  {j[name]['state_bytes']:22,}  {j[name]['per_device_bytes']:23,}  "
                    f"{c['all-gather']:10d}  {c['reduce-scatter']:14d}  {c['all-reduce']:10d}")
    j_out = "\n".join([f"MLP {SIZES}, Adam lr {LR}, {STEPS} steps, global batch {BATCH} over {WORLD} devices, {dtype}",
                       *[f"{name}: loss {j[name]['losses'][0]:.6f} -> {j[name]['losses'][-1]:.6f}" for name in STAGES],
                       *rows])
    t_out = "\n".join([f"{WORLD} processes (gloo), batch {BATCH // WORLD} per rank",
                       *[f"{name}: loss {r['losses'][0]:.6f} -> {r['losses'][-1]:.6f}"
                         for name, r in t["runs"].items()],
                       *[f"rank {i}: Adam state ZeroRedundancyOptimizer {r['zero1']:,} bytes, FSDP2 "
                         f"{r['fsdp2']:,} bytes" for i, r in enumerate(t["state_bytes"])]])
    notes = ("ZeroRedundancyOptimizer splits whole parameters between ranks (greedily by size), so its ranks hold "
             "unequal shares; funcnet splits each large array along one axis. XLA:CPU compiles stage 1 and 2 to the "
             "same collectives (an all-reduce of the gradients, then each device slicing its shard): stage 2's "
             "sharding constraint on the gradients becomes a reduce-scatter where the backend rewrites that pair "
             "(GPU, TPU). Simulated CPU devices share the host's cores: the timings are no speed comparison.")
    return Result(
        name="zero", title=TITLE,
        torch=Side(source(zero_worker), t_out, steady_seconds=t["seconds"]),
        jax=Side(source(jax_zero), j_out, steady_seconds=j["zero2"]["seconds"]),
        checks=checks, notes=notes,
        series={"loss per step": {"torch ZeroRedundancyOptimizer": t["runs"]["zero1"]["losses"],
                                  "torch FSDP2": t["runs"]["fsdp2"]["losses"],
                                  **{f"JAX {name}": j[name]["losses"] for name in ("zero1", "zero2")}}},
    )


def _half_of_split(j: dict, whole: int) -> int:
    """Device 0's Adam bytes when every array of 1024+ elements is split in 2 (mu and nu of both weights)."""
    sizes = [SIZES[0] * SIZES[1], SIZES[1] * SIZES[2]]  # the weights; the biases (64, 16) stay whole
    itemsize = whole // (2 * sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:])))
    split = 2 * sum(sizes) * itemsize
    return whole - split + split // WORLD


def _flat(params: dict) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(params[k], np.float64)) for k in sorted(params)])


if __name__ == "__main__":
    _child_main(sys.argv[1])
