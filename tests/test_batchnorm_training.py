"""BatchNorm through the training loop, against torch from the same weights and batches.

Linear-BatchNorm1d-ReLU-Linear on the bundled digits data, SGD with momentum 0.9 (optax.sgd vs
torch.optim.SGD), funcnet.train.make_step vs torch's zero_grad/backward/step loop:

- 50 steps: params, running statistics, num_batches_tracked and eval-mode logits equal torch's
  (float32 to 2e-5 relative + 2e-6 absolute: 50 steps of one-ulp differences between two
  kernels, carried by the momentum; float64 to 1e-10);
- evaluate(state=) uses the running statistics and never updates them;
- accum_steps=2 advances the running statistics once per micro-batch, as two torch forwards;
- an fp16 step whose scaled gradients overflow is skipped for params and optimizer, while the
  running statistics advance, as torch's GradScaler skips optimizer.step() after the forward
  has updated the buffers;
- SyncBatchNorm under make_step(axis_name=) (pmap) and make_shard_map_step on 4 devices equals
  torch's BatchNorm1d on the global batch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import funcnet
from funcnet import nn, train
from funcnet.precision import DynamicLossScale

LR = 0.05
# float32: 50 steps of one-ulp kernel differences (oneDNN vs XLA) carried by the momentum; seen
# up to 7e-7 absolute on params and running statistics and 3e-6 on logits of size ~10.
TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


@pytest.fixture(scope="module")
def digits():
    return funcnet.data.load("digits")


def models(dtype: str):
    """The torch net (seeded) and the funcnet net with torch's weights and buffers loaded."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 10)).to(getattr(torch, dtype))
    jdt = getattr(jnp, dtype)
    ours = nn.Sequential(nn.Linear(64, 32, dtype=jdt), nn.BatchNorm1d(32, dtype=jdt), nn.ReLU(),
                         nn.Linear(32, 10, dtype=jdt))
    params, state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(),
                                            state=ours.init_state())
    return theirs, ours, params, state


def assert_same(ts, theirs, tol, what=""):
    ours = funcnet.state_dict(ts.params, ts.model_state)
    sd = theirs.state_dict()
    assert sorted(ours) == sorted(sd)
    for k, v in sd.items():
        if k.endswith("num_batches_tracked"):
            assert int(ours[k]) == int(v), f"{what}{k}: {int(ours[k])} vs torch {int(v)}"
        else:
            np.testing.assert_allclose(np.asarray(ours[k]), v.numpy(), err_msg=f"{what}{k}", **tol)


def _train_50_steps(digits, dtype):
    (x, y), (x_test, y_test) = digits
    x, x_test = x.astype(dtype), x_test.astype(dtype)
    theirs, ours, params, state = models(dtype)
    tx = optax.sgd(LR, momentum=0.9)
    ts = train.create_train_state(ours, tx, jax.random.key(1), params=params, model_state=state)
    step = train.make_step(ours, tx, funcnet.losses.cross_entropy)
    opt = torch.optim.SGD(theirs.parameters(), lr=LR, momentum=0.9)
    theirs.train()
    batch = 24
    for i in range(50):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        ts, _ = step(ts, (jnp.asarray(xb), jnp.asarray(yb)))
        opt.zero_grad()
        F.cross_entropy(theirs(torch.from_numpy(xb)), torch.from_numpy(yb).long()).backward()
        opt.step()
    tol = TOL[dtype]
    assert_same(ts, theirs, tol)
    assert int(ts.model_state["1"]["num_batches_tracked"]) == 50
    # the statistics moved far from their initial (0, 1): the comparison above is not vacuous
    assert np.abs(np.asarray(ts.model_state["1"]["running_mean"])).max() > 0.1
    logits, same = ours.apply(ts.params, jnp.asarray(x_test), state=ts.model_state, train=False)
    theirs.eval()
    with torch.no_grad():
        t_logits = theirs(torch.from_numpy(x_test)).numpy()
    np.testing.assert_allclose(logits, t_logits, **tol)
    jax.tree.map(np.testing.assert_array_equal, same, ts.model_state)  # eval mode: state unchanged


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_50_sgd_momentum_steps_equal_torch(digits, dtype):
    if dtype == "float64":
        with jax.enable_x64(True):
            _train_50_steps(digits, dtype)
    else:
        _train_50_steps(digits, dtype)


