"""funcnet.parallel.tensor: Megatron's rules as shardings; the oracle is the same GPT on one device
(jax.grad of the unsharded step), and Megatron's hand count of the all-reduces."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from funcnet import gpt
from funcnet import step as fstep
from funcnet.parallel import tensor as tp

CFG = gpt.GPTConfig(block_size=8, vocab_size=32, n_layer=1, n_head=4, n_embd=32)
STEPS, BATCH = 2, 4
# float32: the sharded matmuls sum their K axis in other orders (about 1e-7 relative), and
# Adam's first step is lr * g / |g| for every entry, which turns the rounding of a near-zero
# gradient into up to lr of difference: atol 1e-5 is 1% of lr = 1e-3
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _batches():
    rng = np.random.default_rng(0)
    return rng.integers(0, CFG.vocab_size, size=(STEPS, 2, BATCH, CFG.block_size)).astype(np.int32)


def _train(mesh_shape=None, vocab="split"):
    """STEPS Adam steps from the same nanoGPT-packed init; returns losses, nanoGPT-packed params, compiled step."""
    params = gpt.GPT(CFG).init(jax.random.key(0))
    tx = optax.adam(1e-3)
    batches = _batches()
    if mesh_shape is None:
        model = gpt.GPT(CFG)
        step = fstep.make_step(model, tx, donate=False)
        state = fstep.create_train_state(model, tx, jax.random.key(1), params=params)
        compiled = None
    else:
        t = mesh_shape[2]
        model = gpt.GPT(CFG._replace(qkv_groups=t))
        state = fstep.create_train_state(model, tx, jax.random.key(1),
                                         params=tp.pack_qkv(params, t, CFG.n_head))
        step = tp.make_tp_step(model, tx, mesh=tp.mesh(*mesh_shape), state=state, vocab=vocab, donate=False)
        state = jax.device_put(state, step.shardings)
        compiled = step.lower(state, tuple(batches[0])).compile()
    losses = []
    for x, y in batches:
        state, metrics = step(state, (x, y))
        losses.append(float(metrics["loss"]))
    out = state.params if mesh_shape is None else tp.unpack_qkv(state.params, mesh_shape[2], CFG.n_head)
    return losses, jax.tree.map(np.asarray, out), compiled


@pytest.fixture(scope="module")
def one_device():
    return _train()


def _assert_same(run, reference):
    np.testing.assert_allclose(run[0], reference[0], **TOL)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), run[1], reference[1])


def test_pack_qkv_is_the_same_function_and_unpack_inverts_it():
    params = gpt.GPT(CFG).init(jax.random.key(0))
    packed = tp.pack_qkv(params, 2, CFG.n_head)
    w, wp = (p["transformer"]["h"]["0"]["attn"]["c_attn"]["weight"] for p in (params, packed))
    assert not np.array_equal(w, wp)  # the rows moved
    idx = jnp.arange(16).reshape(2, 8) % CFG.vocab_size
    np.testing.assert_allclose(gpt.GPT(CFG._replace(qkv_groups=2)).apply(packed, idx), gpt.GPT(CFG).apply(params, idx),
                               rtol=1e-6, atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, tp.unpack_qkv(packed, 2, CFG.n_head), params)


def test_tp2_trains_as_one_device_with_megatrons_all_reduces(one_device):
    run = _train((1, 1, 2), vocab="replicate")
    _assert_same(run, one_device)
    stats = tp.collective_stats(run[2])
    # vocab replicated: only the blocks communicate, 2 all-reduces forward + 2 backward per layer
    assert stats["all-reduce"]["count"] == tp.MEGATRON_ALL_REDUCES_PER_LAYER * CFG.n_layer
    assert sum(v["count"] for k, v in stats.items() if k != "all-reduce") == 0
    # each moves one (B, T, C) float32 activation (the batch is not split on the model axis)
    assert stats["all-reduce"]["bytes"] == 4 * CFG.n_layer * BATCH * CFG.block_size * CFG.n_embd * 4


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(1, 1, 4), (1, 2, 2)], ids=["tp4", "fsdp2xtp2"])
def test_tp4_and_fsdp_x_tp_train_as_one_device(one_device, mesh_shape):
    run = _train(mesh_shape, vocab="split")
    _assert_same(run, one_device)
    assert tp.collective_stats(run[2])["all-reduce"]["count"] >= tp.MEGATRON_ALL_REDUCES_PER_LAYER * CFG.n_layer


def test_placed_params_are_split_as_megatron_says():
    model = gpt.GPT(CFG._replace(qkv_groups=2))
    state = jax.eval_shape(lambda: fstep.create_train_state(model, optax.adam(1e-3), jax.random.key(0)))
    sh = tp.state_shardings(state, tp.mesh(1, 2, 2))
    block = sh.params["transformer"]["h"]["0"]
    assert block["attn"]["c_attn"]["weight"].spec == jax.sharding.PartitionSpec("model", "fsdp")  # column
    assert block["mlp"]["c_proj"]["weight"].spec == jax.sharding.PartitionSpec("fsdp", "model")  # row
    assert block["mlp"]["c_proj"]["bias"].spec == jax.sharding.PartitionSpec()
    assert sh.params["transformer"]["wte"]["weight"].spec == jax.sharding.PartitionSpec("model", "fsdp")  # vocab
    mu = sh.opt_state[0].mu["transformer"]["h"]["0"]["attn"]["c_attn"]["weight"]
    assert mu.spec == block["attn"]["c_attn"]["weight"].spec  # Adam's moments follow their params


def test_mlp_shard_map_with_explicit_psum_equals_the_mlp():
    mlp = gpt.MLP(CFG)
    params = mlp.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 8, CFG.n_embd))
    sharded = jax.jit(tp.mlp_shard_map(tp.mesh(1, 1, 4)))  # jitted: eagerly each op compiles alone
    np.testing.assert_allclose(sharded(params, x), mlp.apply(params, x), rtol=1e-5, atol=1e-6)
    g_ours = jax.jit(jax.grad(lambda p: jnp.sum(sharded(p, x) ** 2)))(params)
    g_ref = jax.jit(jax.grad(lambda p: jnp.sum(mlp.apply(p, x) ** 2)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g_ours, g_ref)
    hlo = sharded.lower(params, x).compile().as_text()
    assert tp.collective_stats(hlo)["all-reduce"]["count"] == 1  # the psum, nothing else


def test_collective_stats_counts_a_combined_all_reduce_whose_tuple_type_has_index_comments():
    # XLA prints a tuple of more than 5 arrays with /*index=5*/ comments (a data axis's combined gradient all-reduce)
    hlo = ("  %all-reduce.32 = (f32[384]{0}, f32[384,128]{1,0}, f32[128]{0}, f32[128,128]{1,0}, f32[128]{0}, "
           "/*index=5*/f32[128]{0}, f32[]) all-reduce(%a, %b, %c, %d, %e, %f, %g), channel_id=2, "
           "to_apply=%add\n  %all-reduce = s32[] all-reduce(%h), channel_id=1, to_apply=%add.1\n")
    floats = 384 + 384 * 128 + 128 + 128 * 128 + 128 + 128 + 1
    assert tp.collective_stats(hlo)["all-reduce"] == {"count": 2, "bytes": 4 * floats + 4}


def test_bad_layouts_are_refused_with_the_fix():
    m = tp.mesh(1, 1, 2)
    with pytest.raises(ValueError, match="qkv_groups=2"):
        tp.check_config(CFG, m)
    with pytest.raises(ValueError, match="n_head=4 must be divisible"):
        tp.check_config(CFG._replace(n_head=4, qkv_groups=1), tp.mesh(1, 1, 8))
    with pytest.raises(ValueError, match="vocab='replicate'"):
        tp.check_config(CFG._replace(vocab_size=33, qkv_groups=2), m)
    with pytest.raises(ValueError, match="qkv_groups=3 must divide n_head=4"):
        gpt.GPT(CFG._replace(qkv_groups=3))
    with pytest.raises(ValueError, match="16 devices"):
        tp.mesh(2, 2, 4)


def test_fit_with_strategy_tp_equals_one_device():
    # fit(strategy="tp"): the same shuffled batches and keys on a (data 2, model 2) mesh as on one device
    from funcnet import train
    from funcnet.parallel import strategy

    # c_attn packed for a model axis of 2, on every run; a vocabulary of 33 (odd, as the bundled text's 103)
    # that 2 does not divide: fit keeps the embedding whole on each model device instead of failing to place it
    cfg = CFG._replace(qkv_groups=2, vocab_size=33)
    model = gpt.GPT(cfg)
    rng = np.random.default_rng(1)
    x = rng.integers(0, cfg.vocab_size, size=(16, CFG.block_size)).astype(np.int32)
    y = rng.integers(0, cfg.vocab_size, size=(16, CFG.block_size)).astype(np.int32)

    def run(**kw):
        return train.fit(model, optax.adam(1e-3), (x, y), epochs=1, batch_size=8, key=jax.random.key(0),
                         progress=False, **kw)

    one, hist_one = run()
    many, hist_many = run(strategy=strategy.Strategy("tp", tensor_parallel=2), devices=4)
    np.testing.assert_allclose([r["train_loss"] for r in hist_many], [r["train_loss"] for r in hist_one], **TOL)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL), many.params,
                 one.params)
    with pytest.raises(ValueError, match="tensor_parallel=3 must divide the 4 devices"):
        run(strategy=strategy.Strategy("tp", tensor_parallel=3), devices=4)
    with pytest.raises(ValueError, match=r"needs c_attn packed .* GPTConfig\(\.\.\., qkv_groups=2\)"):
        train.fit(gpt.GPT(cfg._replace(qkv_groups=1)), optax.adam(1e-3), (x, y), epochs=1, batch_size=8,
                  key=jax.random.key(0), progress=False, strategy=strategy.Strategy("tp", tensor_parallel=2),
                  devices=4)


# --- tensor parallelism by a plan, on a model the user brings (a torch MLP through interop.convert) ---

PLAN = {"0": tp.ColwiseParallel(), "2": tp.RowwiseParallel()}  # torch's parallelize_module plan for the MLP


def _converted_mlp():
    import torch

    from funcnet import interop

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).double()
    model, params, _ = interop.convert(net)
    return model, params


def test_tp_by_plan_on_a_converted_mlp_splits_its_params_inserts_collectives_and_equals_one_device():
    with jax.enable_x64(True):
        model, params = _converted_mlp()
        tx = optax.adam(1e-2)
        rng = np.random.default_rng(3)
        batches = [(rng.standard_normal((8, 16)), rng.integers(0, 16, 8).astype(np.int32)) for _ in range(2)]
        state = fstep.create_train_state(model, tx, jax.random.key(1), params=params)
        single = fstep.make_step(model, tx, donate=False)
        step = tp.make_tp_step(model, tx, mesh=tp.mesh(1, 1, 4), state=state, plan=PLAN, donate=False)
        placed = jax.device_put(state, step.shardings)
        dev0 = jax.devices()[0]
        held = sum(s.data.nbytes for a in jax.tree.leaves(placed.params) for s in a.addressable_shards
                   if s.device == dev0)
        # column: (64, 16) weight and its bias split 4 ways; row: (16, 64) weight split, its bias whole
        assert held == 8 * ((64 * 16 + 64 + 16 * 64) // 4 + 16)
        assert step.shardings.opt_state[0].mu["2"]["weight"].spec == P(None, "model")  # Adam's moments follow
        stats = tp.collective_stats(step.lower(placed, batches[0]).compile())
        assert stats["all-reduce"]["count"] >= 1, stats  # the row-parallel partial sums, at least
        losses, ref = [], []
        for batch in batches:
            placed, m = step(placed, batch)
            state, m1 = single(state, batch)
            losses.append(float(m["loss"]))
            ref.append(float(m1["loss"]))
        # the row-parallel matmul sums its 64 products in 4 partial sums: within 64 eps of one device's order
        np.testing.assert_allclose(losses, ref, rtol=64 * np.finfo(np.float64).eps)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13),
                     placed.params, state.params)


def test_fit_with_a_plan_equals_one_device_and_without_one_is_refused():
    with jax.enable_x64(True):
        _fit_with_a_plan_and_refusals()


def _fit_with_a_plan_and_refusals():
    from funcnet import nn, train
    from funcnet.parallel import strategy

    # params "0" (Linear 16 -> 64) and "2" (Linear 64 -> 16): the converted MLP's plan applies as it is
    model = nn.Sequential(nn.Linear(16, 64, dtype=jnp.float64), nn.GELU(), nn.Linear(64, 16, dtype=jnp.float64))
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((16, 16)), rng.integers(0, 16, 16).astype(np.int32)

    def run(**kw):
        return train.fit(model, optax.adam(1e-3), (x, y), epochs=1, batch_size=8, key=jax.random.key(0),
                         progress=False, **kw)

    one, hist_one = run()
    many, hist_many = run(strategy=strategy.Strategy("tp", tensor_parallel=2, plan=PLAN), devices=4)
    # float64: sums of at most 64 products in another order (64 eps), through 2 Adam steps of lr 1e-3
    np.testing.assert_allclose([r["train_loss"] for r in hist_many], [r["train_loss"] for r in hist_one],
                               rtol=64 * np.finfo(np.float64).eps)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13),
                 many.params, one.params)
    # never a replicated "TP" run: each refusal is one line, raised before anything compiles
    for bad, match in [(None, r"needs a plan for this Sequential.*plan=\{"),
                       ({"blocks.*.fc": tp.ColwiseParallel()}, r"pattern 'blocks\.\*\.fc' matches no parameter.*0, 2"),
                       ({"0": tp.Replicate()}, "no parameter is split over the model axis"),
                       ({"0": "colwise"}, "is not a style")]:
        kind = "tp" if bad is None else strategy.Strategy("tp", plan=bad)
        with pytest.raises((ValueError, TypeError), match=match) as info:
            run(strategy=kind, devices=4)
        assert "\n" not in str(info.value), info.value
    with pytest.raises(ValueError, match=r"x\.weight of shape \(6, 4\) \(pattern 'x', ColwiseParallel\) is split "
                                         r"along axis 0 of size 6, which the model axis \(4\) does not divide"):
        tp.plan_spec({"x": tp.ColwiseParallel()}, ("x", "weight"), (6, 4), tp.mesh(1, 1, 4))
    with pytest.raises(ValueError, match="takes no plan"):
        run(strategy=strategy.Strategy("fsdp", plan=PLAN), devices=2)


def test_an_embeddings_styles_are_torchs_its_weight_being_the_transpose_of_a_linears():
    # torch: RowwiseParallel on nn.Embedding splits the vocabulary (weight dim 0), ColwiseParallel the embedding
    # dim (1); on nn.Linear, whose weight is (out, in), the other way round
    from funcnet import nn

    model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 8))
    state = jax.eval_shape(lambda: fstep.create_train_state(model, optax.sgd(0.1), jax.random.key(0)))
    m = tp.mesh(1, 1, 2)
    for emb_style, linear_style, emb_spec, linear_spec in [
            (tp.RowwiseParallel(), tp.ColwiseParallel(), P("model", None), P("model", None)),
            (tp.ColwiseParallel(), tp.RowwiseParallel(), P(None, "model"), P(None, "model"))]:
        sh = tp.state_shardings(state, m, plan={"0": emb_style, "1": linear_style}, model=model)
        assert sh.params["0"]["weight"].spec == emb_spec and sh.params["1"]["weight"].spec == linear_spec
