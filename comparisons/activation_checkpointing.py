"""Activation checkpointing: torch.utils.checkpoint over the GPT's blocks against jax.checkpoint (remat).

A block under checkpointing keeps only its input for the backward and runs its forward
again when the backward reaches it: Korthikanti et al.'s "full recomputation", ``p sbh``
bytes per layer instead of ``sbh (16p + ...)``. torch: ``checkpoint(block, x,
use_reentrant=False)`` in nanoGPT's forward; the bytes autograd saves are counted with
``torch.autograd.graph.saved_tensors_hooks`` (unique storages, parameters left out). JAX:
``jax.checkpoint(block, policy=...)`` as the body of a ``lax.scan`` over the stacked
blocks; the memory is XLA's analysis of the compiled gradient function (temps).

Why a scan: XLA:CPU schedules straight-line code without regard to remat, so the
recomputed forward of each block, which depends only on saved values, is run before
the backward starts and the memory comes back (measured below: "remat in a Python loop").
Inside a scan's backward loop the recomputation can only run when its iteration comes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import funcnet
from comparisons._core import Options, Result, Side, close, dtypes, expect, source, timed
from comparisons.gpt import TorchGPT
from funcnet import gpt, losses, memory

__all__ = ["TITLE", "run", "scan_loss", "torch_loss", "CONFIG", "BATCH"]

TITLE = "Activation checkpointing: torch.utils.checkpoint vs jax.checkpoint over the GPT blocks (gradients, memory)"

CONFIG = gpt.GPTConfig(block_size=64, vocab_size=64, n_layer=4, n_head=4, n_embd=64, dropout=0.0)
BATCH = 8


# ----------------------------------------------------------------------------- torch
def torch_loss(model, idx, targets, use_checkpoint):
    b, t = idx.size()
    pos = torch.arange(0, t, dtype=torch.long)
    x = model.transformer.drop(model.transformer.wte(idx) + model.transformer.wpe(pos))
    for block in model.transformer.h:
        # checkpoint: keep x only, run block(x) again during backward
        x = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
    logits = model.lm_head(model.transformer.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def saved_bytes(model, fn):
    """Bytes of the tensors autograd saves for the backward while ``fn()`` runs: unique
    storages, parameters and integer tensors (indices) left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if t.is_floating_point() and storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved.values())


# ----------------------------------------------------------------------------- JAX
def gpt_loss(config, run_blocks):
    """loss(params, idx, targets) of ``funcnet.gpt.GPT`` with its blocks run by
    ``run_blocks(block, [params of each block], x)``. Same params tree as the GPT, so
    ``jax.grad`` gives the GPT's grads."""
    top = dict(dict(gpt.GPT(config).children)["transformer"].children)
    block = gpt.Block(config)

    def loss(params, idx, targets):
        t = params["transformer"]
        x = top["wte"].apply(t["wte"], idx) + top["wpe"].apply(t["wpe"], jnp.arange(idx.shape[1]))
        x = run_blocks(block, [t["h"][str(i)] for i in range(config.n_layer)], x)
        logits = top["ln_f"].apply(t["ln_f"], x) @ t["wte"]["weight"].T  # the tied LM head
        return losses.cross_entropy(logits, targets)

    return loss


def scan_loss(config, policy=None, remat=True):
    """The GPT's blocks stacked and run by ``lax.scan``, each step under
    ``jax.checkpoint(policy=policy)`` when ``remat``."""
    def run_blocks(block, layers, x):
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *layers)
        body = lambda x, p: (block.apply(p, x), None)  # noqa: E731
        if remat:
            body = jax.checkpoint(body, policy=policy)  # keep what policy saves, recompute the rest
        return jax.lax.scan(body, x, stacked)[0]

    return gpt_loss(config, run_blocks)


def loop_remat_loss(config, policy=None):
    """The GPT's own Python loop over blocks, each under jax.checkpoint (no scan)."""
    def run_blocks(block, layers, x):
        run = jax.checkpoint(lambda p, x: block.apply(p, x), policy=policy)
        for p in layers:
            x = run(p, x)
        return x

    return gpt_loss(config, run_blocks)


