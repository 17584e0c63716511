"""Pipeline parallelism: torch.distributed.pipelining (GPipe, 1F1B on 2 gloo processes) vs a tick table in shard_map.

torch: each rank builds its stage of the GPT (rank 0: the embeddings and the first half of
the blocks; rank 1: the other half, the final LayerNorm and the head), wraps it in
``PipelineStage`` and runs ``ScheduleGPipe`` or ``Schedule1F1B`` over 4 microbatches; the
tied embedding/head weight lives on both ranks, and its two gradients are summed with one
``all_reduce`` before Adam's step (pipelining leaves tied weights to the user). JAX:
``funcnet.parallel.pipeline.make_value_and_grad`` under optax's Adam (``pipeline.make_step``'s step):
the blocks stacked and split over a ``pipe`` mesh axis, the schedule a table of F/B slots
that one ``shard_map``-ed ``lax.scan`` runs tick by tick, ``ppermute`` passing activations
on and gradients back.

The same GPT from the same weights takes the same Adam steps on one device, in the JAX
pipeline and in torch's, under both schedules: losses per step, first-step gradients and
final params are compared. Each torch stage logs the forwards and backwards its schedule runs
(``forward_one_chunk``, ``backward_one_chunk``);
laid out tick by tick (an action waits for what it needs), that order must give the table
the JAX pipeline runs. The bubble is the table's idle slots against (P - 1) / (M + P - 1);
each stage's held inputs are M under GPipe, at most P under 1F1B. The JAX part needs 2 devices; with fewer it runs in a child process with
simulated ones.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from fractions import Fraction
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

__all__ = ["CONFIG", "TITLE", "run"]

TITLE = "Pipeline parallelism: torch.distributed.pipelining GPipe and 1F1B (2 gloo processes) vs shard_map + ppermute"

STAGES, MICROBATCHES, STEPS, BATCH, LR = 2, 4, 2, 8, 1e-3
KINDS = ("gpipe", "1f1b")
CONFIG = {"block_size": 8, "vocab_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.0}
# What a second run in the same process need not redo, since Options.perturb moves only the JAX side's
# initial weights: torch's results for each schedule (each trains from the same weights, whichever ran
# before it) and the jitted JAX steps (the weights are their arguments). The tests run a perturbed run
# after the passing one for the price of its JAX steps.
_REUSED: dict = {}


# ----------------------------------------------------------------------------- torch
def pipeline_worker(rank, world, rendezvous, workdir, kinds):
    """Both schedules, one after the other, in the same ``world`` gloo processes, each from the same weights."""
    import types

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from comparisons._torch_gpt import (
        TorchGPT,  # torch alone: no JAX in these processes
    )

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    xs, ys = torch.load(f"{workdir}/batches.pt")
    per_stage = CONFIG["n_layer"] // world

    class Stage(nn.Module):
        def __init__(self, gpt, first, last):
            super().__init__()
            self.first, self.last = first, last
            self.h = nn.ModuleList(gpt.transformer.h[rank * per_stage:(rank + 1) * per_stage])
            if first:
                self.wte, self.wpe = gpt.transformer.wte, gpt.transformer.wpe
            if last:
                self.ln_f, self.lm_head = gpt.transformer.ln_f, gpt.lm_head

        def forward(self, x):
            if self.first:
                x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
            for block in self.h:
                x = block(x)
            if self.last:
                x = self.lm_head(self.ln_f(x))
            return x

    def gpt_name(name):  # the stage's parameter names as the whole GPT's
        name = re.sub(r"^h\.(\d+)\.", lambda g: f"transformer.h.{int(g[1]) + rank * per_stage}.", name)
        return re.sub(r"^(wte|wpe|ln_f)\.", r"transformer.\1.", name)

    loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    out = {}
    for kind in kinds:
        gpt = TorchGPT(types.SimpleNamespace(bias=True, **CONFIG))
        gpt.load_state_dict(torch.load(f"{workdir}/init.pt"))
        log = []
        stage_module = Stage(gpt, rank == 0, rank == world - 1)
        stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
        for method, tag in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):  # log what the schedule runs
            run_chunk = getattr(stage, method)
            setattr(stage, method, lambda chunk, *a, _run=run_chunk, _tag=tag, _log=log, **k: _log.append((_tag, chunk))
                    or _run(chunk, *a, **k))
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind](stage, MICROBATCHES, loss_fn=loss_fn)
        tied = stage_module.wte.weight if rank == 0 else stage_module.lm_head.weight  # one tensor per rank
        optimizer = torch.optim.Adam(stage_module.parameters(), lr=LR)
        losses, grads, orders = [], None, []
        for x, y in zip(xs, ys):
            optimizer.zero_grad()
            step_losses = []
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=step_losses)
            dist.all_reduce(tied.grad)  # the embedding's gradient (rank 0) + the head's (rank 1)
            if grads is None:
                grads = {gpt_name(k): p.grad.clone() for k, p in stage_module.named_parameters()}
            optimizer.step()
            losses.append(float(torch.stack(step_losses).detach().mean()) if step_losses else None)
            orders.append(list(log))
            log.clear()
        params = {gpt_name(k): p.detach().clone() for k, p in stage_module.named_parameters()}
        out[kind] = {"losses": losses, "grads": grads, "params": params, "order": orders[0]}
    torch.save(out, f"{workdir}/stage_{rank}.pt")
    dist.barrier()  # no rank tears its gloo connections down while another may still use them
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- JAX
def jax_pipeline(params, xs, ys, kinds=KINDS):
    import jax
    import optax

    import funcnet
    from funcnet import gpt, losses
    from funcnet.parallel import pipeline as pp

    cfg, tx = gpt.GPTConfig(**CONFIG), optax.adam(LR)
    model = gpt.GPT(cfg)
    out = {"runs": {}}

    # one device: jax.value_and_grad of the whole GPT's loss, Adam
    loss_of = lambda p, x, y: losses.cross_entropy(model.apply(p, x), y)

    def make_one_step():
        @jax.jit
        def one_step(p, opt, x, y):
            loss, g = jax.value_and_grad(loss_of)(p, x, y)
            updates, opt = tx.update(g, opt, p)
            return optax.apply_updates(p, updates), opt, loss, g

        return one_step

    if ("jax", "one device") not in _REUSED:
        _REUSED[("jax", "one device")] = make_one_step()
    one_step = _REUSED[("jax", "one device")]

    p, opt, run = params, tx.init(params), {"losses": []}
    for x, y in zip(xs, ys):
        p, opt, loss, g = one_step(p, opt, x, y)
        run["losses"].append(float(loss))
        run.setdefault("grads", funcnet.state_dict(g))
    run["params"] = funcnet.state_dict(p)
    out["runs"]["one device"] = run

    mesh = pp.mesh(STAGES)
    for kind in kinds:
        if ("jax", kind) not in _REUSED:
            vg = pp.make_value_and_grad(cfg, mesh, MICROBATCHES, kind)

            @jax.jit
            def train_step(split, opt, x, y, vg=vg):  # pipeline.make_step's step, with the gradients kept to compare
                loss, grads = vg(*split, x, y)
                updates, opt = tx.update(grads, opt, split)
                return optax.apply_updates(split, updates), opt, loss, grads

            _REUSED[("jax", kind)] = vg, train_step
        vg, train_step = _REUSED[("jax", kind)]

        split = pp.split_params(params)
        opt, run = tx.init(split), {"losses": []}
        for x, y in zip(xs, ys):
            split, opt, loss, grads = train_step(split, opt, x, y)
            run["losses"].append(float(loss))
            run.setdefault("grads", funcnet.state_dict(pp.join_params(*grads, like=params)))
        run["params"] = funcnet.state_dict(pp.join_params(*split, like=params))
        s = vg.schedule
        run.update(table=s.table.tolist(), held=s.held, drawn=s.draw())
        out["runs"][kind] = run
    return out


def _jax_in_child(workdir: Path, kinds) -> dict:
    jax_in_child("comparisons.pipeline_parallel", workdir, *kinds, devices=STAGES,
                 xla_flags="--xla_backend_optimization_level=0", timeout=600)
    out = json.loads((workdir / "jax.json").read_text())
    for run in out["runs"].values():
        for k in ("grads", "params"):
            run[k] = {n: np.asarray(v, np.float32) for n, v in run[k].items()}
    return out


def _child_main(workdir: str, kinds) -> None:
    import jax

    import funcnet
    from funcnet import gpt

    inputs = np.load(Path(workdir) / "jax_inputs.npz")
    params = funcnet.load_state_dict(gpt.GPT(gpt.GPTConfig(**CONFIG)).init(jax.random.key(0)),
                                     {k[2:]: inputs[k] for k in inputs.files if k.startswith("p:")})
    out = jax_pipeline(params, inputs["xs"], inputs["ys"], tuple(kinds))
    for run in out["runs"].values():
        for k in ("grads", "params"):
            run[k] = {n: np.asarray(v).tolist() for n, v in run[k].items()}
    (Path(workdir) / "jax.json").write_text(json.dumps(out))


# ----------------------------------------------------------------------------- both
def run(opts: Options = Options(), *, kinds: tuple = KINDS) -> Result:  # noqa: B008
    """kinds: the schedules to run ("gpipe", "1f1b"); one for a quicker run (the tests)."""
    import jax
    import torch

    import funcnet
    from comparisons._torch_gpt import TorchGPT
    from funcnet import gpt

    if not kinds or set(kinds) - set(KINDS):
        raise ValueError(f"kinds must be some of {KINDS}, got {kinds!r}")
    if opts.dtype != "float32":
        raise ValueError("the pipeline_parallel comparison runs in float32 (gloo and the simulated devices)")
    torch.manual_seed(0)
    sd = {k: v.detach().clone() for k, v in TorchGPT(gpt.GPTConfig(**CONFIG)).state_dict().items()}
    rng = np.random.default_rng(0)
    shape = (STEPS, BATCH, CONFIG["block_size"])
    xs = rng.integers(0, CONFIG["vocab_size"], size=shape).astype(np.int32)
    ys = rng.integers(0, CONFIG["vocab_size"], size=shape).astype(np.int32)
    init = funcnet.load_state_dict(gpt.GPT(gpt.GPTConfig(**CONFIG)).init(jax.random.key(0)),
                                   {k: v.numpy() for k, v in sd.items()})
    init["transformer"]["wte"]["weight"] = init["transformer"]["wte"]["weight"].at[0, 0].add(opts.perturb)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        torch.save(sd, workdir / "init.pt")
        torch.save((torch.from_numpy(xs).long(), torch.from_numpy(ys).long()), workdir / "batches.pt")
        begin = time.perf_counter()
        todo = tuple(kind for kind in kinds if ("torch", kind) not in _REUSED)
        ctx = todo and torch_processes(pipeline_worker, (STAGES, str(workdir / "rendezvous"), str(workdir), todo),
                                       STAGES)
        if jax.device_count() >= STAGES:
            j = jax_pipeline(init, xs, ys, kinds)
        else:
            np.savez(workdir / "jax_inputs.npz", xs=xs, ys=ys,
                     **{"p:" + k: np.asarray(v) for k, v in funcnet.state_dict(init).items()})
            j = _jax_in_child(workdir, kinds)
        j_seconds = time.perf_counter() - begin
        deadline = time.monotonic() + 300
        while ctx and not ctx.join(timeout=10):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError("the torch pipeline processes did not finish within 300 s")
        if todo:
            _REUSED["torch seconds"] = time.perf_counter() - begin
            stages = [torch.load(workdir / f"stage_{r}.pt") for r in range(STAGES)]
            for kind in todo:
                _REUSED[("torch", kind)] = {
                    "losses": stages[-1][kind]["losses"], "orders": [s[kind]["order"] for s in stages],
                    **{k: {n: v.numpy() for s in stages for n, v in s[kind][k].items()} for k in ("grads", "params")}}
    t = {kind: _REUSED[("torch", kind)] for kind in kinds}
    return _result(j, t, kinds, j_seconds, _REUSED["torch seconds"])


def _table_from_orders(orders: list) -> np.ndarray:
    """Each stage's logged order laid out tick by tick by the same rule as ``funcnet.parallel.pipeline.schedule``."""
    from funcnet.parallel import pipeline as pp

    code = {"F": pp.FORWARD, "B": pp.BACKWARD}
    return pp.from_orders("torch", MICROBATCHES, [[(code[a], m) for a, m in o] for o in orders]).table