def test_evaluate_uses_running_stats_and_never_updates_them(digits):
    _, (x_test, y_test) = digits
    theirs, ours, params, state = models("float32")
    # non-trivial running statistics: a few torch train-mode forwards on shifted data
    with torch.no_grad():
        for i in range(3):
            theirs.train()(torch.from_numpy(x_test[i * 40:(i + 1) * 40] * 2.0 + 0.3))
    params, state = funcnet.load_state_dict(params, theirs.state_dict(), state=state)
    before = jax.tree.map(np.array, state)
    theirs.eval()
    with torch.no_grad():
        t_logits = theirs(torch.from_numpy(x_test))
    t_loss = F.cross_entropy(t_logits, torch.from_numpy(y_test).long()).item()
    t_acc = (t_logits.argmax(-1).numpy() == y_test).mean()
    scores = train.evaluate(ours, params, x_test, y_test, state=state, batch_size=100)
    assert scores["loss"] == pytest.approx(t_loss, rel=1e-5)
    assert scores["accuracy"] == pytest.approx(t_acc, abs=1e-9)
    jax.tree.map(np.testing.assert_array_equal, state, before)
    assert int(state["1"]["num_batches_tracked"]) == 3
    # the running statistics matter: with the initial ones (0, 1) the loss is torch's after reset
    theirs[1].reset_running_stats()
    with torch.no_grad():
        t_reset = F.cross_entropy(theirs(torch.from_numpy(x_test)), torch.from_numpy(y_test).long()).item()
    reset = train.evaluate(ours, params, x_test, y_test, state=ours.init_state())["loss"]
    assert reset == pytest.approx(t_reset, rel=1e-5) and abs(reset - t_loss) > 1e-3
    with pytest.raises(ValueError, match="pass state=train_state.model_state"):
        train.evaluate(ours, params, x_test, y_test)


