"""Activation checkpointing: torch.utils.checkpoint over the GPT's blocks against jax.checkpoint (remat).

A block under checkpointing keeps only its input for the backward and runs its forward
again when the backward reaches it: Korthikanti et al.'s "full recomputation", ``p sbh``
bytes per layer instead of ``sbh (16p + ...)``. torch: ``checkpoint(block, x,
use_reentrant=False)`` in nanoGPT's forward; the bytes autograd saves are counted with
``torch.autograd.graph.saved_tensors_hooks`` (unique storages, parameters left out). JAX:
``funcnet.gpt.GPT(config, remat=...)`` runs ``jax.checkpoint(block, policy=...)`` as the body
of a ``lax.scan`` over the stacked blocks; the memory is XLA's analysis of the compiled
gradient function (temps), and per layer ``gpt.measure_activations`` (the slope of the
temps over depth) against the paper's count for each policy: ``"paper"`` keeps exactly the
paper's tensors, ``"selective"`` recomputes the attention core, ``"full"`` keeps the input.

Why a scan: XLA:CPU schedules straight-line code without regard to remat, so the
recomputed forward of each block, which depends only on saved values, is run before
the backward starts and the memory comes back (measured below: "remat in a Python loop").
Inside a scan's backward loop the recomputation can only run when its iteration comes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import funcnet
from comparisons._core import Options, Result, Side, close, dtypes, expect, side_by_side, source, timed
from comparisons.gpt import TorchGPT
from funcnet import gpt, losses, memory

__all__ = ["TITLE", "run", "loop_remat_loss", "torch_loss", "CONFIG", "BATCH"]

TITLE = "Activation checkpointing: torch.utils.checkpoint vs jax.checkpoint over the GPT blocks (gradients, memory)"

CONFIG = gpt.GPTConfig(block_size=64, vocab_size=64, n_layer=4, n_head=4, n_embd=64, dropout=0.0)
BATCH = 8
# What a second run in the same process need not redo, since Options.perturb moves only the JAX side's
# initial weights: the compiled programs (the weights are their arguments) and the memory measured of
# programs that are only compiled. The tests run a perturbed run after the passing one for the price
# of its gradient calls.
_REUSED: dict = {}


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
    block = gpt.Block(config)
    around = gpt.loss_around_blocks(config, lambda layers, x: run_blocks(block, layers, x))

    def loss(params, idx, targets):
        return around(params, [params["transformer"]["h"][str(i)] for i in range(config.n_layer)], idx, targets)

    return loss


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

    remats = (None, "paper", "selective", "full")

    def jax_side():
        def reused(key, make):
            key = (key, CONFIG, BATCH, jnp.dtype(jdtype).name)
            if key not in _REUSED:
                _REUSED[key] = make()
            return _REUSED[key]

        def remat_grad(remat):
            def make():
                net_j = gpt.GPT(CONFIG, dtype=jdtype, remat=remat)
                grad = jax.jit(jax.value_and_grad(lambda p, x, y: losses.cross_entropy(net_j.apply(p, x), y)))
                return memory.compile_to_read(grad.lower(params, x_j, y_j))  # measured, and run once: one compile

            compiled = reused(("grad", remat), make)
            (loss, g) = compiled(params, x_j, y_j)
            return float(loss), funcnet.state_dict(g), memory.measure(compiled)

        def loop_memory():  # measured only
            def make():
                loop = jax.jit(jax.value_and_grad(loop_remat_loss(CONFIG, jax.checkpoint_policies.nothing_saveable)))
                return memory.measure(loop, params, x_j, y_j)

            return None, None, reused("loop", make)

        def per_layer_bytes(remat):  # the slope of XLA's temps from 2 to 4 blocks, the blocks' params stacked
            return reused(("per layer", remat),
                          lambda: gpt.measure_activations(CONFIG, BATCH, remat, dtype=jdtype)["per_layer"])

        jobs = {**{f"GPT(remat={r!r})": functools.partial(remat_grad, r) for r in remats},
                "remat in a Python loop": loop_memory,
                **{("per layer", r): functools.partial(per_layer_bytes, r) for r in remats}}
        done = side_by_side(jobs, "JAX: compiling each remat policy's programs")  # nine independent programs
        out = {k: v for k, v in done.items() if not isinstance(k, tuple)}
        per_layer = {r: done[("per layer", r)] for r in remats}
        return out, per_layer

    t, t_sec = timed(torch_side)
    # steady=False: every call of jax_side builds and compiles its programs anew, so a second
    # call would pay the whole compile again to time a steady state that is not this side's point
    (j, per_layer), j_sec = timed(jax_side, steady=False)
    L, h, a, s, b, V = CONFIG.n_layer, CONFIG.n_embd, CONFIG.n_head, CONFIG.block_size, BATCH, CONFIG.vocab_size
    p = jnp.dtype(jdtype).itemsize
    est = {r: memory.transformer_activations(L, h, a, s, b, vocab=V, bytes_per_value=p, recompute=r, dropout=False,
                                             flash=True, logits_bytes=p) for r in ("none", "full")}
    t_none, t_full = t[False][1], t[True][1]
    j_none = j["GPT(remat=None)"][2].temps
    j_full = j["GPT(remat='full')"][2].temps
    paper = {r: memory.transformer_activations(1, h, a, s, b, bytes_per_value=p, recompute=rc, dropout=False)
             for r, rc in (("paper", "none"), ("selective", "selective"), ("full", "full"))}
    sbh = s * b * h * p
    tol = {"rtol": 1e-4, "atol": 2e-6} if opts.dtype == "float32" else {"rtol": 1e-9, "atol": 1e-12}
    why = "same weights and batch; recomputation repeats the same float operations"
    g_remat = j["GPT(remat='full')"][1]
    checks = [
        close("loss: JAX remat == torch checkpoint", j["GPT(remat='full')"][0], t[True][0], **tol),
        *[close(f"gradient of {k}: jax.checkpoint == torch.utils.checkpoint", g_remat[k], g, **tol, why=why)
          for k, g in t[True][2].items()],
        *[close(f"JAX: GPT(remat={r!r}) gradients == GPT() gradients (all params)",
                _flat(j[f"GPT(remat={r!r})"][1]), _flat(j["GPT(remat=None)"][1]), rtol=1e-5,
                atol=1e-7 if opts.dtype == "float32" else 1e-14,
                why="remat changes what is stored, not what is computed; the scan's body compiles apart from "
                    "the loop's straight-line code, so float32 roundings differ by an ulp or so")
          for r in ("paper", "selective", "full")],
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
        *[expect(f"XLA per layer, GPT(remat={r!r}) vs the paper's recompute={rc!r}",
                 abs(per_layer[r] / paper[r] - 1) <= 0.10,
                 f"{per_layer[r]:,.0f} vs {paper[r]:,} bytes per layer ({per_layer[r] / paper[r] - 1:+.1%}; slope of "
                 f"XLA's temps from 2 to 4 blocks): the scan hands the backward exactly the tensors the policy names")
          for r, rc in (("paper", "none"), ("selective", "selective"), ("full", "full"))],
        expect("XLA per layer: remat='full' frees at least the paper's none - full",
               per_layer[None] - per_layer["full"] >= 0.9 * (paper["paper"] - paper["full"]),
               f"{per_layer[None]:,.0f} -> {per_layer['full']:,.0f} bytes per layer (freed "
               f"{per_layer[None] - per_layer['full']:,.0f}); paper none - full {paper['paper'] - paper['full']:,}: "
               f"without remat JAX keeps more than the paper's list (GELU's erfc and exp, the scores beside the "
               f"probabilities, LayerNorm's centred input), so remat frees more. Whole step: temps {j_none:,} -> "
               f"{j_full:,} (GPT(remat='full') also holds its stacked copy of the blocks' params)"),
        expect("XLA:CPU: remat in a Python loop of blocks frees (almost) nothing",
               j["remat in a Python loop"][2].temps >= 0.9 * j["GPT(remat=None)"][2].temps,
               f"temps {j['GPT(remat=None)'][2].temps:,} (GPT.apply) vs {j['remat in a Python loop'][2].temps:,} "
               f"(each block under jax.checkpoint, no scan): the recomputation is scheduled before the backward"),
    ]
    rows = [f"{name:32s} temps {m.temps:>12,}  ({m.temps / sbh:6.1f} sbh)" for name, (_, _, m) in j.items()]
    layer_rows = [f"{'remat=' + repr(r):22s} {v:>12,.0f}  paper {paper.get(r or 'paper'):>12,}  "
                  f"x{v / paper.get(r or 'paper'):.3f}" for r, v in per_layer.items()]
    j_out = "\n".join(["XLA memory analysis of the compiled value_and_grad (temps = what the program holds "
                       "besides params, inputs and outputs):", *rows,
                       "bytes per layer (slope of the temps from 2 to 4 blocks, blocks' params passed stacked):",
                       *layer_rows,
                       f"estimate (Korthikanti, {p}-byte values, no dropout, no s x s kept): none {est['none']:,}, "
                       f"full {est['full']:,}"])
    t_out = (f"saved tensors (saved_tensors_hooks, unique storages, no parameters):\n"
             f"  plain blocks      {t_none:>12,} bytes ({t_none / sbh:.1f} sbh)\n"
             f"  checkpoint(block) {t_full:>12,} bytes ({t_full / sbh:.1f} sbh)\n"
             f"loss {t[True][0]:.6f} (both)")
    notes = ("Without a scan (the GPT's own loop with each block under jax.checkpoint) XLA:CPU computes every "
             "block's recomputation before the backward starts, so nothing is saved (row 'remat in a Python "
             "loop'); GPU/TPU schedulers that track memory can keep the straight-line form. The policy decides "
             "what a block keeps: 'paper' the tensors Korthikanti et al. count (named with checkpoint_name in "
             "funcnet.gpt), 'selective' those without the softmax output, 'full' only the block's input. With no "
             "remat JAX's autodiff keeps more than the paper (GELU's erfc and exp, the masked scores and exp "
             "beside the probabilities, LayerNorm's centred and scaled input): about 1.9x per layer. GPT(remat=...) "
             "stacks the blocks' params for its scan on every call, a copy that shows in its temps above.")
    return Result(name="activation_checkpointing", title=TITLE,
                  torch=Side(source(torch_loss, saved_bytes), t_out, t_sec),
                  jax=Side(source(gpt.remat_policy, gpt.scan_blocks), j_out, j_sec), checks=checks, notes=notes)


def _flat(tree: dict) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(tree[k], np.float64)) for k in sorted(tree)])