def _torch_schedule(kind: str) -> str:
    return {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[kind]


def _flat(d: dict, keys) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(d[k], np.float64)) for k in keys])


def _result(j, t, kinds, j_seconds, t_seconds) -> Result:
    from funcnet.parallel import pipeline as pp

    one, P, M = j["runs"]["one device"], STAGES, MICROBATCHES
    keys = sorted(one["params"])
    tokens = BATCH * CONFIG["block_size"]
    eps = float(np.finfo(np.float32).eps)
    # a gradient entry is a sum over the batch's tokens, in other groupings (per microbatch, then over
    # microbatches; torch and XLA in their own orders): its rounding is bounded by tokens x eps x the
    # largest gradient entry
    g_scale = float(np.abs(_flat(one["grads"], keys)).max())
    g_tol = {"rtol": 1e-5, "atol": tokens * eps * g_scale}
    g_why = f"sums over {tokens} tokens regrouped by microbatch: atol = {tokens} x eps32 x max|grad| ({g_scale:.2e})"
    p_tol = {"rtol": 1e-4, "atol": 1e-5}
    p_why = (f"{STEPS} Adam steps: Adam's first steps are lr x sign for near-zero gradients, turning their "
             f"float32 rounding into up to 1% of lr")
    l_why = "the same tokens; the mean taken per microbatch, then over microbatches"
    checks, drawn = [], {}
    for kind in kinds:
        r, tr = j["runs"][kind], t[kind]
        table = np.asarray(r["table"], np.int32)
        ticks = table.shape[0]
        idle = int(np.sum(table[:, :, 0] == pp.IDLE))
        torch_table = _table_from_orders(tr["orders"])
        drawn[kind] = (r["drawn"], pp.Schedule("torch", P, M, torch_table).draw())
        name = {"gpipe": "GPipe", "1f1b": "1F1B"}[kind]
        checks += [
            close(f"{name}: JAX pipeline losses == one device", r["losses"], one["losses"], rtol=1e-6, atol=1e-6,
                  why=l_why),
            close(f"{name}: JAX pipeline first-step gradients == one device (jax.grad)", _flat(r["grads"], keys),
                  _flat(one["grads"], keys), **g_tol, why=g_why),
            close(f"{name}: losses per step: JAX == torch {_torch_schedule(kind)}",
                  r["losses"], tr["losses"], rtol=1e-5, atol=1e-6, why="same weights and batches; float32 rounding"),
            close(f"{name}: first-step gradients: JAX == torch (tied weight all-reduced)", _flat(r["grads"], keys),
                  _flat(tr["grads"], keys), **g_tol, why=g_why),
            close(f"{name}: final params: JAX == torch", _flat(r["params"], keys), _flat(tr["params"], keys),
                  **p_tol, why=p_why),
            equal(f"{name}: torch's logged F/B order per stage, laid out in ticks == the table JAX runs",
                  torch_table.tolist(), table.tolist(), why="the same schedule, slot for slot"),
            expect(f"{name}: bubble (idle slots / all slots of the table) == (P - 1) / (M + P - 1)",
                   Fraction(idle, ticks * P) == Fraction(P - 1, M + P - 1),
                   f"{idle} idle of {ticks} ticks x {P} stages = {idle / (ticks * P):.4f}; "
                   f"(P - 1) / (M + P - 1) = {(P - 1) / (M + P - 1):.4f}"),
        ]
    for kind in kinds:
        held, want = j["runs"][kind]["held"], (M if kind == "gpipe" else min(P, M))
        checks.append(equal(f"{kind}: stage inputs held at once == {'M' if kind == 'gpipe' else 'min(P, M)'}", held,
                            want, why="read off the schedule's table"))
    j_lines = [(f"GPT {CONFIG}, {P} stages x {CONFIG['n_layer'] // P} block(s), {M} microbatches of {BATCH // M}, "
                f"Adam lr {LR}, {STEPS} steps; one shard_map-ed lax.scan over the ticks, ppermute between stages")]
    for kind in kinds:
        r = j["runs"][kind]
        j_lines += [f"# {kind}: losses {', '.join(f'{v:.6f}' for v in r['losses'])}; held {r['held']} stage inputs",
                    drawn[kind][0]]
    j_lines.append(f"one device: losses {', '.join(f'{v:.6f}' for v in one['losses'])}")
    t_lines = [(f"PipelineStage on {P} gloo processes (rank 0: embeddings + blocks, rank 1: blocks + ln_f + "
                f"head); the tied weight's gradient all-reduced before Adam")]
    for kind in kinds:
        losses = ", ".join(f"{v:.6f}" for v in t[kind]["losses"])
        t_lines += [f"# {_torch_schedule(kind)}: losses {losses}; each stage's logged order, in ticks", drawn[kind][1]]
    notes = ("Each tick every stage runs one forward (F) or one backward (B) of a microbatch, or idles (.). The "
             "JAX stages keep their inputs and rerun their blocks in the backward (full recomputation per stage), "
             "so the activations a stage holds are its held inputs (tests/test_pipeline.py reads them off the "
             "compiled temps: GPipe's grow by one stage input per microbatch, 1F1B's not at all); torch keeps "
             "each microbatch's autograd graph instead. Simulated CPU devices share the host's cores: the timings "
             f"are no speed comparison (JAX side {j_seconds:.1f} s, torch processes joined at {t_seconds:.1f} s, "
             "both from the spawn).")
    return Result(
        name="pipeline_parallel", title=TITLE,
        torch=Side(source(pipeline_worker), "\n".join(t_lines), seconds=t_seconds),
        jax=Side(source(jax_pipeline), "\n".join(j_lines), seconds=j_seconds),
        checks=checks, notes=notes,
        series={"loss per step": {**{f"torch {k}": t[k]["losses"] for k in kinds},
                                  **{f"JAX {k}": j["runs"][k]["losses"] for k in (*kinds, "one device")}}},
    )


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2:])