def test_gradient_accumulation_advances_running_stats_per_micro_batch(digits):
    (x, y), _ = digits
    theirs, ours, params, state = models("float32")
    tx = optax.sgd(LR, momentum=0.9)
    ts = train.create_train_state(ours, tx, jax.random.key(1), params=params, model_state=state)
    step = train.make_step(ours, tx, funcnet.losses.cross_entropy, accum_steps=2)
    opt = torch.optim.SGD(theirs.parameters(), lr=LR, momentum=0.9)
    batch = 16
    for i in range(3):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        ts, _ = step(ts, (jnp.asarray(xb), jnp.asarray(yb)))
        opt.zero_grad()
        for half in (slice(0, batch // 2), slice(batch // 2, batch)):  # two forwards, one step
            loss = F.cross_entropy(theirs(torch.from_numpy(xb[half])), torch.from_numpy(yb[half]).long())
            (loss / 2).backward()
        opt.step()
    assert_same(ts, theirs, TOL["float32"])
    assert int(ts.model_state["1"]["num_batches_tracked"]) == 6
    # one forward on the whole batch would give other statistics: the test can tell them apart
    one = models("float32")[0].train()
    with torch.no_grad():
        one(torch.from_numpy(x[:batch]))
    assert not np.allclose(one[1].running_var.numpy(),
                           funcnet.state_dict(models("float32")[2], ts.model_state)["1.running_var"], rtol=1e-3)


def test_skipped_fp16_step_still_advances_running_stats(digits):
    """torch: autocast(float16) forward (BatchNorm updates its float32 buffers from the fp16
    activations), GradScaler finds inf gradients at scale 2**40 and skips optimizer.step()."""
    (x, y), _ = digits
    theirs, ours, params, state = models("float32")
    xb, yb = x[:32], y[:32]
    tx = optax.sgd(LR, momentum=0.9)
    ts = train.create_train_state(ours, tx, jax.random.key(1), params=params, model_state=state,
                                  loss_scale=DynamicLossScale(init_scale=2.0**40))
    params_before = jax.tree.map(np.array, ts.params)
    step = train.make_step(ours, tx, funcnet.losses.cross_entropy, policy="fp16")
    ts, metrics = step(ts, (jnp.asarray(xb), jnp.asarray(yb)))

    opt = torch.optim.SGD(theirs.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    with torch.autocast("cpu", dtype=torch.float16):
        out = theirs(torch.from_numpy(xb))
    loss = F.cross_entropy(out.float(), torch.from_numpy(yb).long())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()

    assert not bool(metrics["grads_finite"])
    assert float(ts.loss_scale.loss_scale) == scaler.get_scale() == 2.0**39
    jax.tree.map(np.testing.assert_array_equal, ts.params, params_before)  # params untouched, exactly
    assert not opt.state  # torch never stepped: no momentum buffers
    assert not any(np.asarray(leaf).any() for leaf in jax.tree.leaves(ts.opt_state))  # nor optax's trace
    ms = ts.model_state["1"]
    assert int(ms["num_batches_tracked"]) == int(theirs[1].num_batches_tracked) == 1
    assert ms["running_mean"].dtype == ms["running_var"].dtype == jnp.float32
    # float16 Linear outputs from two kernels differ by up to an fp16 rounding (2**-11 relative);
    # their batch means agree to ~1e-5 absolute
    for k in ("running_mean", "running_var"):
        np.testing.assert_allclose(ms[k], getattr(theirs[1], k).numpy(), rtol=1e-3, atol=5e-5, err_msg=k)
    assert np.abs(np.asarray(ms["running_var"]) - 1.0).max() > 1e-2  # moved: not the initial state


@pytest.mark.parametrize("kind", ["shard_map", "pmap"])
def test_sync_batchnorm_data_parallel_equals_torch_on_the_global_batch(digits, kind):
    """4 devices with 8 examples each, SyncBatchNorm: params and running statistics after 3 steps
    equal torch's single-process BatchNorm1d on the 32-example batch (what torch's SyncBatchNorm
    under DDP computes)."""
    (x, y), _ = digits
    theirs, _, _, _ = models("float32")
    ours = nn.Sequential(nn.Linear(64, 32), nn.SyncBatchNorm(32, axis_name="data"), nn.ReLU(), nn.Linear(32, 10))
    params, state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(),
                                            state=ours.init_state())
    tx = optax.sgd(LR, momentum=0.9)
    ts = train.create_train_state(ours, tx, jax.random.key(1), params=params, model_state=state)
    if kind == "pmap":
        step = train.make_step(ours, tx, funcnet.losses.cross_entropy, axis_name="data")
        devices = jax.local_devices()[:4]
        ts = funcnet.parallel.replicate(ts, devices)
        place = lambda b: funcnet.parallel.shard(b, 4)  # noqa: E731
    else:
        mesh = funcnet.parallel.data_mesh(4)
        step = funcnet.parallel.make_shard_map_step(ours, tx, funcnet.losses.cross_entropy, mesh)
        place = lambda b: b  # noqa: E731
    opt = torch.optim.SGD(theirs.parameters(), lr=LR, momentum=0.9)
    batch = 32
    for i in range(3):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        ts, _ = step(ts, place((jnp.asarray(xb), jnp.asarray(yb))))
        opt.zero_grad()
        F.cross_entropy(theirs(torch.from_numpy(xb)), torch.from_numpy(yb).long()).backward()
        opt.step()
    if kind == "pmap":
        ts = funcnet.parallel.unreplicate(ts)
    assert_same(ts, theirs, TOL["float32"])
