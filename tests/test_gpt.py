"""funcnet.gpt against nanoGPT in torch (comparisons/gpt.py's TorchGPT), closed forms and jax.grad.

Tiny configurations (1 layer, n_embd 16, 2 heads, block 8, vocab 11; one row with 2 layers)
keep compilation, most of each test's time, short.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import funcnet
from comparisons.gpt import TorchGPT, torch_greedy
from funcnet import gpt
from funcnet.gpt import GPT, GPTConfig
from tests.torch_oracle import check_layer

CFG = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16)


def _idx(shape=(3, 8), vocab=CFG.vocab_size, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def _pair(cfg=CFG, dtype=jnp.float32, seed=0):
    torch.manual_seed(seed)
    theirs = TorchGPT(cfg).to(torch.float64 if dtype == jnp.float64 else torch.float32)
    ours = GPT(cfg, dtype=dtype)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    return ours, theirs, params


# ------------------------------------------------------------------ forward, backward, state_dict
@pytest.mark.parametrize("cfg", [CFG._replace(n_layer=2), CFG._replace(bias=False, n_head=4)], ids=["bias", "no-bias"])
@pytest.mark.parametrize("train", [False, True])
def test_forward_and_gradients_equal_torch_float32(cfg, train):
    torch.manual_seed(0)
    # check_layer: state_dict keys/order/shapes, logits, gradients of every parameter (the tied one
    # included: torch lists it once), one compile, within check_layer's bound from the size of the terms
    check_layer(GPT(cfg), TorchGPT(cfg), [_idx()], train=train, dtype="float32")


def test_forward_and_gradients_equal_torch_float64():
    with jax.enable_x64(True):
        torch.manual_seed(0)
        check_layer(GPT(CFG, dtype=jnp.float64), TorchGPT(CFG), [_idx(shape=(2, 5))], train=True, dtype="float64")


@pytest.mark.parametrize("remat", gpt.REMAT)
def test_remat_blocks_in_a_scan_give_torchs_logits_and_gradients(remat):
    # torch's twin runs its blocks in a Python loop with no checkpointing: remat changes what
    # is stored for the backward, not what is computed.
    with jax.enable_x64(True):
        torch.manual_seed(0)
        cfg = CFG._replace(n_layer=3)
        check_layer(GPT(cfg, dtype=jnp.float64, remat=remat), TorchGPT(cfg), [_idx(shape=(2, 5))], train=True,
                    dtype="float64")


def test_remat_draws_the_loops_dropout_keys():
    cfg = CFG._replace(n_layer=2, dropout=0.3)
    plain, idx = GPT(cfg), _idx()
    params = plain.init(jax.random.key(0))

    def loss(model):
        # jitted with the key as an argument: one compile per model serves every seed
        return jax.jit(jax.value_and_grad(
            lambda p, key: funcnet.losses.cross_entropy(model.apply(p, idx, key=key, train=True), idx)))

    plain_loss = loss(plain)
    want_loss, want = plain_loss(params, jax.random.key(7))
    got_loss, got = loss(GPT(cfg, remat="selective"))(params, jax.random.key(7))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    # a different key gives different masks: the loss above depends on the key
    assert abs(float(plain_loss(params, jax.random.key(8))[0]) - float(want_loss)) > 1e-4


def test_bad_remat_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"remat must be None, one of \('paper', 'selective', 'full'\).*'some'"):
        GPT(CFG, remat="some")


def test_state_dict_keys_and_order_are_torchs_with_both_tied_keys():
    ours, theirs, params = _pair()
    sd = funcnet.state_dict(params, model=ours)
    assert list(sd) == list(theirs.state_dict())
    assert "transformer.wte.weight" in sd and "lm_head.weight" in sd
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]
    # a state dict whose tied keys disagree is refused
    bad = dict(theirs.state_dict())
    bad["lm_head.weight"] = bad["lm_head.weight"] + 1
    with pytest.raises(funcnet.StateDictError, match="tied to transformer.wte.weight"):
        funcnet.load_state_dict(params, bad)


def test_the_tie_is_one_array_whose_gradient_is_the_sum_of_both_uses():
    ours, theirs, params = _pair()
    assert len(jax.tree.leaves(params)) == len(list(theirs.parameters()))  # torch dedups the shared tensor
    idx, targets = _idx(seed=1), _idx(seed=2)
    loss = lambda p: funcnet.losses.cross_entropy(ours.apply(p, jnp.asarray(idx)), jnp.asarray(targets))  # noqa
    g = jax.jit(jax.grad(loss))(params)["transformer"]["wte"]["weight"]
    # oracle: torch with the tie cut (two parameters, same values): the two gradients, summed
    theirs.lm_head.weight = torch.nn.Parameter(theirs.transformer.wte.weight.detach().clone())
    logits = theirs(torch.from_numpy(idx).long())
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(targets).long().flatten()).backward()
    emb, head = theirs.transformer.wte.weight.grad.numpy(), theirs.lm_head.weight.grad.numpy()
    assert np.abs(emb).max() > 0 and np.abs(head).max() > 0  # both uses contribute
    np.testing.assert_allclose(g, emb + head, rtol=1e-5, atol=1e-7)


def test_init_is_nanogpts():
    cfg = GPTConfig(block_size=64, vocab_size=500, n_layer=3, n_head=2, n_embd=64)
    sd = funcnet.state_dict(GPT(cfg).init(jax.random.key(0)))
    for k, v in sd.items():
        v = np.asarray(v)
        if k.endswith("c_proj.weight"):
            std = 0.02 / math.sqrt(2 * cfg.n_layer)
        elif k.endswith("bias"):
            assert not v.any(), k
            continue
        elif ".ln_" in k:
            np.testing.assert_array_equal(v, 1.0, err_msg=k)
            continue
        else:
            std = 0.02  # Linear and Embedding weights, the tied one included
        assert abs(v.mean()) < 4 * std / math.sqrt(v.size), k
        assert abs(v.std() / std - 1) < 5 / math.sqrt(v.size) + 0.01, (k, v.std(), std)


def test_num_params_is_nanogpts():
    ours, theirs, params = _pair()
    total = sum(p.numel() for p in theirs.parameters())  # counts the tied tensor once
    assert gpt.num_params(params, non_embedding=False) == total
    assert gpt.num_params(params) == total - theirs.transformer.wpe.weight.numel()


def test_build_is_gpt_with_the_examples_defaults():
    model = gpt.build(11, 16)
    assert model.name == GPT(GPTConfig(16, 11, 3, 4, 96)).name
    shapes = funcnet.state_dict(jax.eval_shape(model.init, jax.random.key(0)))
    assert shapes["transformer.wpe.weight"].shape == (16, 96) and len({k.split(".")[2] for k in shapes
                                                                       if ".h." in k}) == 3


def test_bad_config_and_inputs_are_refused_clearly():
    with pytest.raises(ValueError, match="divisible by n_head=3"):
        GPT(CFG._replace(n_head=3))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        GPT(CFG._replace(block_size=0))
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT(dict(CFG._asdict()))
    model = GPT(CFG)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="block size is only 8"):
        model.apply(params, _idx(shape=(1, 9)))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model.apply(params, _idx(shape=(8,)))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model.apply(params, np.zeros((1, 4), np.float32))


# ------------------------------------------------------------------ attention under bf16
def test_attention_scores_and_softmax_run_in_float32_under_bf16():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 2, 6, 8)), jnp.bfloat16) for _ in range(3))
    jaxpr = str(jax.make_jaxpr(gpt.causal_attention)(q, k, v))
    exps = [line for line in jaxpr.splitlines() if " exp " in line or "= exp" in line]
    assert exps and all("f32" in line for line in exps), exps
    out = gpt.causal_attention(q, k, v)
    assert out.dtype == jnp.bfloat16
    # oracle: torch's SDPA in float32 on the same (bf16-representable) values, rounded to bf16
    t = [torch.from_numpy(np.asarray(a, np.float32)) for a in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True).numpy()
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2 ** -7, atol=2 ** -8)


def test_bf16_training_step_runs_with_float32_master_weights():
    model = GPT(CFG)
    tx = gpt.configure_optimizers(warmup_steps=1, decay_steps=10)
    state = funcnet.create_train_state(model, tx, jax.random.key(0))
    step = funcnet.make_step(model, tx, policy="bf16")
    state, metrics = step(state, (jnp.asarray(_idx()), jnp.asarray(_idx(seed=1))))
    assert np.isfinite(float(metrics["loss"])) and abs(float(metrics["loss"]) - math.log(CFG.vocab_size)) < 0.2
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(state.params))


# ------------------------------------------------------------------ generation
def _greedy_oracle(model, params, idx, n, block_size):
    # nanoGPT's loop, one forward per token on the cropped context, argmax of the last position
    idx = np.asarray(idx)
    forward = jax.jit(model.apply)
    for _ in range(n):
        logits = forward(params, jnp.asarray(idx[:, -block_size:]))
        idx = np.concatenate([idx, np.asarray(jnp.argmax(logits[:, -1], -1))[:, None].astype(idx.dtype)], 1)
    return idx


def test_greedy_equals_argmax_decoding_step_by_step_across_the_crop():
    model = GPT(CFG)
    params = model.init(jax.random.key(3))
    prompt = _idx(shape=(2, 3))
    out = gpt.generate(model, params, prompt, 12, key=jax.random.key(0), greedy=True)  # 15 > block 8
    assert out.shape == (2, 15)
    np.testing.assert_array_equal(out, _greedy_oracle(model, params, prompt, 12, CFG.block_size))
    np.testing.assert_array_equal(out[:, :3], prompt)
    # and torch's nanoGPT loop from the same weights
    _, theirs, tparams = _pair(seed=3)
    ours_out = gpt.generate(model, tparams, prompt, 12, key=jax.random.key(0), greedy=True)
    np.testing.assert_array_equal(ours_out, torch_greedy(theirs, torch.from_numpy(prompt).long(), 12).numpy())


def test_sampling_is_deterministic_per_key_and_compiles_once():
    model = GPT(CFG)
    params = model.init(jax.random.key(0))
    prompt = _idx(shape=(2, 2))
    before = gpt._generate._cache_size()
    a = gpt.generate(model, params, prompt, 10, key=jax.random.key(1))
    b = gpt.generate(model, params, prompt, 10, key=jax.random.key(1))
    c = gpt.generate(model, params, prompt, 10, key=jax.random.key(2), temperature=0.7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert gpt._generate._cache_size() == before + 1  # new keys and temperatures reuse the executable


def test_sampled_token_frequencies_follow_softmax_over_temperature_and_top_k():
    model = GPT(CFG)
    params = model.init(jax.random.key(0))
    # ln_f's affine parameters times 30 scale the logits by 30: a distribution far from uniform
    params["transformer"]["ln_f"] = {k: v * 30 for k, v in params["transformer"]["ln_f"].items()}
    n, temperature = 4000, 0.5
    prompt = np.tile(_idx(shape=(1, 4)), (n, 1))
    logits = np.asarray(jax.jit(model.apply)(params, jnp.asarray(prompt[:1]))[0, -1], np.float64)
    out = np.asarray(gpt.generate(model, params, prompt, 1, key=jax.random.key(5), temperature=temperature))[:, -1]
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    assert p.max() > 0.2  # not uniform
    freq = np.bincount(out, minlength=CFG.vocab_size) / n
    assert np.all(np.abs(freq - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-3), (freq, p)  # 4 standard errors
    top = np.asarray(gpt.generate(model, params, prompt, 1, key=jax.random.key(6), top_k=2))[:, -1]
    assert set(np.unique(top).tolist()) == set(np.argsort(logits)[-2:].tolist())


def test_generate_refuses_bad_arguments():
    model = GPT(CFG)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="greedy=True"):
        gpt.generate(model, params, _idx(shape=(1, 2)), 3, key=jax.random.key(0), temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        gpt.generate(model, params, _idx(shape=(1, 2)), 3, key=jax.random.key(0), top_k=0)
    with pytest.raises(ValueError, match="no tokens"):
        gpt.generate(model, params, np.zeros((1, 0), np.int32), 3, key=jax.random.key(0))


# ------------------------------------------------------------------ optimizer pieces
def test_decay_mask_marks_matrices_only_as_nanogpt_groups():
    ours, theirs, params = _pair()
    mask = funcnet.state_dict(gpt.decay_mask(params))
    assert {k for k, v in mask.items() if v} - {"lm_head.weight"} == \
        {n for n, p in theirs.named_parameters() if p.dim() >= 2}


@pytest.mark.parametrize("scale", [0.01, 100.0])  # below and above max_norm
def test_clip_grad_norm_equals_torchs(scale):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) * scale for s in ((3, 4), (5,))]
    t = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    for p, g in zip(t, grads):
        p.grad = torch.from_numpy(g.copy())
    torch.nn.utils.clip_grad_norm_(t, 1.0)
    tx = gpt.clip_grad_norm(1.0)
    out, _ = tx.update([jnp.asarray(g) for g in grads], tx.init(None))
    for a, p in zip(out, t):
        np.testing.assert_allclose(a, p.grad.numpy(), rtol=1e-6, atol=0)


def test_lr_schedule_is_nanogpts_get_lr_in_float64_under_x64():
    learning_rate, warmup_iters, lr_decay_iters, min_lr = 6e-4, 100, 500, 6e-5

    def get_lr(it):  # nanoGPT's train.py, verbatim
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        assert 0 <= decay_ratio <= 1
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    with jax.enable_x64(True):
        schedule = gpt.lr_schedule(learning_rate, warmup_iters, lr_decay_iters, min_lr)
        # optax passes its step count as int32: still evaluated in float64
        got = np.asarray(jax.vmap(schedule)(jnp.arange(0, 700, dtype=jnp.int32)))
    want = np.asarray([get_lr(t) for t in range(700)])
    assert got[0] == want[0] and got[1] == want[1]  # 5.94e-6 and 1.19e-5: the warmup never starts at 0
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match="warmup_steps < decay_steps"):
        gpt.lr_schedule(learning_rate, 10, 10)


def test_configure_optimizers_adds_no_warmup():
    # nanoGPT's configure_optimizers is AdamW at a constant lr: the first update of a zero
    # gradient is AdamW's decay at the full lr (no warmup that would make it 0)
    lr, wd = 1e-2, 0.1
    tx = gpt.configure_optimizers(learning_rate=lr, weight_decay=wd)
    params = {"w": jnp.ones((2, 2))}
    updates, _ = tx.update({"w": jnp.zeros((2, 2))}, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -lr * wd * np.ones((2, 2)), rtol=1e-6)
    with pytest.raises(ValueError, match="needs decay_steps"):
        gpt.configure_optimizers(warmup_steps=100)


def test_configure_optimizers_decays_matrices_only_with_the_scheduled_lr():
    # zero gradients: Adam's part of the update is 0, what is left is AdamW's decay -lr * wd * p,
    # on the matrices only (closed form), with the lr of step 0 (warmup_steps=0: the peak)
    lr, wd = 1e-2, 0.1
    tx = gpt.configure_optimizers(learning_rate=lr, weight_decay=wd, warmup_steps=0, decay_steps=10)
    params = GPT(CFG).init(jax.random.key(0))
    # jitted: one compile instead of one per op and leaf
    updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    sd, up = funcnet.state_dict(params), funcnet.state_dict(updates)
    assert up["lm_head.weight"] is up["transformer.wte.weight"]  # the tied array is updated once
    for k, p in sd.items():
        want = -lr * wd * np.asarray(p) if p.ndim >= 2 else np.zeros(p.shape)
        np.testing.assert_allclose(up[k], want, rtol=1e-6, atol=1e-12, err_msg=k)


def _largest_transposing_copy(n_layer):
    """Instructions in the largest fusion of the compiled train step whose root is a copy or a
    transpose (a layout copy), for a tiny GPT of ``n_layer`` blocks."""
    import re

    import optax

    from funcnet import losses, train

    cfg = GPTConfig(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=0.0, bias=True)
    model, tx = GPT(cfg), optax.sgd(0.1)
    step = train.make_step(model, tx, losses.cross_entropy, metrics=lambda out, tgt: {}, donate=False)
    state = train.create_train_state(model, tx, jax.random.key(0))
    idx = jnp.zeros((2, 16), jnp.int32)
    hlo = step.lower(state, (idx, idx)).compile().as_text()
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"\n(%\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S)}
    sizes = [bodies[m.group(1)].count("\n") + 1 for m in re.finditer(r" fusion\([^\n]*calls=(%[\w.\-]+)", hlo)
             if re.search(r"ROOT \S+ = \S+ (copy|transpose)\(", bodies.get(m.group(1), ""))]
    return max(sizes, default=0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="gradient_apart acts on the CPU backend only")
def test_the_residual_gradient_is_not_recomputed_inside_each_layers_copies():
    """XLA:CPU fused the residual stream's gradient (a sum that grows by a term a layer) into each
    weight gradient's transposing copy, so the copies grew with depth (without gradient_apart in
    Block: 227 instructions at 2 layers, 491 at 6; GPT-2 small's step spent 462 ms in them against
    73). With the gradient written to memory once a sublayer, the largest copy is the same size at
    any depth."""
    assert _largest_transposing_copy(6) == _largest_transposing_copy(2) < 100


def test_gradient_apart_is_exact_in_reverse_and_forward_mode():
    """gradient_apart is the identity: gradients, tangents and batched (vmap) gradients through it
    are bitwise those without it, NaN and infinities included."""
    from funcnet.nn.functional._common import gradient_apart

    x = jnp.array([[0.5, -2.0, jnp.nan], [jnp.inf, 3.0, -0.0]], jnp.float32)
    x_first_nan = x[:, ::-1]

    def f(x):
        return jnp.sum(jnp.sin(x) * x)

    def g(x):
        return jnp.sum(jnp.sin(gradient_apart(x)) * gradient_apart(x))

    for v in (x, x_first_nan, jnp.arange(6.0).reshape(2, 3)):
        np.testing.assert_array_equal(jax.grad(g)(v), jax.grad(f)(v))
        np.testing.assert_array_equal(jax.jvp(g, (v,), (jnp.ones_like(v),))[1], jax.jvp(f, (v,), (jnp.ones_like(v),))[1])
        np.testing.assert_array_equal(jax.vmap(jax.grad(g))(v), jax.vmap(jax.grad(f))(v))
        np.testing.assert_array_equal(gradient_apart(v), v)