# ----------------------------------------------------------------------------- both
def run(opts: Options = Options(), *, config: gpt.GPTConfig = CONFIG, batch: int = BATCH) -> Result:
    """config/batch: a smaller GPT for a quicker run (the tests)."""
    CONFIG, BATCH = config, batch  # noqa: N806 (the module's names, rebound for this run)
    tdtype, jdtype = dtypes(opts)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    tgt = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    torch.manual_seed(0)
    net = TorchGPT(CONFIG).to(tdtype)
    model = gpt.GPT(CONFIG, dtype=jdtype)
    params = funcnet.load_state_dict(model.init(jax.random.key(0)),
                                     {k: v.detach().numpy() for k, v in net.state_dict().items()})
    params["transformer"]["wte"]["weight"] = params["transformer"]["wte"]["weight"].at[0, 0].add(opts.perturb)
    x_t, y_t = torch.from_numpy(idx).long(), torch.from_numpy(tgt).long()
    x_j, y_j = jnp.asarray(idx, jnp.int32), jnp.asarray(tgt, jnp.int32)

    def torch_side():
        out = {}
        for ckpt in (False, True):
            net.zero_grad(set_to_none=True)
            loss, nbytes = saved_bytes(net, lambda: torch_loss(net, x_t, y_t, ckpt))
            loss.backward()
            out[ckpt] = (loss.item(), nbytes, {n: p.grad.detach().clone() for n, p in net.named_parameters()})
        return out

    policies = {"scan, no remat": (None, False),
                "scan + remat, nothing_saveable": (jax.checkpoint_policies.nothing_saveable, True),
                "scan + remat, dots_saveable": (jax.checkpoint_policies.dots_saveable, True)}

    def jax_side():
        out = {}
        for name, (policy, remat) in policies.items():
            grad = jax.jit(jax.value_and_grad(scan_loss(CONFIG, policy, remat)))
            (loss, g) = grad(params, x_j, y_j)
            out[name] = (float(loss), funcnet.state_dict(g), memory.measure(grad, params, x_j, y_j))
        plain = jax.jit(jax.value_and_grad(lambda p, x, y: losses.cross_entropy(model.apply(p, x), y)))
        out["GPT.apply, no remat"] = (None, None, memory.measure(plain, params, x_j, y_j))
        loop = jax.jit(jax.value_and_grad(loop_remat_loss(CONFIG, jax.checkpoint_policies.nothing_saveable)))
        out["remat in a Python loop"] = (None, None, memory.measure(loop, params, x_j, y_j))
        return out

    t, t_sec = timed(torch_side)
    j, j_sec = timed(jax_side)
    L, h, a, s, b, V = CONFIG.n_layer, CONFIG.n_embd, CONFIG.n_head, CONFIG.block_size, BATCH, CONFIG.vocab_size
    p = jnp.dtype(jdtype).itemsize
    est = {r: memory.transformer_activations(L, h, a, s, b, vocab=V, bytes_per_value=p, recompute=r, dropout=False,
                                             flash=True, logits_bytes=p) for r in ("none", "full")}
    t_none, t_full = t[False][1], t[True][1]
    j_none = j["scan, no remat"][2].temps
    j_full = j["scan + remat, nothing_saveable"][2].temps
    sbh = s * b * h * p
    tol = {"rtol": 1e-4, "atol": 2e-6} if opts.dtype == "float32" else {"rtol": 1e-9, "atol": 1e-12}
    why = "same weights and batch; recomputation repeats the same float operations"
    g_remat = j["scan + remat, nothing_saveable"][1]
    checks = [
        close("loss: JAX remat == torch checkpoint", j["scan + remat, nothing_saveable"][0], t[True][0], **tol),
        *[close(f"gradient of {k}: jax.checkpoint == torch.utils.checkpoint", g_remat[k], g, **tol, why=why)
          for k, g in t[True][2].items()],
        close("JAX: remat gradients == no-remat gradients (all params)", _flat(g_remat),
              _flat(j["scan, no remat"][1]), rtol=1e-6, atol=1e-9 if opts.dtype == "float32" else 1e-14,
              why="remat changes what is stored, not what is computed"),
        close("torch: checkpoint gradients == plain gradients", _flat({k: v.numpy() for k, v in t[True][2].items()}),
              _flat({k: v.numpy() for k, v in t[False][2].items()}), rtol=0, atol=0,
              why="the recomputed forward is bit-identical on CPU"),
        expect("torch saved bytes, no checkpoint, vs the estimate (flash: SDPA keeps no s x s)",
               abs(t_none / est["none"] - 1) <= 0.10,
               f"saved {t_none:,} vs estimate {est['none']:,} ({t_none / est['none'] - 1:+.1%}): torch also keeps "
               f"SDPA's output beside its contiguous copy (+1 sbh per layer) and LayerNorm's mean and rstd"),
        expect("torch saved bytes with checkpoint: the block inputs (recompute='full')",
               abs(t_full / est["full"] - 1) <= 0.10,
               f"saved {t_full:,} vs estimate {est['full']:,} ({t_full / est['full'] - 1:+.1%})"),
        expect("torch: checkpoint saved what the estimate says it saves",
               abs((t_none - t_full) / (est["none"] - est["full"]) - 1) <= 0.10,
               f"saved less by {t_none - t_full:,} bytes; estimate none - full = {est['none'] - est['full']:,}"),
        expect("XLA: remat (nothing_saveable) in a scan frees at least the estimate's none - full",
               j_none - j_full >= 0.9 * (est["none"] - est["full"]),
               f"temps {j_none:,} -> {j_full:,} bytes (saved {j_none - j_full:,}); estimate none - full "
               f"{est['none'] - est['full']:,}: XLA without remat keeps more than the paper's list (erf's pieces of "
               f"GELU, the scores and the probabilities, LayerNorm's centred input), so remat frees more"),
        expect("XLA:CPU: remat in a Python loop of blocks frees (almost) nothing",
               j["remat in a Python loop"][2].temps >= 0.9 * j["GPT.apply, no remat"][2].temps,
               f"temps {j['GPT.apply, no remat'][2].temps:,} (GPT.apply) vs {j['remat in a Python loop'][2].temps:,} "
               f"(each block under jax.checkpoint, no scan): the recomputation is scheduled before the backward"),
    ]
    rows = [f"{name:32s} temps {m.temps:>12,}  ({m.temps / sbh:6.1f} sbh)" for name, (_, _, m) in j.items()]
    j_out = "\n".join(["XLA memory analysis of the compiled value_and_grad (temps = what the program holds "
                       "besides params, inputs and outputs):", *rows,
                       f"estimate (Korthikanti, {p}-byte values, no dropout, no s x s kept): none {est['none']:,}, "
                       f"full {est['full']:,}"])
    t_out = (f"saved tensors (saved_tensors_hooks, unique storages, no parameters):\n"
             f"  plain blocks      {t_none:>12,} bytes ({t_none / sbh:.1f} sbh)\n"
             f"  checkpoint(block) {t_full:>12,} bytes ({t_full / sbh:.1f} sbh)\n"
             f"loss {t[True][0]:.6f} (both)")
    notes = ("Without a scan (the GPT's own loop with each block under jax.checkpoint) XLA:CPU computes every "
             "block's recomputation before the backward starts, so nothing is saved (row 'remat in a Python "
             "loop'); GPU/TPU schedulers that track memory can keep the straight-line form. The policy decides "
             "what a block keeps: nothing_saveable only its input (full recomputation), dots_saveable the matmul "
             "outputs (closer to the paper's selective recomputation).")
    return Result(name="activation_checkpointing", title=TITLE,
                  torch=Side(source(torch_loss, saved_bytes), t_out, t_sec),
                  jax=Side(source(gpt_loss, scan_loss), j_out, j_sec), checks=checks, notes=notes)


def _flat(tree: dict) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(tree[k], np.float64)) for k in sorted(tree)])
