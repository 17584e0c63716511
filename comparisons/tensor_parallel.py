"""Tensor parallelism (Megatron): torch ``parallelize_module`` and ``fully_shard`` on DTensor (gloo) against shardings.

torch: each ``Block``'s ``attn.c_attn`` and ``mlp.c_fc`` get ``ColwiseParallel()``, its
``attn.c_proj`` and ``mlp.c_proj`` ``RowwiseParallel()`` (``parallelize_module`` over the tp
sub-mesh of a cpu ``DeviceMesh``, processes on 127.0.0.1 with gloo); for FSDP x TP each
block and the root then get ``fully_shard`` over the dp sub-mesh (torch's 2-D recipe), each
dp rank taking its slice of the batch. TP 2, TP 4 and FSDP 2 x TP 2 run one after another in
the same 4 processes (TP 2 as two replicas of 2). The attention's forward is told its local
head count, as torch's TP tutorial does. JAX:
``funcnet.parallel.tensor.make_tp_step``: the same ``funcnet.make_step``, the params placed
by Megatron's rules on a ``(data, fsdp, model)`` mesh and jit-ed; XLA inserts the
all-reduces Megatron writes by hand. Both pack ``c_attn``'s outputs per device
(``parallel.tensor.pack_qkv``) so each device's slice holds whole heads.

The same GPT from the same weights takes the same Adam steps on one device, with TP on 2
and 4 devices, on a 2 x 2 FSDP x TP mesh, and in torch on each of those meshes. The
compiled HLO's collectives are counted against Megatron's 2 all-reduces per layer forward
and 2 backward, and each mesh's per-device bytes (XLA's memory analysis) against
``funcnet.memory.layout.plan``. The JAX part needs 4 devices; with fewer it runs in a child
process with simulated ones. The output ends with where the wall time went.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from comparisons._core import (Options, Result, Side, close, equal, expect, jax_in_child, side_by_side, source,
                               torch_processes)
from comparisons.fsdp import _flat

__all__ = ["CONFIG", "MESHES", "TITLE", "run"]

TITLE = ("Tensor parallelism: torch parallelize_module and fully_shard (DTensor, 4 gloo processes) vs Megatron's "
         "rules as shardings")

MESHES = {"TP 2": (1, 1, 2), "TP 4": (1, 1, 4), "FSDP 2 x TP 2": (1, 2, 2)}  # (data, fsdp, model)
STEPS, BATCH, LR = 3, 8, 1e-3
# What a second run in the same process need not redo, since Options.perturb moves only the JAX side's
# initial weights: torch's results (its weights and batches are seeded) and the compiled JAX programs
# (the weights are their arguments). The tests run a perturbed run after the passing one for the
# price of its few training steps.
_REUSED: dict = {}
CONFIG = {"block_size": 16, "vocab_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64, "dropout": 0.0}


# ----------------------------------------------------------------------------- torch
def tp_worker(rank, world, rendezvous, workdir, runs):
    """Every run of ``runs`` ({name: (fsdp, tp)}) in the same ``world`` gloo processes, one after
    another, each from the same weights: TP alone on a ``(world // tp, tp)`` mesh (the replicas
    each take the whole batch, no communication between them), FSDP x TP on ``(fsdp, tp)``
    (torch's 2-D recipe: ``parallelize_module`` over the tp sub-mesh, then ``fully_shard``
    over the dp one; each dp rank takes its slice of the batch)."""
    marks = [("process started", time.time())]
    import types

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from comparisons._torch_gpt import TorchGPT  # torch alone: no JAX in these processes

    torch.set_num_threads(1)
    marks.append(("imports", time.time()))
    # a file in the run's own folder, as the fsdp comparison's workers meet (no TCP port to race for)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    marks.append(("rendezvous", time.time()))
    xs, ys = torch.load(f"{workdir}/batches.pt")

    def local_attention(self, x):  # nanoGPT's forward with the local heads (the TP tutorial's n_heads //= tp)
        B, T, _ = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # this rank's q, k, v: its heads
        hs = self.n_embd // self.n_head
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, self.n_embd))  # all-reduce inside

    out = {}
    for name, (fsdp, tp) in runs.items():
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        model = TorchGPT(types.SimpleNamespace(bias=True, **CONFIG))  # GPTConfig's fields
        model.load_state_dict(torch.load(f"{workdir}/init_packed_{tp}.pt"))  # c_attn rows packed per tp rank
        for block in model.transformer.h:
            parallelize_module(block, mesh["tp"], {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                                   "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()})
            block.attn.n_head //= tp
            block.attn.n_embd //= tp
            block.attn.forward = types.MethodType(local_attention, block.attn)
        if fsdp > 1:
            for block in model.transformer.h:
                fully_shard(block, mesh=mesh["dp"])  # the block's DTensors sharded over dp too: 2-D
            fully_shard(model, mesh=mesh["dp"])
        dp_rank, rows = mesh["dp"].get_local_rank(), BATCH // fsdp
        optimizer = torch.optim.Adam(model.parameters(), lr=LR, foreach=False)  # DTensor and plain tensors mixed
        losses, start = [], time.perf_counter()
        for x, y in zip(xs, ys):
            if fsdp > 1:  # this dp rank's slice of the batch; FSDP averages the gradients over dp
                x, y = x[dp_rank * rows:(dp_rank + 1) * rows], y[dp_rank * rows:(dp_rank + 1) * rows]
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mean = loss.detach().clone()
            if fsdp > 1:
                dist.all_reduce(mean, group=mesh["dp"].get_group())
                mean /= fsdp
            losses.append(mean.item())
        seconds = time.perf_counter() - start
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t
        param_bytes = sum(local(p).numel() * p.element_size() for p in model.parameters())
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach()
                for k, v in model.state_dict().items()}
        out[name] = {"state_dict": full, "losses": losses, "seconds": seconds, "param_bytes": param_bytes}
        marks.append((name, time.time()))
    if rank == 0:
        torch.save({"runs": out, "marks": marks}, f"{workdir}/tp.pt")
    dist.barrier()  # no rank tears its gloo connections down while another may still use them
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- JAX
def jax_tp(params, xs, ys, meshes=MESHES):
    import jax
    import optax

    import funcnet
    from funcnet import gpt
    from funcnet import step as fstep
    from funcnet.parallel import tensor as tp
    from funcnet.memory import layout

    cfg, tx = gpt.GPTConfig(**CONFIG), optax.adam(LR)
    shape = layout.Shape(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.block_size, BATCH)
    batch = (jax.ShapeDtypeStruct(xs.shape[1:], xs.dtype), jax.ShapeDtypeStruct(ys.shape[1:], ys.dtype))
    out = {"runs": {}, "marks": [("imports", time.time())]}
    placed = {}  # name: (the model's mesh, its step, its state placed by the step's shardings)
    for name, (d, f, m) in {"one device": (1, 1, 1), **meshes}.items():
        model = gpt.GPT(cfg._replace(qkv_groups=m))
        fresh = tp.pack_qkv(jax.tree.map(np.asarray, params), m, cfg.n_head)  # in NumPy: no op compiled per mesh
        state = fstep.create_train_state(model, tx, jax.random.key(0), params=fresh)
        step = tp.make_tp_step(model, tx, mesh=tp.mesh(d, f, m), state=state, config=model_config(cfg, m))
        placed[name] = ((d, f, m), step, jax.device_put(state, step.shardings))
    # Megatron's count, alone: TP 2 with the embedding replicated (1 layer: tests/test_tensor_parallel.py)
    megatron = cfg._replace(qkv_groups=2)
    abstract = jax.eval_shape(lambda: fstep.create_train_state(gpt.GPT(megatron), tx, jax.random.key(0)))
    megatron_step = tp.make_tp_step(gpt.GPT(megatron), tx, mesh=tp.mesh(1, 1, 2), state=abstract, vocab="replicate")

    def compile_timed(step, state):
        begin = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        return compiled, time.perf_counter() - begin

    jobs = {name: functools.partial(compile_timed, step, state) for name, (_, step, state) in placed.items()}
    jobs["Megatron's count"] = functools.partial(compile_timed, megatron_step, abstract)
    key = ("compiled", tuple(sorted(meshes.items())), xs.shape, ys.shape)
    if key not in _REUSED:
        _REUSED[key] = side_by_side(jobs, "JAX: compiling each mesh's step")  # six independent programs
    done = dict(_REUSED[key])
    out["marks"].append(("compiles, side by side", time.time()))
    out["megatron"] = {cfg.n_layer: tp.collective_stats(done.pop("Megatron's count")[0])}
    for name, ((d, f, m), step, state) in placed.items():
        compiled, compile_seconds = done[name]
        stats = compiled.memory_analysis()
        losses, start = [], time.perf_counter()
        for x, y in zip(xs, ys):
            state, metrics = compiled(state, jax.device_put((x, y), step.batch_sharding))  # not step: a 2nd compile
            losses.append(metrics["loss"])
        jax.block_until_ready(state)
        plan = layout.plan(shape, layout.Layout(d, f, m))
        out["marks"].append((name, time.time()))
        out["runs"][name] = {
            "losses": [float(v) for v in losses], "seconds": time.perf_counter() - start,
            "compile_seconds": compile_seconds,
            "params": funcnet.state_dict(tp.unpack_qkv(jax.tree.map(np.asarray, state.params), m, cfg.n_head)),
            "collectives": tp.collective_stats(compiled), "arguments": int(stats.argument_size_in_bytes),
            "temps": int(stats.temp_size_in_bytes), "plan": plan.as_dict()}
    return out


def model_config(cfg, m):
    return cfg._replace(qkv_groups=m)


def _jax_in_child(workdir: Path) -> dict:
    # LLVM's optimisation of the CPU kernels off: the same HLO, buffers and collectives (the checks read those) in
    # about 2/3 of the compile time; the steps run slower, and simulated devices time nothing anyway
    jax_in_child("comparisons.tensor_parallel", workdir, devices=4, xla_flags="--xla_backend_optimization_level=0",
                 timeout=1200)
    return _load(workdir / "jax.json")


def _dump(out: dict, path: Path) -> None:
    for run in out["runs"].values():
        run["params"] = {k: v.tolist() for k, v in run["params"].items()}
    path.write_text(json.dumps(out))


def _load(path: Path) -> dict:
    out = json.loads(path.read_text())
    out["megatron"] = {int(k): v for k, v in out["megatron"].items()}
    for run in out["runs"].values():
        run["params"] = {k: np.asarray(v, np.float32) for k, v in run["params"].items()}
    return out


def _child_main(workdir: str) -> None:
    started = time.time()
    import jax

    import funcnet
    from funcnet import gpt

    inputs = np.load(Path(workdir) / "jax_inputs.npz")
    meshes = json.loads((Path(workdir) / "meshes.json").read_text())
    params = funcnet.load_state_dict(gpt.GPT(gpt.GPTConfig(**CONFIG)).init(jax.random.key(0)),
                                     {k[2:]: inputs[k] for k in inputs.files if k.startswith("p:")})
    out = jax_tp(params, inputs["xs"], inputs["ys"], {k: tuple(v) for k, v in meshes.items()})
    out["marks"].insert(0, ("process started", started))
    _dump(out, Path(workdir) / "jax.json")


def _packed(sd: dict, groups: int, n_head: int, unpack: bool = False) -> dict:
    from funcnet.parallel.tensor import regroup_qkv

    frm, to = (groups, 1) if unpack else (1, groups)
    return {k: (regroup_qkv(v, frm, to, n_head) if ".attn.c_attn." in k else v) for k, v in sd.items()}


# ----------------------------------------------------------------------------- both
def torch_runs(meshes: dict) -> dict:
    """{name: (fsdp, tp)}: the torch side of each JAX mesh (data x fsdp x model), run in one set of processes."""
    for name, (d, f, m) in meshes.items():
        if d != 1:
            raise ValueError(f"{name}: the torch side runs TP and FSDP x TP meshes, not a data axis; got {(d, f, m)}")
    return {name: (f, m) for name, (_, f, m) in meshes.items()}


def run(opts: Options = Options(), *, meshes: dict = MESHES) -> Result:
    """meshes: fewer meshes for a quicker run (the tests); "TP 2" must be among them."""
    import jax
    import torch

    import funcnet
    from comparisons._torch_gpt import TorchGPT
    from funcnet import gpt

    if opts.dtype != "float32":
        raise ValueError("the tensor_parallel comparison runs in float32 (gloo and the simulated devices)")
    torch.manual_seed(0)
    net = TorchGPT(gpt.GPTConfig(**CONFIG))
    sd = {k: v.detach().clone() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(0)
    xs = rng.integers(0, CONFIG["vocab_size"], size=(STEPS, BATCH, CONFIG["block_size"])).astype(np.int32)
    ys = rng.integers(0, CONFIG["vocab_size"], size=(STEPS, BATCH, CONFIG["block_size"])).astype(np.int32)
    init = funcnet.load_state_dict(gpt.GPT(gpt.GPTConfig(**CONFIG)).init(jax.random.key(0)),
                                   {k: v.numpy() for k, v in sd.items()})
    init["transformer"]["wte"]["weight"] = init["transformer"]["wte"]["weight"].at[0, 0].add(opts.perturb)
    n_devices = max(d * f * m for d, f, m in meshes.values())
    runs = torch_runs(meshes)
    world = max(f * m for f, m in runs.values())

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for tp in {m for _, m in runs.values()}:
            packed = _packed({k: v.numpy() for k, v in sd.items()}, tp, CONFIG["n_head"])
            torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in packed.items()},
                       workdir / f"init_packed_{tp}.pt")
        torch.save((torch.from_numpy(xs).long(), torch.from_numpy(ys).long()), workdir / "batches.pt")
        begin = time.time()
        torch_key = ("torch", tuple(sorted(runs.items())))
        saved = _REUSED.get(torch_key)
        ctx = None if saved is not None else torch_processes(tp_worker, (world, str(workdir / "rendezvous"),
                                                                         str(workdir), runs), world)
        if jax.device_count() >= n_devices:
            j = jax_tp(init, xs, ys, meshes)
        else:
            np.savez(workdir / "jax_inputs.npz", xs=xs, ys=ys,
                     **{"p:" + k: np.asarray(v) for k, v in funcnet.state_dict(init).items()})
            (workdir / "meshes.json").write_text(json.dumps(meshes))
            j = _jax_in_child(workdir)
        deadline = time.monotonic() + 300
        while ctx is not None and not ctx.join(timeout=10):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError("the torch tensor-parallel processes did not finish within 300 s")
        if saved is None:
            saved = _REUSED[torch_key] = torch.load(workdir / "tp.pt")
        t, t_marks = saved["runs"], saved["marks"]
        joined = time.time()
    for name, (_, tp) in runs.items():
        t[name]["params"] = _packed({k: v.numpy() for k, v in t[name]["state_dict"].items()}, tp, CONFIG["n_head"],
                                    unpack=True)
    return _result(j, t, meshes, world, {"torch": _phases(begin, t_marks), "JAX": _phases(begin, j["marks"]),
                                         "joined": joined - begin})


def _phases(begin: float, marks: list) -> str:
    """'label seconds' for each phase since the previous mark (the first since ``begin``, the spawn)."""
    out, last = [], begin
    for label, stamp in marks:
        out.append(f"{label} {stamp - last:.1f}")
        last = stamp
    return ", ".join(out) + f" (done at {last - begin:.1f} s)"


def _torch_name(f: int, m: int) -> str:
    if f > 1:
        return f"fully_shard x parallelize_module ({f} x {m} processes)"
    return f"parallelize_module ({m} processes)"


def _result(j, t, meshes, world, walls) -> Result:
    one, L = j["runs"]["one device"], CONFIG["n_layer"]
    tol = {"rtol": 1e-4, "atol": 1e-5}
    why = (f"{STEPS} Adam steps; the split matmuls sum in other orders, and Adam's first steps are lr x sign "
           f"for near-zero gradients, turning their float32 rounding into up to 1% of lr")
    checks = []
    for name in meshes:
        r = j["runs"][name]
        checks += [close(f"{name}: losses == one device", r["losses"], one["losses"], rtol=1e-5, atol=1e-6,
                         why="the same batch; only the order of the split sums differs"),
                   close(f"{name}: final params == one device", _flat(r["params"]), _flat(one["params"]), **tol,
                         why=why)]
    for name, (_, f, m) in meshes.items():
        r, tr = j["runs"][name], t[name]
        checks += [
            close(f"losses per step: JAX {name} == torch {_torch_name(f, m)}", r["losses"], tr["losses"], rtol=1e-5,
                  atol=1e-5, why="same weights and batches; float32 rounding"),
            close(f"final params: JAX {name} == torch DTensor (full_tensor)", _flat(r["params"]),
                  _flat({k: tr["params"][k] for k in r["params"]}), **tol, why=why),
        ]
    meg = j["megatron"]
    for n_layer, c in meg.items():
        others = {k: v["count"] for k, v in c.items() if k != "all-reduce" and v["count"]}
        checks.append(equal(f"TP 2, {n_layer} layer(s), embedding replicated: all-reduces in the HLO == Megatron's "
                            f"2 forward + 2 backward per layer", (c["all-reduce"]["count"], others),
                            (4 * n_layer, {}), why="no other collective: the blocks' inputs and outputs are whole"))
    tp2 = j["runs"]["TP 2"]["collectives"]["all-reduce"]["count"]
    checks.append(expect("TP 2 with the vocabulary split: Megatron's 4 per layer plus the embedding's and the "
                         "parallel cross entropy's", tp2 > 4 * L,
                         f"{tp2} all-reduces = {4 * L} in the blocks + {tp2 - 4 * L} for the split vocabulary"))
    for name, (d, f, m) in meshes.items():
        r, plan = j["runs"][name], j["runs"][name]["plan"]
        state = plan["params"] + plan["optimizer"] + 2 * BATCH * CONFIG["block_size"] * 4 // (d * f)
        checks.append(close(f"{name}: per-device arguments (params, Adam state, batch slice) == the planner's",
                            r["arguments"], state, rtol=0.01, atol=0,
                            why="the planner splits the same arrays by the same rules; Adam's step count and "
                                "the small arrays it rounds are the rest"))
    rows = [("mesh             losses (first -> last)   all-reduce  all-gather  other  bytes moved  "
            "per-device bytes  planned  ratio")]
    for name, r in j["runs"].items():
        c = r["collectives"]
        other = sum(v["count"] for k, v in c.items() if k not in ("all-reduce", "all-gather"))
        rows.append(f"{name:15s}  {r['losses'][0]:.6f} -> {r['losses'][-1]:.6f}  {c['all-reduce']['count']:10d}  "
                    f"{c['all-gather']['count']:10d}  {other:5d}  {sum(v['bytes'] for v in c.values()):11,}  "
                    f"{r['arguments'] + r['temps']:16,}  {r['plan']['total']:9,}  "
                    f"{(r['arguments'] + r['temps']) / r['plan']['total']:.2f}")
    timing = (f"wall seconds, from the spawn (both sides run at once): torch processes: {walls['torch']}; JAX: "
              f"{walls['JAX']}; each program's compile (side by side, one thread per core) "
              + ", ".join(f"{n} {r['compile_seconds']:.1f}" for n, r in j["runs"].items())
              + f"; the torch processes joined at {walls['joined']:.1f} s")
    j_out = "\n".join([f"GPT {CONFIG}, Adam lr {LR}, {STEPS} steps, batch {BATCH}; mesh (data, fsdp, model)", *rows,
                       "Megatron's count (TP 2, embedding replicated): " + ", ".join(
                           f"{n} layer(s): {c['all-reduce']['count']} all-reduces of {c['all-reduce']['bytes']:,} "
                           f"bytes" for n, c in meg.items()), timing])
    t_lines = [(f"parallelize_module on {L} blocks (Colwise c_attn, c_fc; Rowwise c_proj x2), fully_shard on the "
                f"blocks and the root over the dp sub-mesh for FSDP x TP; {world} gloo processes (cpu mesh)")]
    for name, (_, f, m) in meshes.items():
        tr = t[name]
        t_lines.append(f"{name:15s} {_torch_name(f, m)}: loss {tr['losses'][0]:.6f} -> {tr['losses'][-1]:.6f}, "
                       f"rank 0 holds {tr['param_bytes']:,} bytes of params, {tr['seconds']:.2f} s")
    t_out = "\n".join(t_lines)
    notes = ("Per-device bytes are XLA's arguments + temps of the compiled step; the planner's total counts params, "
             "gradients, Adam state and Korthikanti's activations. The state is exact (the checks); the temps are "
             "not a sum of live tensors: without remat JAX keeps about 2x the paper's activation list (the GELU's "
             "erf terms, the masked scores, LayerNorm's centred input), XLA fuses gradients into Adam's update on "
             "one device, and on the fsdp axis XLA's partitioner all-gathers the whole batch's activations as well "
             "as the weights at these sizes (8 sequences on each device where the planner counts 4). Every DTensor "
             "piece used here runs on gloo: the Colwise/Rowwise hooks' all-reduce, and fully_shard's all-gather and "
             "reduce-scatter over the dp sub-mesh of a 2-D mesh. Simulated CPU devices share the host's cores and "
             "the JAX child compiles without LLVM's optimisations: the timings are no speed comparison. The FSDP x "
             "TP mesh adds the FSDP all-gathers (and on XLA:CPU all-to-alls for resharding the split embedding's "
             "gradient).")
    return Result(
        name="tensor_parallel", title=TITLE,
        torch=Side(source(tp_worker), t_out, steady_seconds=t["TP 2"]["seconds"]),
        jax=Side(source(jax_tp), j_out, steady_seconds=j["runs"]["TP 2"]["seconds"]),
        checks=checks, notes=notes,
        series={"loss per step": {**{f"torch DTensor {n}": r["losses"] for n, r in t.items()},
                                  **{f"JAX {n}": r["losses"] for n, r in j["runs"].items()}}},
    )


if __name__ == "__main__":
    _child_main(sys.argv[1])
