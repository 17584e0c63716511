"""A GPT trained the nanoGPT way, in torch and in funcnet, from the same weights on the same batches.

torch: nanoGPT's model (``GPT``, ``Block``, ``CausalSelfAttention``, ``MLP``, weight tying,
its init) in torch.nn alone, trained with nanoGPT's optimizer: AdamW with weight decay on
the matrices only, ``clip_grad_norm_`` and a warmup + cosine ``LambdaLR``. funcnet:
``funcnet.gpt.GPT``, the same children under the same names, so torch's ``state_dict``
(both tied keys included) loads with ``funcnet.load_state_dict``; the optimizer is one
optax chain (``funcnet.gpt.configure_optimizers``), the whole run one ``lax.scan`` of
``make_step``'s step. The batches are character blocks of CPython's bundled documentation
(``funcnet.text``). Losses must agree step by step; the tied weight is one array whose
gradient is the sum over its two uses in both frameworks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

import funcnet
from funcnet import gpt, text
from funcnet.gpt import GPTConfig
from comparisons._core import (Options, Result, Side, close, dtypes, equal, expect, one_torch_thread, progress,
                               source, timed)
from comparisons.torch_gpt import MLP, Block, CausalSelfAttention, TorchGPT

__all__ = ["TITLE", "run", "TorchGPT", "torch_optimizer", "CONFIG"]

TITLE = "A GPT (nanoGPT) trained with AdamW + clipping + warmup-cosine: torch vs funcnet, step by step"

CONFIG = GPTConfig(block_size=32, vocab_size=text.vocabulary().size, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
STEPS, BATCH = 120, 8
OPT = dict(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=20, decay_steps=100,
           min_lr=1e-4, grad_clip=1.0)


# ----------------------------------------------------------------------------- torch (nanoGPT)
# the modules: comparisons/torch_gpt.py (torch alone: the parallel comparisons' workers import it without JAX)


def torch_optimizer(model, learning_rate, weight_decay, betas, warmup_steps, decay_steps, min_lr):
    param_dict = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]  # matrices and embeddings
    nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]  # biases and LayerNorm weights
    optimizer = torch.optim.AdamW([{"params": decay_params, "weight_decay": weight_decay},
                                   {"params": nodecay_params, "weight_decay": 0.0}], lr=learning_rate, betas=betas)

    def lr_lambda(step):  # nanoGPT's get_lr(it) / learning_rate
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min((step - warmup_steps) / (decay_steps - warmup_steps), 1.0)
        return (min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (learning_rate - min_lr)) / learning_rate

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def torch_train(model, optimizer, scheduler, batches, grad_clip):
    model.train()
    losses, lrs, norms = [], [], []
    for x, y in batches:
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
    return torch.stack(losses), lrs, torch.stack(norms)


# ------------------------------------------------------------------------------ funcnet
def funcnet_trainer(model, tx):
    step = funcnet.make_step(model, tx)  # loss: funcnet.losses.cross_entropy, classes last

    @jax.jit
    def train(state, xb, yb):  # every step in one compiled lax.scan
        return jax.lax.scan(step.raw, state, (xb, yb))

    return train


def funcnet_train(train, model, params, tx, xb, yb):
    state = funcnet.create_train_state(model, tx, jax.random.key(0), params=params)
    state, metrics = train(state, xb, yb)
    return state, metrics["loss"]


def funcnet_grads(model, params, x, y):
    loss = lambda p: funcnet.losses.cross_entropy(model.apply(p, x), y)  # noqa: E731
    return jax.jit(jax.grad(loss))(params)  # the tied weight: one array, one summed gradient


def torch_greedy(model, idx, max_new_tokens):
    model.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens):  # nanoGPT's generate, argmax instead of multinomial
            idx_cond = idx if idx.size(1) <= model.config.block_size else idx[:, -model.config.block_size:]
            logits = model(idx_cond)[:, -1, :]
            idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
    return idx


# ------------------------------------------------------------------------------ checks
def run(opts: Options = Options(), *, steps: int = STEPS) -> Result:
    """``steps`` AdamW steps (120 by default; fewer keep a test short)."""
    with one_torch_thread():  # tiny ops: extra OpenMP threads only wait on each other
        return _run(opts, steps)


def _run(opts: Options, steps: int) -> Result:
    tdtype, jdtype = dtypes(opts)
    (x_train, y_train), _ = text.load_text(CONFIG.block_size, key=jax.random.key(0))
    xb = x_train[: steps * BATCH].reshape(steps, BATCH, CONFIG.block_size)
    yb = y_train[: steps * BATCH].reshape(steps, BATCH, CONFIG.block_size)

    torch.manual_seed(0)
    net = TorchGPT(CONFIG).to(tdtype)
    model = gpt.GPT(CONFIG, dtype=jdtype)
    sd0 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    params0 = funcnet.load_state_dict(model.init(jax.random.key(0)), sd0)
    # the one JAX-side weight perturb shifts: row 0 of the tied embedding/LM head ("\n")
    params0["transformer"]["wte"]["weight"] = params0["transformer"]["wte"]["weight"].at[0, 0].add(opts.perturb)

    # forward and gradients from the initial weights, on the first batch
    x0, y0 = torch.from_numpy(xb[0]).long(), torch.from_numpy(yb[0]).long()
    logits_t = net(x0)
    F.cross_entropy(logits_t.view(-1, logits_t.size(-1)), y0.view(-1)).backward()
    t_grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}  # the tied weight once
    net.zero_grad(set_to_none=True)
    logits_j = jax.jit(model.apply)(params0, jnp.asarray(xb[0]))
    j_grads = funcnet.state_dict(funcnet_grads(model, params0, jnp.asarray(xb[0]), jnp.asarray(yb[0])))

    opt_args = {k: v for k, v in OPT.items() if k != "grad_clip"}
    optimizer, scheduler = torch_optimizer(net, **opt_args)
    batches = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) for x, y in zip(xb, yb)]
    (t_losses, t_lrs, t_norms), t_sec = timed(torch_train, net, optimizer, scheduler,
                                              progress(batches, "torch: training steps"), OPT["grad_clip"])

    tx = gpt.configure_optimizers(**OPT)
    train = funcnet_trainer(model, tx)
    (state, j_losses), j_sec = timed(funcnet_train, train, model, params0, tx, jnp.asarray(xb), jnp.asarray(yb))
    schedule = gpt.lr_schedule(OPT["learning_rate"], OPT["warmup_steps"], OPT["decay_steps"], OPT["min_lr"])
    j_lrs = np.asarray([schedule(jnp.int32(i)) for i in range(steps)], dtype=np.float64)  # optax's int32 count

    # greedy decoding from funcnet's initial weights copied into torch: 44 > block_size tokens, so
    # both crop the context. (After 120 steps the model's argmax is mostly " ", a weaker test.)
    prompt = text.vocabulary().encode("def ")[None]
    net_copy = TorchGPT(CONFIG).to(tdtype)
    net_copy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in funcnet.state_dict(params0).items()})
    t_greedy = torch_greedy(net_copy, torch.from_numpy(prompt).long(), 40).numpy()
    j_greedy = np.asarray(gpt.generate(model, params0, prompt, 40, key=jax.random.key(0), greedy=True))

    decay_t = sorted(n for n, p in net.named_parameters() if p.dim() >= 2)
    mask = funcnet.state_dict(gpt.decay_mask(params0))
    decay_j = sorted(k for k, v in mask.items() if v and k != "lm_head.weight")  # torch lists the tie once

    if opts.dtype == "float32":
        # Per step the frameworks differ by ~1e-7 relative (summation order in the matmuls, SDPA
        # scaling q and k by hs**-0.25 each where funcnet scales the scores once). AdamW divides
        # each gradient by its running RMS, so such differences in small gradient components
        # become differences of whole updates, and the curves drift apart slowly (measured: one
        # ulp until step ~40, 2.5e-5 at worst over 120 steps on losses of 3-4.6). rtol 1e-5 +
        # atol 1e-4 leaves margin for another BLAS and still fails on a 1e-2 shift of one
        # embedding entry (curves 1e-2 apart).
        curve_tol, param_tol = {"rtol": 1e-5, "atol": 1e-4}, {"rtol": 1e-4, "atol": 1e-4}
        why = f"float32 over {steps} AdamW steps: rounding differences grow with the steps"
        step0 = {"rtol": 1e-5, "atol": 1e-6}
        zero_grad = 1e-7
    else:
        # measured: losses 2e-13 apart after 120 steps, parameters 4e-13
        curve_tol = param_tol = step0 = opts.tol
        why = f"float64 over {steps} AdamW steps: reassociated sums only"
        zero_grad = 1e-15
    t_final = {k: v.detach() for k, v in net.state_dict().items()}
    j_final = funcnet.state_dict(state.params)
    clipped = int((t_norms > OPT["grad_clip"]).sum())
    C = CONFIG.n_embd
    key_bias = [k for k in t_final if k.endswith("attn.c_attn.bias")]  # [q | k | v] biases
    qv = np.r_[0:C, 2 * C:3 * C]
    lr_sum = float(np.sum(t_lrs))

    def final_check(k):
        if k not in key_bias or opts.dtype == "float64":  # float64: the noise (1e-20) is far below eps
            return [close(f"final {k}: funcnet == torch", j_final[k], t_final[k], **param_tol, why=why)]
        return [close(f"final {k}, query and value parts: funcnet == torch", np.asarray(j_final[k])[qv],
                      t_final[k][qv], **param_tol, why=why),
                close(f"final {k}, key part: within the sum of learning rates ({lr_sum:.3f})",
                      np.asarray(j_final[k])[C:2 * C], t_final[k][C:2 * C], rtol=0.0, atol=lr_sum,
                      why="its gradient is rounding noise (below); AdamW normalizes noise into steps of up "
                          "to ~lr, different in each framework, which the loss cannot see")]

    checks = [
        equal("state_dict keys in torch's order, both tied keys included",
              list(funcnet.state_dict(params0, model=model)), list(sd0), why="the same children under the same names"),
        equal("the tie: one array in funcnet's params, as in torch's parameters()",
              len(jax.tree.leaves(params0)), len(list(net.parameters())),
              why="named_parameters lists a shared tensor once; nn.Tied holds no array"),
        close("initial logits (B, T, vocab): funcnet == torch", logits_j, logits_t.detach(), **step0,
              why="same weights, same batch"),
        *[close(f"gradient of {k} at step 0: jax.grad == torch backward", j_grads[k], g, **step0,
                why="the tied weight: the sum over the embedding and the LM head in both" if "wte" in k else "")
          for k, g in t_grads.items()],
        *[close(f"gradient of the key bias {k}[{C}:{2 * C}] is zero in both (rounding noise)",
                np.concatenate([np.asarray(j_grads[k])[C:2 * C], t_grads[k][C:2 * C].numpy()]),
                np.zeros(2 * C), rtol=0.0, atol=zero_grad,
                why="adding b to every key adds q.b to a whole row of scores; softmax ignores that")
          for k in key_bias],
        equal("weight decay on the matrices only: the same parameters decayed", decay_j, decay_t,
              why="nanoGPT's groups: dim >= 2 decays; biases and LayerNorm weights do not"),
        close("learning rate per step: optax warmup_cosine_decay_schedule == LambdaLR", j_lrs, np.asarray(t_lrs),
              rtol=1e-6 if opts.dtype == "float32" else 1e-12, atol=0.0,
              why="the same formula; funcnet evaluates it in the default float dtype"),
        expect("gradient clipping was exercised", 0 < clipped < steps,
               f"torch's clip_grad_norm_ scaled the gradients in {clipped} of {steps} steps (norm > "
               f"{OPT['grad_clip']}); the optax chain clips with torch's formula, max_norm / (norm + 1e-6)"),
        close(f"training loss per step ({steps} steps): funcnet == torch", j_losses, t_losses, **curve_tol, why=why),
        *[c for k in t_final for c in final_check(k)],
        equal("greedy decoding of 40 characters: funcnet generate == torch loop", j_greedy, t_greedy,
              why="the same weights; argmax at each step, context cropped to block_size"),
    ]
    t_np, j_np = t_losses.numpy().astype(np.float64), np.asarray(j_losses, dtype=np.float64)
    shown = [0, 1, steps // 2, steps - 1]
    base = text.unigram_entropy()
    vocab = text.vocabulary()
    t_out = "\n".join([
        f"TorchGPT({CONFIG.n_layer} layers, n_embd {CONFIG.n_embd}, {CONFIG.n_head} heads, block "
        f"{CONFIG.block_size}, vocab {CONFIG.vocab_size}): {sum(p.numel() for p in net.parameters())} params",
        f"AdamW(lr {OPT['learning_rate']}, wd {OPT['weight_decay']} on {len(decay_t)} matrices) + "
        f"clip_grad_norm_({OPT['grad_clip']}) + LambdaLR(warmup {OPT['warmup_steps']}, cosine to "
        f"{OPT['decay_steps']}), {steps} steps of {BATCH} blocks:",
        *[f"  step {s:3d}: loss {t_np[s]:.6f}  lr {t_lrs[s]:.2e}  grad norm {float(t_norms[s]):.3f}" for s in shown],
        f"clipped in {clipped} of {steps} steps; unigram baseline {base:.3f} nats/char",
        f"greedy: {vocab.decode(t_greedy[0])!r}",
    ])
    j_out = "\n".join([
        f"funcnet.gpt.GPT(GPTConfig(...)): {sum(a.size for a in jax.tree.leaves(params0))} params (one tied array)",
        "configure_optimizers(...): optax.chain(clip_grad_norm, adamw(mask=decay_mask, "
        "warmup_cosine_decay_schedule)), one lax.scan:",
        *[f"  step {s:3d}: loss {j_np[s]:.6f}  lr {j_lrs[s]:.2e}" for s in shown],
        f"max |funcnet - torch| over the curve: {np.abs(j_np - t_np).max():.1e}",
        f"greedy: {vocab.decode(j_greedy[0])!r}",
    ])
    notes = ("nanoGPT ties the LM head to the token embedding by assigning one Parameter to both modules; "
             "funcnet's params hold that array once and an nn.Tied marker in lm_head.weight, so jax.grad sums "
             "both uses and optax updates it once, as torch's AdamW sees it once in parameters(). "
             "torch mutates .grad, the parameters and the scheduler's lr in place; funcnet's step is a pure "
             "function and the schedule a function of optax's step count. Dropout is 0 so both sides are "
             "deterministic (their random streams differ).")
    return Result(
        name="gpt", title=TITLE,
        torch=Side(source(CausalSelfAttention, MLP, Block, TorchGPT, torch_optimizer, torch_train, torch_greedy),
                   t_out, t_sec),
        jax=Side(source(gpt.CausalSelfAttention, gpt.MLP, gpt.Block, gpt.GPT, gpt.configure_optimizers,
                        funcnet_trainer, funcnet_train, funcnet_grads), j_out, j_sec),
        checks=checks, notes=notes,
        series={"training loss per step": {"torch": t_np.tolist(), "funcnet": j_np.tolist()}},
    )
