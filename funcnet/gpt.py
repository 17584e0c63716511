"""A decoder-only GPT, nanoGPT-shaped, written with funcnet.nn so that it reads like its torch twin.

torch counterpart: Karpathy's nanoGPT ``model.py`` (``GPT``, ``Block``,
``CausalSelfAttention``, ``MLP``); ``comparisons/gpt.py`` holds that torch code beside this
one and checks that the two train to the same losses from the same weights.

- ``GPT(config)`` is an ``nn.Composite`` with nanoGPT's children, so the params have
  nanoGPT's ``state_dict`` keys (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight``,
  ..., ``lm_head.weight``). ``lm_head.weight`` is *tied* to ``transformer.wte.weight``: one
  array, listed under both keys, whose gradient is the sum over both uses, as in torch.
- ``apply(params, idx)``: idx ``(B, T)`` int, ``T <= block_size`` -> logits ``(B, T, vocab)``
  at every position (nanoGPT returns only the last one when no targets are given); the
  loss is ``funcnet.losses.cross_entropy(logits, targets)``, classes last, so
  ``funcnet.make_step`` / ``fit`` train it unchanged.
- ``generate``: nanoGPT's sampling loop (crop to ``block_size``, temperature, top-k),
  compiled once as a ``lax.fori_loop`` over a fixed-size token buffer; deterministic per key.
- ``configure_optimizers``: nanoGPT's AdamW (weight decay on matrices only) with torch's
  ``clip_grad_norm_`` and a linear-warmup + cosine schedule, as one optax chain.
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from funcnet import init as _init
from funcnet import nn
from funcnet.nn.functional._common import gradient_apart
from funcnet.gpt_optim import clip_grad_norm, configure_optimizers, decay_mask, lr_schedule

_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # GPT(config).apply -> config
__all__ = ["GPTConfig", "GPT", "build", "Block", "CausalSelfAttention", "MLP", "causal_attention", "generate",
           "configure_optimizers", "lr_schedule", "decay_mask", "clip_grad_norm", "num_params", "ACTIVATIONS",
           "REMAT", "remat_policy", "stack_blocks", "scan_blocks", "loss_around_blocks", "measure_activations"]


class GPTConfig(NamedTuple):
    """nanoGPT's ``GPTConfig``: ``block_size`` (longest context), ``vocab_size``, ``n_layer``, ``n_head``,
    ``n_embd`` (``n_embd % n_head == 0``), ``dropout`` (one probability for embeddings, attention weights and
    residual branches), ``bias`` (biases in Linears and LayerNorms), ``qkv_groups`` (how ``c_attn``'s 3C
    outputs are packed: g groups of ``[q, k, v]`` for ``n_head / g`` heads each; 1 is nanoGPT's
    ``[q | k | v]``, g = the tensor-parallel degree puts each device's heads in its contiguous slice, see
    ``funcnet.parallel.tensor.pack_qkv``)."""

    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    qkv_groups: int = 1


def _check_config(config) -> GPTConfig:
    if not isinstance(config, GPTConfig):
        raise TypeError(f"GPT: config must be a GPTConfig(block_size, vocab_size, n_layer, n_head, n_embd, ...), "
                        f"got {type(config).__name__}")
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "qkv_groups"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
    if config.n_embd % config.n_head:
        raise ValueError(f"GPTConfig: n_embd={config.n_embd} must be divisible by n_head={config.n_head} (each "
                         f"head gets n_embd // n_head features); pick n_head among the divisors of {config.n_embd}")
    if config.n_head % config.qkv_groups:
        raise ValueError(f"GPTConfig: qkv_groups={config.qkv_groups} must divide n_head={config.n_head}")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"GPTConfig: dropout is a drop probability in [0, 1), got {config.dropout!r}")
    return config


# The tensors of one block that Korthikanti et al. 2022 count as its activations (section 4.1,
# no dropout), named with jax.ad_checkpoint.checkpoint_name where the block computes them.
# Outside jax.checkpoint a name is the identity; under it, a policy decides which are kept.
ACTIVATIONS = ("ln_1_in", "attn_in", "q", "k", "v", "attn_probs", "attn_out", "ln_2_in", "mlp_in", "gelu_in",
               "gelu_out")
REMAT = ("paper", "selective", "full")


def remat_policy(remat):
    """The ``jax.checkpoint`` policy for ``GPT(..., remat=...)``, one of these.

    - ``"paper"``: keep exactly the paper's list (``ACTIVATIONS``) and recompute the rest
      (LayerNorm's statistics, the GELU's erf terms, the scores before the softmax):
      ``memory.transformer_activations(recompute="none", dropout=False)``, 16 p sbh + p a s^2 b
      per layer;
    - ``"selective"``: the same without the softmax output, which the backward recomputes from
      Q and K (the paper's selective recomputation): ``recompute="selective"``, 16 p sbh;
    - ``"full"``: keep only each block's input and run the block again in the backward:
      ``recompute="full"``, p sbh;
    - a ``jax.checkpoint_policies`` function is used as it is.

    torch: ``torch.utils.checkpoint.checkpoint(block, x)`` is ``"full"``; torch's selective
    activation checkpointing (``create_selective_checkpoint_contexts``) plays the policy's part.
    """
    policies = jax.checkpoint_policies
    if remat == "paper":
        return policies.save_only_these_names(*ACTIVATIONS)
    if remat == "selective":
        return policies.save_only_these_names(*(n for n in ACTIVATIONS if n != "attn_probs"))
    if remat == "full":
        return policies.nothing_saveable
    if callable(remat):
        return remat
    raise ValueError(f"GPT: remat must be None, one of {REMAT} or a jax.checkpoint_policies function, got "
                     f"{remat!r}")


# nanoGPT's _init_weights: N(0, 0.02) for Linear and Embedding weights, zeros for biases.
_normal_02 = functools.partial(_init.normal, std=0.02)


def _linear(n_in, n_out, bias, dtype, std=0.02):
    return nn.Linear(n_in, n_out, bias, weight_init=functools.partial(_init.normal, std=std),
                     bias_init=_init.zeros, dtype=dtype)


def _embedding(n, d, dtype):
    # torch's Embedding starts at N(0, 1); nanoGPT re-initializes it to N(0, 0.02).
    base = nn.Embedding(n, d, dtype=dtype)
    return base._replace(init=lambda key: {"weight": _normal_02(key, (n, d), dtype)})


def causal_attention(q, k, v, dropout=None):
    """softmax(q k^T / sqrt(hs) + causal mask) v, per head: q, k, v ``(B, nh, T, hs)`` -> ``(B, nh, T, hs)``.

    The scores and the softmax are computed in at least float32 (bf16/fp16 inputs give
    float32 scores, as torch's autocast runs softmax in float32); the probabilities are
    cast back to ``v``'s dtype for the second matmul. ``dropout(att)``, if given, is applied
    to the attention probabilities (nanoGPT's ``attn_dropout``).
    torch: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``.
    """
    stat = jnp.promote_types(q.dtype, jnp.float32)
    T = q.shape[-2]
    att = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=stat) * (1.0 / math.sqrt(k.shape[-1]))
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jnp.where(mask, att, -jnp.inf)  # the diagonal is always kept: no row is all -inf
    att = checkpoint_name(jax.nn.softmax(att, axis=-1), "attn_probs")
    if dropout is not None:
        att = dropout(att)
    return jnp.einsum("bhqk,bhkd->bhqd", att.astype(v.dtype), v)


def CausalSelfAttention(config: GPTConfig, *, dtype=jnp.float32) -> nn.Module:
    """nanoGPT's ``CausalSelfAttention``: x ``(B, T, C)`` -> ``(B, T, C)``; children ``c_attn``
    (C -> 3C, q/k/v packed in that order), ``c_proj`` (init std 0.02/sqrt(2 n_layer)),
    ``attn_dropout``, ``resid_dropout``."""
    n_head, n_embd, g = config.n_head, config.n_embd, config.qkv_groups

    def forward(self, x):
        B, T, C = x.shape  # batch, sequence length, embedding dimensionality (n_embd)
        qkv = self.c_attn(checkpoint_name(x, "attn_in")).reshape(B, T, g, 3, C // g)  # g = 1: [q | k | v]
        q, k, v = (qkv[:, :, :, i].reshape(B, T, C) for i in range(3))
        q = checkpoint_name(q.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3), "q")  # (B, nh, T, hs)
        k = checkpoint_name(k.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3), "k")
        v = checkpoint_name(v.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3), "v")
        y = causal_attention(q, k, v, self.attn_dropout)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(checkpoint_name(y, "attn_out")))

    return nn.Composite(
        forward, name=f"CausalSelfAttention(n_embd={n_embd}, n_head={n_head})",
        c_attn=_linear(n_embd, 3 * n_embd, config.bias, dtype),
        c_proj=_linear(n_embd, n_embd, config.bias, dtype, std=0.02 / math.sqrt(2 * config.n_layer)),
        attn_dropout=nn.Dropout(config.dropout), resid_dropout=nn.Dropout(config.dropout))


def MLP(config: GPTConfig, *, dtype=jnp.float32) -> nn.Module:
    """nanoGPT's ``MLP``: ``dropout(c_proj(gelu(c_fc(x))))``, C -> 4C -> C, exact (erf) GELU."""
    n_embd = config.n_embd

    def forward(self, x):
        x = checkpoint_name(self.c_fc(checkpoint_name(x, "mlp_in")), "gelu_in")
        x = checkpoint_name(self.gelu(x), "gelu_out")
        x = self.c_proj(x)
        return self.dropout(x)

    return nn.Composite(
        forward, name=f"MLP(n_embd={n_embd})", c_fc=_linear(n_embd, 4 * n_embd, config.bias, dtype), gelu=nn.GELU(),
        c_proj=_linear(4 * n_embd, n_embd, config.bias, dtype, std=0.02 / math.sqrt(2 * config.n_layer)),
        dropout=nn.Dropout(config.dropout))


def Block(config: GPTConfig, *, dtype=jnp.float32) -> nn.Module:
    """nanoGPT's pre-LN ``Block``: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def forward(self, x):  # gradient_apart: the residual gradient written to memory once a sublayer
        for ln, sublayer, name in ((self.ln_1, self.attn, "ln_1_in"), (self.ln_2, self.mlp, "ln_2_in")):
            x = gradient_apart(x)
            x = x + sublayer(ln(checkpoint_name(x, name)))
        return x

    return nn.Composite(
        forward, name=f"Block(n_embd={config.n_embd}, n_head={config.n_head})",
        ln_1=nn.LayerNorm(config.n_embd, bias=config.bias, dtype=dtype),
        attn=CausalSelfAttention(config, dtype=dtype),
        ln_2=nn.LayerNorm(config.n_embd, bias=config.bias, dtype=dtype),
        mlp=MLP(config, dtype=dtype))


def GPT(config: GPTConfig, *, dtype=jnp.float32, remat=None) -> nn.Module:
    """nanoGPT's ``GPT``: idx ``(B, T)`` int (``T <= block_size``) -> logits ``(B, T, vocab_size)``.

    params (nanoGPT's state_dict keys): ``transformer.{wte, wpe}.weight``,
    ``transformer.h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.*``,
    ``transformer.ln_f.*`` and ``lm_head.weight``, the last tied to ``transformer.wte.weight``.
    Init is nanoGPT's. ``dtype``: the parameters' dtype (float64 for checks against torch).
    Dropout (``config.dropout > 0``) needs ``key`` and ``train=True``, as every funcnet layer.

    ``remat`` (activation checkpointing; see ``remat_policy``): ``None`` runs the blocks in a
    Python loop and keeps whatever XLA keeps; ``"paper"``, ``"selective"``, ``"full"`` or a
    policy run them in one ``lax.scan`` over the blocks' params stacked on the fly (a copy of
    the blocks' params for the step), each step under ``jax.checkpoint(policy=...)``. The
    scan is what makes the policy hold on every backend: in straight-line code XLA:CPU
    schedules the recomputation before the backward, undoing it. Same params, same keys per
    block, same results; torch: ``checkpoint(block, x, use_reentrant=False)`` in the loop.
    """
    config = _check_config(config)
    policy = None if remat is None else remat_policy(remat)

    def run_blocks(self, x):
        # the loop's keys, drawn in its order, so dropout is the same with and without remat
        keys = [self.key_or_none() for _ in range(config.n_layer)]
        keys = None if keys[0] is None else jnp.stack(keys)
        return scan_blocks(config, stack_blocks(self.transformer.h.params), x, remat=policy, keys=keys,
                           train=self.training, dtype=dtype)

    def forward(self, idx):
        if jnp.ndim(idx) != 2 or not jnp.issubdtype(jnp.result_type(idx), jnp.integer):
            raise ValueError(f"GPT: idx must be token ids of shape (B, T) and an integer dtype, got "
                             f"{nn.describe(idx)}; pass idx[None] for one sequence, ids.astype(jnp.int32)")
        b, t = idx.shape
        if t > config.block_size:
            raise ValueError(f"GPT: cannot forward a sequence of length {t}, block size is only "
                             f"{config.block_size}; crop it to idx[:, -{config.block_size}:] (generate does)")
        pos = jnp.arange(0, t, dtype=jnp.int32)  # shape (t)
        tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        if policy is None:
            for block in self.transformer.h:
                x = block(x)
        else:
            x = run_blocks(self, x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # logits at every position (b, t, vocab_size)

    transformer = nn.ModuleDict(dict(
        wte=_embedding(config.vocab_size, config.n_embd, dtype),
        wpe=_embedding(config.block_size, config.n_embd, dtype),
        drop=nn.Dropout(config.dropout),
        h=nn.ModuleList([Block(config, dtype=dtype) for _ in range(config.n_layer)]),
        ln_f=nn.LayerNorm(config.n_embd, bias=config.bias, dtype=dtype),
    ))
    shown = [(k, v) for k, v in config._asdict().items() if k != "qkv_groups" or v != 1]
    remat_name = "" if remat is None else f", remat={remat if isinstance(remat, str) else 'policy'}"
    model = nn.Composite(
        forward, name=f"GPT({', '.join(f'{k}={v}' for k, v in shown)}{remat_name})",
        transformer=transformer, lm_head=_linear(config.n_embd, config.vocab_size, False, dtype),
        tied={"lm_head.weight": "transformer.wte.weight"})
    _MADE[model.apply] = config  # the apply of each model GPT built -> its config (config_of)
    return model


def config_of(model) -> GPTConfig | None:
    """The ``GPTConfig`` of a model ``GPT(config)`` built (known by the identity of its ``apply``,
    not its name or params), else None: what lets a strategy take a GPT-only fast path."""
    try:
        return _MADE.get(getattr(model, "apply", None))
    except TypeError:  # None, or an apply that cannot be weakly referenced, was not built here
        return None


def build(vocab_size: int, block_size: int = 64, *, n_layer: int = 3, n_head: int = 4, n_embd: int = 96,
          dropout: float = 0.0, bias: bool = True, dtype=jnp.float32, remat=None) -> nn.Module:
    """``GPT(GPTConfig(...))`` with the defaults ``examples/gpt_text.py`` trains on 2 CPU cores
    (3 layers, 4 heads, n_embd 96, block 64: 0.35M parameters): what a command line builds."""
    return GPT(GPTConfig(block_size, vocab_size, n_layer, n_head, n_embd, dropout, bias), dtype=dtype, remat=remat)


def num_params(params, non_embedding: bool = True) -> int:
    """nanoGPT's ``get_num_params``: the tied weight counted once; ``non_embedding`` leaves
    out the position embeddings (the token embedding is the LM head and stays in)."""
    n = sum(int(a.size) for a in jax.tree.leaves(params))
    return n - int(params["transformer"]["wpe"]["weight"].size) if non_embedding else n


def stack_blocks(h) -> dict:
    """The blocks' params ``{"0": p0, "1": p1, ...}`` (``params["transformer"]["h"]``) as one
    tree whose leaves have the layer as their first axis, the form ``lax.scan`` runs over."""
    return jax.tree.map(lambda *a: jnp.stack(a), *[h[str(i)] for i in range(len(h))])


def scan_blocks(config: GPTConfig, stacked, x, *, remat=None, keys=None, train: bool = False, dtype=jnp.float32):
    """``x`` through the blocks whose params are ``stacked`` (``stack_blocks``), as one ``lax.scan``
    whose body is ``jax.checkpoint(block, policy=remat_policy(remat))`` (no checkpoint when
    ``remat`` is None). ``keys``: one PRNG key per block, stacked, for dropout."""
    block = Block(config, dtype=dtype)
    # The backward's recomputation draws the same dropout masks again from the same keys, on
    # purpose; the scan carries the keys' raw bits so jax_debug_key_reuse does not flag it.
    impl = None if keys is None else jax.random.key_impl(keys)
    bits = None if keys is None else jax.random.key_data(keys)

    def body(x, params_bits):
        params, b = params_bits
        key = None if b is None else jax.random.wrap_key_data(b, impl=impl)
        return block.apply(params, x, key=key, train=train), None

    if remat is not None:
        body = jax.checkpoint(body, policy=remat_policy(remat))
    return jax.lax.scan(body, x, (stacked, bits))[0]


def loss_around_blocks(config: GPTConfig, run_blocks, *, dtype=jnp.float32):
    """``loss(params, blocks, idx, targets)``: the GPT's cross entropy with its blocks run by
    ``run_blocks(blocks, x)`` instead of its own loop; the embeddings, final LayerNorm and tied
    head read ``params`` (its ``transformer.h`` entry is not read, so it may be left out).
    For measuring or rearranging the blocks alone (stacked for a scan, each under remat)."""
    from funcnet import losses

    top = dict(dict(GPT(config, dtype=dtype).children)["transformer"].children)

    def loss(params, blocks, idx, targets):
        t = params["transformer"]
        x = top["wte"].apply(t["wte"], idx) + top["wpe"].apply(t["wpe"], jnp.arange(idx.shape[1]))
        x = run_blocks(blocks, x)
        logits = top["ln_f"].apply(t["ln_f"], x) @ t["wte"]["weight"].T  # the tied LM head
        return losses.cross_entropy(logits, targets)

    return loss


def measure_activations(config: GPTConfig, batch: int, remat=None, *, layers=(2, 4), dtype=jnp.float32) -> dict:
    """What XLA keeps per block for the backward, measured: the temps of the compiled ``value_and_grad``
    of the GPT's loss, the blocks' params stacked as ``scan_blocks`` runs them, at ``config.block_size``
    tokens x ``batch`` for two depths; the bytes per block are the slope between them (what does not
    grow with depth cancels). Returns ``{"per_layer": bytes, "temps": {depth: bytes}}``; nothing runs.
    Compare ``memory.transformer_activations(1, ..., recompute=R)``: ``remat="paper"`` with R ``"none"``,
    ``"selective"`` and ``"full"`` with the same R."""
    from funcnet import memory

    lo, hi = layers
    if not (isinstance(lo, int) and isinstance(hi, int) and 2 <= lo < hi):
        raise ValueError(f"measure_activations: layers must be two depths 2 <= L1 < L2, got {layers!r} (XLA "
                         f"inlines a scan of one block as straight-line code, where it undoes the recomputation)")
    temps = {}
    for n_layer in (lo, hi):
        cfg = config._replace(n_layer=n_layer)
        params = jax.eval_shape(GPT(cfg, dtype=dtype).init, jax.random.key(0))
        top = params["transformer"]
        rest = {**params, "transformer": {k: v for k, v in top.items() if k != "h"}}
        loss = loss_around_blocks(cfg, functools.partial(scan_blocks, cfg, remat=remat, dtype=dtype), dtype=dtype)
        idx = jax.ShapeDtypeStruct((batch, config.block_size), jnp.int32)
        temps[n_layer] = memory.measure(jax.value_and_grad(loss, argnums=(0, 1)), rest,
                                        jax.eval_shape(stack_blocks, top["h"]), idx, idx).temps
    return {"per_layer": (temps[hi] - temps[lo]) / (hi - lo), "temps": temps}


# ------------------------------------------------------------------------------ sampling
def generate(model: nn.Module, params, idx, max_new_tokens: int, *, key, temperature: float = 1.0,
             top_k: int | None = None, greedy: bool = False, block_size: int | None = None):
    """nanoGPT's ``generate``: append ``max_new_tokens`` tokens to ``idx`` ``(B, T0)`` -> ``(B, T0 + max_new_tokens)``.

    Each new token comes from the logits at the last position of the context cropped to the
    last ``block_size`` tokens (positions restart at 0 in the crop, as nanoGPT's
    ``idx[:, -block_size:]``), divided by ``temperature``, restricted to the ``top_k``
    largest, sampled (``jax.random.categorical``, torch's ``multinomial`` of the softmax)
    with ``fold_in(key, i)`` at step i, or ``argmax`` when ``greedy``. The loop is one
    ``lax.fori_loop`` over a fixed buffer, compiled once per (model, shapes,
    ``max_new_tokens``, ``top_k``, ``greedy``); ``key`` and ``temperature`` change nothing
    that needs a recompile. Dropout is off (``train=False``).

    ``block_size`` defaults to the number of rows of the position embedding.
    """
    idx = jnp.asarray(idx)
    if idx.ndim != 2 or not jnp.issubdtype(idx.dtype, jnp.integer):
        raise ValueError(f"generate: idx must be token ids of shape (B, T) with an integer dtype, got "
                         f"{nn.describe(idx)}")
    if idx.shape[1] == 0:
        raise ValueError("generate: idx has no tokens (shape (B, 0)); start from at least one token, e.g. "
                         "the id of '\\n' as nanoGPT's sample.py does")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"generate: top_k must be None or a positive int, got {top_k!r}")
    tiny = float(jnp.finfo(jnp.float32).tiny)  # below float32's smallest normal the divided logits overflow
    if not greedy and not tiny <= float(temperature) < float("inf"):
        raise ValueError(f"generate: temperature must be a finite float32 of at least {tiny:.4g} (its smallest normal "
                         f"number), got {temperature!r}; for argmax decoding (temperature -> 0) pass greedy=True")
    from funcnet.step import _check_key

    if key is None and greedy:
        key = jax.random.key(0)  # argmax draws nothing
    _check_key(key, "generate")
    try:
        n_pos, vocab = (int(params["transformer"][k]["weight"].shape[0]) for k in ("wpe", "wte"))
    except (KeyError, TypeError, AttributeError):
        if block_size is None:
            raise ValueError("generate: params must be a GPT's (model.init(key) of gpt.GPT), with "
                             "transformer.wpe.weight and transformer.wte.weight; for a model without a position "
                             "embedding (an LSTM LM) pass block_size=, the context it sees") from None
        # a model without a position embedding: any context length, the vocabulary from its logits
        n_pos = block_size
        vocab = int(jax.eval_shape(lambda p, i: model.apply(p, i), params, idx[:, :1]).shape[-1])
    block_size = n_pos if block_size is None else block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 0 < block_size <= n_pos:
        raise ValueError(f"generate: block_size must be an int in [1, {n_pos}] (the model's {n_pos} positions), "
                         f"got {block_size!r}; leave it out to use all {n_pos}")
    if not isinstance(idx, jax.core.Tracer) and idx.size:
        low, high = int(jnp.min(idx)), int(jnp.max(idx))
        if low < 0 or high >= vocab:
            raise ValueError(f"generate: idx holds token ids in [{low}, {high}], outside the vocabulary of {vocab} "
                             f"(ids 0..{vocab - 1}); encode the prompt with the model's own vocabulary")
    return _generate(model, params, idx, key, jnp.asarray(temperature, jnp.float32),
                     max_new_tokens=max_new_tokens, block_size=block_size, top_k=top_k, greedy=bool(greedy))


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "block_size", "top_k", "greedy"))
def _generate(model, params, idx, key, temperature, *, max_new_tokens, block_size, top_k, greedy):
    B, T0 = idx.shape
    total = T0 + max_new_tokens
    W = min(block_size, total)  # the window the model sees; fixed size, so one compile
    buf = jnp.zeros((B, total), idx.dtype).at[:, :T0].set(idx)

    def body(i, buf):
        length = T0 + i  # tokens so far
        start = jnp.maximum(length - W, 0)
        window = jax.lax.dynamic_slice(buf, (0, start), (B, W))
        # causal attention: the logits at length-1 do not see the unwritten slots after it
        logits = model.apply(params, window)
        logits = jax.lax.dynamic_index_in_dim(logits, length - 1 - start, axis=1, keepdims=False)  # (B, V)
        if greedy:
            nxt = jnp.argmax(logits, axis=-1)
        else:
            # shifted first, so the largest is 0 and a tiny temperature sends the others to -inf, never inf - inf
            logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature.astype(logits.dtype)
            if top_k is not None:
                v = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0]
                logits = jnp.where(logits < v[:, -1:], -jnp.inf, logits)
            nxt = jax.random.categorical(jax.random.fold_in(key, i), logits, axis=-1)
        return jax.lax.dynamic_update_slice(buf, nxt[:, None].astype(buf.dtype), (0, length))

    return jax.lax.fori_loop(0, max_new_tokens, body, buf)
