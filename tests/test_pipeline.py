"""funcnet.parallel.pipeline: the schedule tables against GPipe's closed-form bubble and each schedule's rules,
the pipelined loss and gradients against jax.value_and_grad of the whole GPT on one device, and the
activation memory a stage holds read off XLA's compiled temps."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import gpt, losses, memory
from funcnet.parallel import pipeline as pp

CFG = gpt.GPTConfig(block_size=8, vocab_size=32, n_layer=4, n_head=2, n_embd=16)


@pytest.mark.parametrize("kind", pp.KINDS)
@pytest.mark.parametrize(("stages", "micro"), [(1, 3), (2, 4), (3, 5), (4, 2), (4, 8)])
def test_schedule_runs_every_action_once_in_order_and_its_bubble_is_gpipes(kind, stages, micro):
    s = pp.schedule(kind, stages, micro)
    f, b = s.tick_of(pp.FORWARD), s.tick_of(pp.BACKWARD)
    actions = s.table[:, :, 0]
    assert (actions == pp.FORWARD).sum() == (actions == pp.BACKWARD).sum() == stages * micro
    assert (f >= 0).all() and (b >= 0).all()
    assert (f[1:] > f[:-1]).all()  # a forward after the previous stage's
    assert (b[:-1] > b[1:]).all() and (b > f).all()  # a backward after the next stage's and its own forward
    # unit-time F and B: (P - 1) / (M + P - 1) (Huang et al. 2019, GPipe, section 2.3), from idle slots counted
    assert Fraction(int((actions == pp.IDLE).sum()), s.ticks * stages) == Fraction(stages - 1, micro + stages - 1)
    assert s.held == (micro if kind == "gpipe" else min(stages, micro))


def test_1f1b_alternates_after_its_warm_up():
    s = pp.schedule("1f1b", 4, 6)
    row = [tuple(a) for a in s.table[:, 0] if a[0] != pp.IDLE]  # stage 0: 3 warm-up forwards, then F, B in turn
    assert row[:5] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0)]
    assert "stage 3   .  .  . F0 B0 F1 B1" in s.draw()


def test_from_orders_refuses_a_backward_before_its_forward():
    with pytest.raises(ValueError, match="never finish"):
        pp.from_orders("bad", 1, [[(pp.BACKWARD, 0), (pp.FORWARD, 0)]])


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, CFG.vocab_size, size=(n, CFG.block_size)).astype(np.int32) for _ in range(2))


@pytest.mark.parametrize(("kind", "stages", "micro"), [("1f1b", 4, 8)])  # GPipe: the steps test below
def test_loss_and_gradients_equal_one_device_in_float64(kind, stages, micro):
    with jax.enable_x64(True):
        model = gpt.GPT(CFG, dtype=jnp.float64)
        params = model.init(jax.random.key(3))
        x, y = _batch(2 * micro, seed=stages)
        loss, grads = jax.jit(jax.value_and_grad(lambda p: losses.cross_entropy(model.apply(p, x), y)))(params)
        vg = jax.jit(pp.make_value_and_grad(CFG, pp.mesh(stages), micro, kind))
        got_loss, (g_rest, g_blocks) = vg(*pp.split_params(params), x, y)
        want_rest, want_blocks = pp.split_params(grads)
        # float64: the same operations, the batch's sums regrouped by microbatch: rounding ~1e-16 relative
        np.testing.assert_allclose(got_loss, loss, rtol=1e-12)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13), (g_rest, g_blocks),
                     (want_rest, want_blocks))


def test_gpipe_steps_equal_one_device_adam_and_blocks_stay_split():
    tx = optax.adam(1e-2)
    with jax.enable_x64(True):
        model = gpt.GPT(CFG, dtype=jnp.float64)
        params = model.init(jax.random.key(5))
        step = pp.make_step(CFG, tx, pp.mesh(2), 2, "gpipe")
        split = step.place(pp.split_params(params))
        opt = tx.init(split)
        p, one_opt = params, tx.init(params)
        one_device = jax.jit(jax.value_and_grad(lambda q, x, y: losses.cross_entropy(model.apply(q, x), y)))
        for seed in range(2):
            x, y = _batch(4, seed=10 + seed)
            split, opt, loss = step(split, opt, x, y)
            want, g = one_device(p, x, y)
            updates, one_opt = tx.update(g, one_opt, p)
            p = optax.apply_updates(p, updates)
            np.testing.assert_allclose(loss, want, rtol=1e-12)
        got = pp.join_params(*split, like=params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12),
                     got["transformer"], p["transformer"])
        assert split[1]["attn"]["c_attn"]["weight"].sharding.spec == jax.sharding.PartitionSpec("pipe")


def test_gpipe_holds_a_stage_input_per_microbatch_1f1b_at_most_p():
    """XLA's compiled temps (nothing runs): GPipe's grow by one microbatch's stage input per
    microbatch added, 1F1B's stay put (it holds P of them whatever M)."""
    cfg = CFG._replace(n_layer=2)
    params = jax.eval_shape(gpt.GPT(cfg).init, jax.random.key(0))
    rest, blocks = jax.eval_shape(pp.split_params, params)
    rows = 2  # sequences per microbatch
    slot = rows * cfg.block_size * cfg.n_embd * 4  # one microbatch's stage input, float32
    temps = {}
    for kind in pp.KINDS:
        for micro in (2, 4):
            idx = jax.ShapeDtypeStruct((rows * micro, cfg.block_size), jnp.int32)
            vg = pp.make_value_and_grad(cfg, pp.mesh(2), micro, kind)
            temps[kind, micro] = memory.measure(vg, rest, blocks, idx, idx).temps
    assert temps["gpipe", 4] - temps["gpipe", 2] == 2 * slot
    assert temps["1f1b", 4] == temps["1f1b", 2]


def test_bad_inputs_are_refused_naming_the_fix():
    with pytest.raises(ValueError, match="divisors of 4"):
        pp.make_value_and_grad(CFG, pp.mesh(3), 2)
    with pytest.raises(ValueError, match="dropout=0"):
        pp.check_config(CFG._replace(dropout=0.1), 2, 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        pp.check_config(CFG, 2, 4, batch=6)
    with pytest.raises(ValueError, match="one of"):
        pp.schedule("zero-bubble", 2, 2)
    with pytest.raises(ValueError, match="pipeline.mesh"):
        pp.make_value_and_grad(CFG, jax.sharding.Mesh(jax.devices()[:2], ("data",)), 2)
    with pytest.raises(ValueError, match="device_count"):
        pp.mesh(len(jax.devices()) + 1)
