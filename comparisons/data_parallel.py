"""DDP's all-reduce of gradients: torch DistributedDataParallel against JAX's three forms.

The articles wrap a model in ``nn.parallel.DistributedDataParallel`` and note that DDP
all-reduces the gradients during ``backward()``. Here the same MLP, from the same initial
weights, takes the same SGD steps on the same global batches five ways:

- torch DDP: 2 processes on 127.0.0.1 (gloo), each with half of every global batch;
- JAX ``pmap`` (``make_step(axis_name=...)``), ``shard_map`` (explicit ``lax.pmean``) and
  jit over a ``NamedSharding`` (the compiler inserts the all-reduce), on 2 devices;
- JAX on one device with the whole batch (what data parallelism must reproduce).

Besides the final weights, the check looks at where the all-reduce is: a comm hook counts
DDP's bucket all-reduces; in JAX the jaxpr shows the ``psum`` written by hand (pmap,
shard_map) or none (jit-sharding), and the compiled HLO shows the ``all-reduce`` XLA runs.
The JAX part needs 2 devices; in a process with fewer (``python -m comparisons``) it
runs in a child process with 8 simulated CPU devices.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from comparisons._core import Options, Result, Side, close, equal, expect, jax_in_child, source, torch_processes

# JAX and funcnet are imported inside the JAX functions: the DDP worker processes import
# this module to find ddp_worker, and start faster with torch alone.

__all__ = ["TITLE", "run"]

TITLE = "Data parallel: torch DDP (2 gloo processes) vs pmap, shard_map, jit-sharding and one device"

# A hang detector, not a speed bar: with other jobs on the machine (load average 20 on 2 cores)
# fsdp's JAX child ran past 400 s, where the whole comparison takes about 200 s on a lightly
# loaded machine, and a fixed 300-400 s limit failed runs that would have passed.
HANG_SECONDS = 1800
WORLD = 2  # torch processes and JAX devices
STEPS, BATCH, LR, SIZES = 40, 64, 0.1, (64, 32, 10)
FORMS = ("pmap", "shard_map", "sharding", "single")


# ----------------------------------------------------------------------------- torch
def ddp_worker(rank, world, rendezvous, workdir, dtype):
    import gc

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    # a file in the run's own folder, not a TCP port picked free and then bound by rank 0: no other
    # process on the machine can take it in between
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model = model.to(getattr(torch, dtype))
    model.load_state_dict(torch.load(f"{workdir}/init.pt"))  # the same weights in every process
    ddp = DDP(model)
    buckets = []

    def counting_allreduce(state, bucket):  # DDP's default hook, counted
        state.append(len(bucket.gradients()))
        return allreduce_hook(None, bucket)

    ddp.register_comm_hook(buckets, counting_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    xs, ys = torch.load(f"{workdir}/batches.pt")
    per = xs.shape[1] // world  # each process gets its block of every global batch
    losses, start = [], time.perf_counter()
    for x, y in zip(xs[:, rank * per:(rank + 1) * per], ys[:, rank * per:(rank + 1) * per]):
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()  # gradients are all-reduced (averaged) here, bucket by bucket
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
    seconds = time.perf_counter() - start
    if rank == 0:
        torch.save({"state_dict": model.state_dict(), "losses": losses, "buckets": buckets,
                    "seconds": seconds}, f"{workdir}/ddp.pt")
    dist.barrier()  # neither rank tears its gloo connections down while the other may still use them
    # DDP's reducer holds the process group. Destroyed from the reducer, the group joins gloo's threads with the GIL
    # held while one of them may wait for the GIL to free a tensor: a deadlock (pytorch/pytorch#56297), 1 exit in 30
    # here. Freed first, the reducer leaves the group to destroy_process_group, which drops the GIL while it waits.
    del ddp
    gc.collect()
    dist.destroy_process_group()



# ----------------------------------------------------------------------------- JAX
def jax_forms(params, xs, ys, n_devices):
    import jax
    import optax

    import funcnet
    from funcnet import nn, parallel, train

    model, tx = nn.MLP(list(SIZES)), optax.sgd(LR)
    out = {}
    for kind in FORMS:
        if kind == "single":
            step, put_state, put_batch, get = train.make_step(model, tx), (lambda t: t), (lambda b: b), (lambda t: t)
        else:
            dp = parallel.data_parallel(model, tx, kind=kind, devices=n_devices)
            step, put_state, put_batch, get = dp.step, dp.put_state, dp.put_batch, dp.get
        # a fresh copy per form: each step donates (consumes) the state it is given
        fresh = jax.tree.map(jax.numpy.array, params)
        state = put_state(train.create_train_state(model, tx, jax.random.key(0), params=fresh))
        batches = [put_batch((x, y)) for x, y in zip(xs, ys)]
        evidence, step = _where_is_the_all_reduce(step, state, batches[0])
        state, first = step(state, batches[0])
        losses, start = [get(first)["loss"]], time.perf_counter()
        for batch in batches[1:]:
            state, metrics = step(state, batch)
            jax.block_until_ready(losses[-1])  # two steps in flight at most (see parallel.run_epoch)
            losses.append(get(metrics)["loss"])
        jax.block_until_ready(state)
        out[kind] = {"params": {k: np.asarray(v) for k, v in funcnet.state_dict(get(state).params).items()},
                     "losses": [float(v) for v in losses], "seconds": time.perf_counter() - start, **evidence}
    return out


def _where_is_the_all_reduce(step, state, batch):
    """Counts of psum in the jaxpr and all-reduce in the compiled HLO, and the compiled step."""
    import jax

    jaxpr = str(jax.make_jaxpr(step)(state, batch))
    compiled = step.lower(state, batch).compile()  # run below, so the step compiles once
    lines = [ln.strip() for ln in compiled.as_text().splitlines() if "all-reduce(" in ln]
    return {"jaxpr_psum": len(re.findall(r"\bpsum", jaxpr)), "hlo_all_reduce": len(lines),
            "hlo_line": re.sub(r"\s+", " ", lines[0])[:150] if lines else ""}, compiled


def _jax_in_child(workdir: Path, dtype: str) -> dict:
    jax_in_child("comparisons.data_parallel", workdir, devices=8, x64=dtype == "float64", timeout=HANG_SECONDS)
    result = json.loads((workdir / "jax.json").read_text())
    for kind in FORMS:
        result[kind]["params"] = {k: np.asarray(v, dtype) for k, v in result[kind]["params"].items()}
    return result


def _child_main(workdir: str) -> None:
    import jax

    import funcnet
    from funcnet import nn

    inputs = np.load(Path(workdir) / "jax_inputs.npz")
    params = funcnet.load_state_dict(nn.MLP(list(SIZES)).init(jax.random.key(0)),
                                     {k[2:]: inputs[k] for k in inputs.files if k.startswith("p:")})
    out = jax_forms(params, inputs["xs"], inputs["ys"], WORLD)
    for kind in FORMS:
        out[kind]["params"] = {k: v.tolist() for k, v in out[kind]["params"].items()}
    (Path(workdir) / "jax.json").write_text(json.dumps(out))


# ----------------------------------------------------------------------------- both
def run(opts: Options = Options()) -> Result:
    import jax
    import torch

    import funcnet
    from funcnet import data, nn, parallel
    from funcnet.interop import from_torch, to_torch

    if opts.dtype == "float64" and not jax.config.jax_enable_x64 and jax.device_count() >= WORLD:
        raise RuntimeError("Options(dtype='float64') needs JAX_ENABLE_X64=1 set before JAX starts "
                           "(python -m comparisons --float64 does that in its own process)")
    (x_all, y_all), _ = data.load("digits")
    rows = np.random.default_rng(0).integers(0, len(x_all), size=(STEPS, BATCH))
    xs, ys = x_all[rows].astype(opts.dtype), y_all[rows].astype(np.int64)
    init = jax.tree.map(lambda a: np.asarray(a, opts.dtype), nn.MLP(list(SIZES)).init(jax.random.key(0)))

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        torch.save(to_torch(init), workdir / "init.pt")
        torch.save((torch.from_numpy(xs), torch.from_numpy(ys)), workdir / "batches.pt")
        ddp = torch_processes(ddp_worker, (WORLD, str(workdir / "rendezvous"), str(workdir), opts.dtype), WORLD)

        # the one JAX-side weight that perturb shifts: every later step depends on it
        bias = init["2"]["bias"].copy()
        bias[0] += opts.perturb
        jax_init = dict(init, **{"2": dict(init["2"], bias=bias)})
        if jax.device_count() >= WORLD:
            j = jax_forms(jax_init, xs, ys.astype(np.int32), WORLD)
        else:
            np.savez(workdir / "jax_inputs.npz", xs=xs, ys=ys.astype(np.int32),
                     **{"p:" + k: np.asarray(v) for k, v in funcnet.state_dict(jax_init).items()})
            j = _jax_in_child(workdir, opts.dtype)
        deadline = time.monotonic() + HANG_SECONDS
        while not ddp.join(timeout=10):
            if time.monotonic() > deadline:
                for p in ddp.processes:
                    p.kill()
                raise TimeoutError(f"the torch DDP processes did not finish within {HANG_SECONDS} s")
        t = torch.load(workdir / "ddp.pt")
    torch_params = funcnet.state_dict(from_torch(t["state_dict"]))

    tol = dict(opts.tol)
    why = (f"{STEPS} SGD steps; the sums over the batch run in different orders (halves then "
           f"all-reduce, or the whole batch), so float rounding differs a little each step")
    checks = [close(f"{kind}: final weights == torch DDP's", _flat(j[kind]["params"]), _flat(torch_params),
                    **tol, why=why) for kind in FORMS]
    checks += [close(f"{kind}: final weights == one device, whole batch", _flat(j[kind]["params"]),
                     _flat(j["single"]["params"]), **tol) for kind in FORMS[:3]]
    checks.append(close("mean loss per step: JAX shard_map == torch DDP", j["shard_map"]["losses"],
                        t["losses"], **tol))
    checks += [
        equal("torch: DDP all-reduced one bucket of all 4 gradients per backward()",
              t["buckets"], [4] * STEPS, why="a comm hook counted the bucket all-reduces"),
        expect("pmap: the all-reduce is the pmean written in the step",
               j["pmap"]["jaxpr_psum"] > 0 and j["pmap"]["hlo_all_reduce"] > 0,
               f"jaxpr: {j['pmap']['jaxpr_psum']} psum; compiled HLO: {j['pmap']['hlo_all_reduce']} all-reduce"),
        expect("shard_map: the all-reduce is the pmean written in the step",
               j["shard_map"]["jaxpr_psum"] > 0 and j["shard_map"]["hlo_all_reduce"] > 0,
               f"jaxpr: {j['shard_map']['jaxpr_psum']} psum; compiled HLO: "
               f"{j['shard_map']['hlo_all_reduce']} all-reduce"),
        expect("jit-sharding: no collective written, the compiler inserted the all-reduce",
               j["sharding"]["jaxpr_psum"] == 0 and j["sharding"]["hlo_all_reduce"] > 0,
               f"jaxpr: {j['sharding']['jaxpr_psum']} psum; compiled HLO: "
               f"{j['sharding']['hlo_all_reduce']} all-reduce"),
        expect("one device: no all-reduce at all", j["single"]["hlo_all_reduce"] == 0,
               f"compiled HLO: {j['single']['hlo_all_reduce']} all-reduce"),
    ]
    torch_out = (f"DDP, {WORLD} processes (gloo), global batch {BATCH} = {WORLD} x {BATCH // WORLD}\n"
                 f"bucket all-reduces per step: {t['buckets'][0]} gradients in 1 bucket\n"
                 f"loss: step 1 {t['losses'][0]:.6f} -> step {STEPS} {t['losses'][-1]:.6f}\n"
                 f"0.bias[:3] after {STEPS} steps: {np.round(torch_params['0.bias'][:3], 6)}")
    jax_out = "\n".join(
        f"{kind:9s}: jaxpr psum {j[kind]['jaxpr_psum']}, HLO all-reduce {j[kind]['hlo_all_reduce']}, "
        f"{STEPS / j[kind]['seconds']:.0f} steps/s" for kind in FORMS)
    jax_out += (f"\nwhere XLA all-reduces (sharding): {j['sharding']['hlo_line']}\n"
                f"loss: step 1 {j['shard_map']['losses'][0]:.6f} -> step {STEPS} "
                f"{j['shard_map']['losses'][-1]:.6f}\n"
                f"0.bias[:3] after {STEPS} steps: {np.round(j['shard_map']['params']['0.bias'][:3], 6)}")
    return Result(
        name="data_parallel", title=TITLE,
        # steady state: the JAX loop is timed after its first (compiling) step; torch eager compiles nothing
        torch=Side(source(ddp_worker), torch_out, steady_seconds=t["seconds"]),
        jax=Side(source(jax_forms, parallel.make_shard_map_step, parallel.make_sharded_step), jax_out,
                 steady_seconds=j["shard_map"]["seconds"]),
        checks=checks,
        notes=("The two DDP processes run while the JAX part runs; the times are those of the "
               f"{STEPS}-step loops alone. XLA combines the 6 psums (4 gradients, loss, accuracy) into "
               "one all-reduce. Simulated CPU devices share the host's cores; the timings are not a "
               "speed comparison."),
        series={"mean loss per step": {"torch DDP": t["losses"], "JAX pmap": j["pmap"]["losses"],
                                       "JAX shard_map": j["shard_map"]["losses"],
                                       "JAX jit-sharding": j["sharding"]["losses"]}},
    )


def _flat(params: dict) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(params[k], np.float64)) for k in sorted(params)])


if __name__ == "__main__":
    _child_main(sys.argv[1])
