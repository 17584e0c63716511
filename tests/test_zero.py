"""funcnet.parallel.zero: ZeRO-1/2 in fit equal to plain data parallelism, their compiled per-device bytes
against the planner (funcnet.memory.zero_per_device), and the planner's figures against the ZeRO
paper's closed forms.

Oracles: data parallelism with everything replicated (``fit(strategy="sharding")``, itself checked
against torch DDP), the arrays' own byte counts, and the paper's formulas (2 + 2 + K)Psi etc.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import memory, nn, train
from funcnet.parallel import fsdp, zero

# (37, 60): no axis divides 8 devices, so the optimizer state is split padded (60 -> 64), as FSDP2 pads
MODEL = nn.Sequential(nn.Linear(60, 37), nn.ReLU(), nn.Linear(37, 16))
STEPS_PER_EPOCH, EPOCHS, LR = 4, 2, 1e-2


def _xy(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((STEPS_PER_EPOCH * 16, 60)).astype(dtype)
    y = rng.integers(0, 16, STEPS_PER_EPOCH * 16).astype(np.int32)
    return x, y


def _fit(xy, strategy):
    state, history = train.fit(MODEL, optax.adam(LR), xy, epochs=EPOCHS, batch_size=16, key=jax.random.key(0),
                               strategy=strategy, devices=8, progress=False)
    return state, [r["train_loss"] for r in history]


@pytest.mark.parametrize("dtype, eps", [(np.float32, np.finfo(np.float32).eps), (np.float64, np.finfo(np.float64).eps)])
def test_zero1_and_zero2_in_fit_equal_plain_data_parallel(dtype, eps):
    with jax.enable_x64(dtype == np.float64):
        xy = _xy(dtype)
        ddp, ddp_losses = _fit(xy, "sharding")
        steps = STEPS_PER_EPOCH * EPOCHS
        # Adam moves a parameter by at most ~lr a step; each step's update may differ by the rounding of a
        # gradient summed over the 16-sample batch (16 eps relative), so after `steps` steps by lr * steps * 16 eps
        atol = LR * steps * 16 * eps
        for name in ("zero1", "zero2"):
            state, losses = _fit(xy, name)
            opt = jax.tree.leaves(state.opt_state)
            assert all(a.dtype == jnp.dtype(dtype) for a in opt if a.ndim), name
            np.testing.assert_allclose(losses, ddp_losses, rtol=16 * eps * 10, err_msg=name)
            for got, want in zip(jax.tree.leaves((state.params, state.opt_state)),
                                 jax.tree.leaves((ddp.params, ddp.opt_state))):
                assert got.shape == want.shape, name  # fit hands back the true shapes, padding sliced off
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol, err_msg=name)


def _compiled(stage, n, min_size=0):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    tx = optax.adam(LR)
    state = jax.eval_shape(lambda: train.create_train_state(model, tx, jax.random.key(0)))
    batch = (jax.ShapeDtypeStruct((16, 64), jnp.float32), jax.ShapeDtypeStruct((16,), jnp.int32))
    if stage == 0:
        step = fsdp.make_fsdp_step(model, tx, mesh=fsdp.mesh(n), state=state, zero=0, min_size=min_size)
    else:
        step = zero.make_zero_step(model, tx, mesh=fsdp.mesh(n), stage=stage, state=state, min_size=min_size)
    lowered = step.lower(state, batch)
    return state, batch, lowered, memory.compile_to_read(lowered)


@pytest.mark.parametrize("stage", [1, 2])
def test_compiled_state_bytes_per_device_are_the_planners(stage):
    """The planner's params + optimizer state per device (fp32 Adam, no master copy) against XLA's
    argument bytes of the compiled step, less the batch slice and the step counter and key."""
    n = 8
    state, batch, _, compiled = _compiled(stage, n)
    n_params = sum(a.size for a in jax.tree.leaves(state.params))
    plan = memory.zero_per_device(memory.estimate(n_params, "adam"), stage, n)
    scalars = memory.tree_bytes((state.step, state.key)) + sum(a.size * a.dtype.itemsize
                                                               for a in jax.tree.leaves(state.opt_state) if not a.ndim)
    measured = compiled.memory_analysis().argument_size_in_bytes - memory.tree_bytes(batch) // n - scalars
    assert measured == plan.params + plan.optimizer, (measured, plan)
    whole = memory.zero_per_device(memory.estimate(n_params, "adam"), 0, n)
    _, _, _, replicated = _compiled(0, n)
    saved = replicated.memory_analysis().argument_size_in_bytes - compiled.memory_analysis().argument_size_in_bytes
    assert saved == whole.total - plan.total + (plan.grads - whole.grads)  # the state's share; grads are temps


def test_zero2_constrains_the_gradients_the_optimizer_receives():
    # the same collectives may come out (XLA:CPU all-reduces and slices where GPU/TPU reduce-scatter), but
    # stage 2's program holds one sharding constraint per gradient more than stage 1's
    n_params = len(jax.tree.leaves(_compiled(1, 8)[0].params))
    texts = {s: _compiled(s, 8)[2].as_text() for s in (1, 2)}
    counts = {s: t.count("sharding_constraint") for s, t in texts.items()}
    assert counts[2] - counts[1] == n_params, counts


def test_bad_stage_and_missing_state_are_named():
    with pytest.raises(ValueError, match=r"stage must be 1 .* or 2 .*got 3; ZeRO-3 .*make_fsdp_step\(zero=3\)"):
        zero.make_zero_step(MODEL, optax.adam(LR), stage=3, state=object())
    with pytest.raises(ValueError, match="needs state="):
        zero.make_zero_step(MODEL, optax.adam(LR), stage=2)
    with pytest.raises(ValueError, match=r"ZeRO stage must be one of \(0, 1, 2, 3\).*got 4"):
        memory.zero_per_device(memory.estimate("1B"), 4, 8)
    with pytest.raises(ValueError, match="dp must be a positive int.*got 0"):
        memory.zero_per_device(memory.estimate("1B"), 1, 0)


def test_the_zero_papers_first_figure():
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, mixed-precision Adam (K = 12), Nd = 64
    psi, k, nd = 7.5e9, 12, 64
    est = memory.estimate("7.5B", "adam", **memory.PRECISIONS["bf16"])
    paper = {0: (2 + 2 + k) * psi, 1: 2 * psi + 2 * psi + k * psi / nd, 2: 2 * psi + (2 + k) * psi / nd,
             3: (2 + 2 + k) * psi / nd}
    for stage, want in paper.items():
        assert memory.zero_per_device(est, stage, nd).total == pytest.approx(want, rel=1e-12), stage
    assert [round(paper[s] / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]


def test_a_model_with_nothing_to_split_is_refused_in_one_line():
    # every array under fsdp.MIN_SIZE stays whole: fsdp or zero would be data parallelism under another name
    tiny = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = np.zeros((16, 8), np.float32), np.zeros(16, np.int32)
    for name in ("fsdp", "zero1", "zero2"):
        with pytest.raises(ValueError, match=rf"strategy='{name}': every array of this model is smaller than 1024 "
                                             r"entries \(the largest, 0\.weight, has shape \(16, 8\)\).*shard_map") as e:
            train.fit(tiny, optax.adam(LR), (x, y), epochs=1, batch_size=16, key=jax.random.key(0), strategy=name,
                      devices=2, progress=False)
        assert "\n" not in str(e.value)
