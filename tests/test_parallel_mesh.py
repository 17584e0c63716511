"""funcnet.parallel.mesh: fit on one (data, model, pipe) = 2 x 2 x 2 mesh of 8 simulated devices against
fit on one device (same batches, same init), the placement the rules give, and the refusals."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from funcnet import gpt, train
from funcnet.parallel import mesh as pm
from funcnet.parallel.strategy import Strategy

# qkv_groups=2: c_attn packed for a model axis of 2 on every run (the one-device run too)
CFG = gpt.GPTConfig(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, qkv_groups=2)
# float32 gradients summed in another order (data pmean, model all-reduces) differ by ~1e-7 relative;
# Adam divides by their root mean square, so 2 steps of lr 1e-3 move a parameter by <= 2e-3 and the runs
# differ by ~1e-6 where a gradient is tiny: atol 1e-5 (the tp test's), rtol 1e-4
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _data():
    rng = np.random.default_rng(3)
    x = rng.integers(0, CFG.vocab_size, size=(16, CFG.block_size)).astype(np.int32)
    y = rng.integers(0, CFG.vocab_size, size=(16, CFG.block_size)).astype(np.int32)
    return x, y


def _fit(**kw):
    return train.fit(gpt.GPT(CFG), optax.adam(1e-3), _data(), epochs=1, batch_size=8, key=jax.random.key(0),
                     progress=False, **kw)


def test_fit_on_data_tensor_pipe_mesh_equals_one_device():
    one, hist_one = _fit()
    three, hist_three = _fit(strategy=Strategy("pipe", pipeline=2, tensor_parallel=2, config=CFG), devices=8)
    assert int(three.step) == int(one.step) == 2
    assert jax.tree.structure(three.params) == jax.tree.structure(one.params)  # the GPT's own layout back
    # the first step's loss differs only in the order of its float32 sums; the second's also through
    # params that differ by ~1e-7 relative (above): a few eps
    np.testing.assert_allclose(hist_three[0]["train_loss"], hist_one[0]["train_loss"],
                               rtol=8 * np.finfo(np.float32).eps)
    start = train.create_train_state(gpt.GPT(CFG), optax.adam(1e-3), jax.random.key(0)).params
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(one.params), jax.tree.leaves(start)))
    assert moved > 1e-3  # the runs trained: equal after moving, not equal by standing still
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL), three.params,
                 one.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL),
                 three.opt_state, one.opt_state)


def test_the_blocks_are_split_over_pipe_and_model_and_back():
    m = pm.mesh(data=2, model=2, pipe=2)
    assert dict(m.shape) == {"data": 2, "fsdp": 1, "model": 2, "pipe": 2}
    state = jax.eval_shape(lambda: train.create_train_state(gpt.GPT(CFG), optax.adam(1e-3), jax.random.key(0)))
    piped = jax.eval_shape(pm.to_pipeline, state)
    rest, blocks = piped.params
    assert blocks["mlp"]["c_fc"]["weight"].shape == (CFG.n_layer, 4 * CFG.n_embd, CFG.n_embd)
    shard = pm._shardings(piped, m, "split")
    assert shard.params[1]["mlp"]["c_fc"]["weight"].spec == P("pipe", "model", None)  # column-parallel
    assert shard.params[1]["attn"]["c_proj"]["weight"].spec == P("pipe", None, "model")  # row-parallel
    assert shard.params[0]["transformer"]["wte"]["weight"].spec == P("model", None)  # vocab split
    mu = shard.opt_state[0].mu  # Adam's state placed as the params
    assert mu[1]["mlp"]["c_fc"]["weight"].spec == P("pipe", "model", None)
    back = jax.eval_shape(lambda s: pm.from_pipeline(pm.to_pipeline(s), s.params), state)
    assert jax.tree.structure(back) == jax.tree.structure(state)


def test_pipe_strategy_refusals_name_the_fix():
    with pytest.raises(ValueError, match="is not the model's GPTConfig.*leave config out"):
        _fit(strategy=Strategy("pipe", pipeline=2, config=CFG._replace(n_layer=4)), devices=8)
    with pytest.raises(ValueError, match="= 12 must divide the 8 devices"):
        _fit(strategy=Strategy("pipe", pipeline=2, tensor_parallel=2, fsdp=3, config=CFG), devices=8)
    with pytest.raises(ValueError, match="leave loss_fn out"):
        _fit(strategy=Strategy("pipe", pipeline=2, config=CFG), devices=8, loss_fn=lambda o, y: 0.0)
    with pytest.raises(ValueError, match="strategy 'tp' takes no pipeline, config"):
        _fit(strategy=Strategy("tp", pipeline=2, config=CFG), devices=8)
    with pytest.raises(ValueError, match="devices, but 8 exist"):
        pm.mesh(data=2, model=2, pipe=4)


_FOUR_AXES = """
import jax, numpy as np, optax
from funcnet import gpt, train
from funcnet.parallel.strategy import Strategy
cfg = gpt.GPTConfig(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, qkv_groups=2)
rng = np.random.default_rng(3)
xy = tuple(rng.integers(0, 32, size=(32, 8)).astype(np.int32) for _ in range(2))
def fit(**kw):
    return train.fit(gpt.GPT(cfg), optax.adam(1e-3), xy, epochs=1, batch_size=16, key=jax.random.key(0),
                     progress=False, **kw)[0]
one = fit()
four = fit(strategy=Strategy("pipe", pipeline=2, tensor_parallel=2, fsdp=2, config=cfg), devices=16)
assert int(four.step) == 2
jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5),
             four.params, one.params)
print("equal")
"""


@pytest.mark.slow
def test_fit_on_all_four_axes_equals_one_device():
    # data 2 x fsdp 2 x model 2 x pipe 2: 16 devices, more than this process simulates, so in a child
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=16", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", _FOUR_AXES], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "equal", done.stderr[-3000:]
