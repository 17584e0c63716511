"""``interop.convert_optimizer`` against torch.optim: the float64 table, param groups by name, refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from funcnet import interop, nn
from tests.optim_table import CASES, CONVERTED

TABLE = Path(__file__).with_name("optim_table.py")


@pytest.fixture(scope="module")
def table():
    # float64 needs x64 before JAX starts: the whole table runs in one process of its own
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu",
           # XLA's LLVM passes cost most of the table's time (36 small programs); -O0 halves it
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip(),
           "PYTHONPATH": os.pathsep.join([str(TABLE.parent.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(TABLE)], check=False, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_table_matches_torch_over_100_float64_steps(table, case):
    error, floor, moved = table[case]
    assert moved > 0.05, f"{case}: torch moved the parameters by only {moved}; the row tests nothing"
    # the row is well conditioned: torch itself, started 1e-15 away, ends within 1e-13
    assert floor < 1e-13, f"{case}: torch's own spread is {floor:.1e}; pick hyperparameters that do not amplify rounding"
    assert error < 1e-12, f"{case}: converted optimizer is {error:.1e} (relative) from torch after 100 steps"


def test_a_converted_model_trains_with_its_converted_optimizer_as_torch_does(table):
    # interop.convert's model, AdamW in two groups (no decay on biases and norms), OneCycleLR
    # cycling beta1: 50 float64 steps beside torch's loop
    error, floor, moved = table[CONVERTED]
    assert moved > 0.05 and floor < 1e-13
    assert error < 1e-12, f"converted model and optimizer are {error:.1e} from torch after 50 steps"


def _tied():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    m[2].weight = m[0].weight  # tied: one tensor, two names
    return m


def test_param_groups_by_torch_name_with_a_tied_weight_a_frozen_bias_and_a_left_out_layer():
    m = _tied()
    m[2].bias.requires_grad_(False)
    opt = torch.optim.SGD([{"params": [m[0].weight, m[0].bias], "lr": 0.1, "weight_decay": 0.5},
                           {"params": [m[2].bias], "lr": 0.3}], lr=0.01, momentum=0.9)
    params = interop.from_torch(m)
    assert isinstance(params["2"]["weight"], nn.Tied)
    tx = interop.convert_optimizer(opt, params=params, module=m)
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    state = tx.init(params)
    for _ in range(3):
        for name, p in m.named_parameters():
            parts = name.split(".")
            if p.requires_grad:
                p.grad = torch.from_numpy(np.asarray(grads[parts[0]][parts[1]]).copy())
        opt.step()
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    before = interop.from_torch(_tied())
    for name, want in m.state_dict().items():
        a, b = name.split(".")
        if isinstance(params[a][b], nn.Tied):
            continue
        np.testing.assert_allclose(np.asarray(params[a][b]), want.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    # the frozen bias and the layer in no group stay as they were, as torch leaves them
    np.testing.assert_array_equal(params["2"]["bias"], before["2"]["bias"])
    np.testing.assert_array_equal(params["3"]["weight"], before["3"]["weight"])
    assert not np.array_equal(params["0"]["weight"], before["0"]["weight"])


def test_a_single_group_needs_no_module_and_defaults_are_torchs():
    m = _tied()
    opt = torch.optim.AdamW(m.parameters())  # torch's weight decay 0.01, optax.adamw's 1e-4
    params = interop.from_torch(m)
    tx = interop.convert_optimizer(opt, params=params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    w = params["0"]["weight"]
    # first AdamW step: -lr * (sign(g) + wd * w) with m_hat/sqrt(v_hat) = 1 (up to eps)
    np.testing.assert_allclose(updates["0"]["weight"], -1e-3 * (1 / (1 + 1e-8) + 0.01 * w), rtol=1e-6)


def _refusal(match, *args, **kwargs):
    with pytest.raises((ValueError, TypeError), match=match):
        interop.convert_optimizer(*args, **kwargs)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))


def test_refuses_unsupported_optimizers_and_a_stepped_one():
    m = _net()
    _refusal(r"torch\.optim\.radam\.RAdam is not supported; supported: torch\.optim SGD, Adam, AdamW",
             torch.optim.RAdam(m.parameters()))

    class MyAdam(torch.optim.Adam):
        pass

    _refusal(r"MyAdam is not supported", MyAdam(m.parameters()))
    _refusal(r"expected a torch\.optim optimizer, got dict", {"lr": 0.1})
    _refusal(r"param_groups\[0\] holds a complex parameter \(torch\.complex64, shape \(2,\)\).*two real parameters",
             torch.optim.Adam([torch.nn.Parameter(torch.ones(2, dtype=torch.complex64))]))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    _refusal(r"SGD has already taken steps \(4 parameters have optimizer state.*convert the optimizer before its "
             r"first step\(\)", opt)


def test_refuses_schedulers_it_cannot_follow():
    m = _net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    S = torch.optim.lr_scheduler
    _refusal(r"scheduler CosineAnnealingWarmRestarts is not supported; supported: StepLR, MultiStepLR",
             opt, S.CosineAnnealingWarmRestarts(opt, T_0=5))
    other = torch.optim.SGD(m.parameters(), lr=0.1)
    _refusal(r"drives another optimizer than the one passed", opt, S.StepLR(other, 3))

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    warmup = S.LambdaLR(opt, lambda t: min(1.0, (t + 1) / 10))
    _refusal(r"LambdaLR's lr_lambda for param group 0 \('<lambda>'\) does not run on a traced step count.*"
             r"jnp\.minimum for min", opt, warmup)

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = S.ExponentialLR(opt, gamma=0.5)
    opt.param_groups[0]["lr"] = 0.3
    _refusal(r"param group 0 has lr 0\.3, but ExponentialLR at last_epoch=0 gives 0\.1; the lr was changed outside",
             opt, sched)

    opt = torch.optim.Adam(m.parameters())
    seq = S.SequentialLR(opt, [S.LinearLR(opt), S.OneCycleLR(opt, max_lr=0.1, total_steps=10)], milestones=[5])
    _refusal(r"OneCycleLR with cycle_momentum=True inside SequentialLR is not supported.*cycle_momentum=False",
             opt, seq)


def test_refuses_unclear_stepping_and_groups_without_names():
    m = _net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    _refusal(r"step_scheduler='batch', expected 'step'", opt, sched, step_scheduler="batch")
    _refusal(r"step_scheduler='epoch' needs steps_per_epoch.*got None", opt, sched, step_scheduler="epoch")
    _refusal(r"steps_per_epoch=5 is for step_scheduler='epoch'", opt, sched, steps_per_epoch=5)

    params = interop.from_torch(m)
    two = torch.optim.SGD([{"params": m[0].parameters()}, {"params": m[1].parameters(), "lr": 1.0}], lr=0.1)
    _refusal(r"the SGD has 2 param groups; pass module=", two, params=params)
    part = torch.optim.SGD(m[1].parameters(), lr=0.1)
    _refusal(r"params has 4 arrays but the SGD holds 2 parameters; pass module=", part, params=params)
    _refusal(r"module= must be the torch\.nn\.Module the optimizer was built on, got dict", part, module=params)
    m[1].bias.requires_grad_(False)
    _refusal(r"the SGD holds 1 parameters with requires_grad=False, which torch does not update; pass module=", part)
    m[1].bias.requires_grad_(True)
    _refusal(r"the params tree has '0\.kernel', which is not a parameter name of module= \(Sequential\)",
             part, params={"0": {"kernel": jnp.ones(2)}}, module=m)
    _refusal(r"param_groups\[0\] holds a tensor of shape \(1, 3\) that is not a parameter of module= \(Linear\)",
             part, module=torch.nn.Linear(2, 3))


@pytest.mark.parametrize("case", ["AdamW-amsgrad", "NAdam-wd", "OneCycleLR-cos-Adam"])
def test_float32_stays_within_torchs_own_rounding(case):
    # optax.scale_by_adam's bias correction 1 - b2**t in float32 starts 1.3e-5 off torch's
    # (b2 = 0.999 rounded to float32), which ends 7e-6 from torch after 30 steps; the
    # converted Adam is within torch's own float32 spread (a 1e-7 nudge of the start: ~5e-7)
    from tests.optim_table import run_case

    error, floor, _ = run_case(case, torch.float32, steps=30)
    assert floor < 1e-6, f"{case}: torch's own float32 spread is {floor:.1e}"
    assert error < 2e-6, f"{case}: float32 converted optimizer is {error:.1e} from torch after 30 steps (spread {floor:.1e})"


SCHEDULERS = {
    "ExponentialLR": lambda o, S: S.ExponentialLR(o, gamma=0.997),
    "StepLR": lambda o, S: S.StepLR(o, step_size=7, gamma=0.93),
    "MultiStepLR": lambda o, S: S.MultiStepLR(o, milestones=[50, 120, 120], gamma=0.3),
    "LinearLR": lambda o, S: S.LinearLR(o, start_factor=0.05, end_factor=0.8, total_iters=90),
    "CosineAnnealingLR": lambda o, S: S.CosineAnnealingLR(o, T_max=70, eta_min=0.01),
    "OneCycleLR": lambda o, S: S.OneCycleLR(o, max_lr=[1.0, 0.4], total_steps=1000, pct_start=0.35),
    "OneCycleLR-3phase-linear": lambda o, S: S.OneCycleLR(o, max_lr=1.0, total_steps=1000, three_phase=True,
                                                          anneal_strategy="linear"),
    "SequentialLR": lambda o, S: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=30), S.StepLR(o, 100, 0.5),
                                                    S.CosineAnnealingLR(o, T_max=200)], milestones=[40, 500]),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_float32_schedules_follow_torchs_lr_for_1000_steps(name):
    # torch's own group["lr"] after each scheduler.step() (Python floats) is the oracle; the
    # converted schedule runs in float32 (x64 off) for both param groups
    from funcnet.interop.optim.schedules import schedules

    w, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([{"params": [w]}, {"params": [b], "lr": 0.4}], lr=1.0, momentum=0.9)
    sched = SCHEDULERS[name](opt, torch.optim.lr_scheduler)
    fns = schedules(sched, opt, "step", None)
    counts = jnp.arange(1000)
    got = [np.asarray(jax.jit(jax.vmap(lr))(counts)) for lr, _ in fns]
    want = [[], []]
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        for _ in range(1000):
            for i, group in enumerate(opt.param_groups):
                want[i].append(group["lr"])
            sched.step()
    for i in range(2):
        assert got[i].dtype == np.float32
        # float32's rounding (6e-8) times a few: optax.exponential_decay's gamma**1000 is 2e-5 off
        np.testing.assert_allclose(got[i], np.array(want[i]), rtol=1e-6, atol=1e-7 * max(want[i]), err_msg=name)


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.9), weight_decay=0.1),
    lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.3),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
], ids=["Adam", "AdamW", "SGD-momentum"])
def test_make_step_on_the_converted_state_takes_torchs_steps(make_opt):
    # the port guide's path: convert the module and its optimizer, create_train_state, make_step.
    # The step donates every buffer of the state: Adam's mu and nu once shared their zeros and
    # the first step refused the state ("holds one array twice").
    import funcnet

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    opt = make_opt(net.parameters())
    start = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 8, 4)), rng.standard_normal((5, 8, 3))
    with jax.enable_x64(True):
        model, params, mstate = interop.convert(net)
        tx = interop.convert_optimizer(opt, params=params, module=net)
        leaves = [a for a in jax.tree.leaves(tx.init(params)) if isinstance(a, jax.Array)]
        assert len({id(a) for a in leaves}) == len(leaves), "the optimizer state holds one array twice"
        state = funcnet.create_train_state(model, tx, jax.random.key(0), params=params, model_state=mstate)
        step = funcnet.make_step(model, tx, lambda out, t: jnp.mean((out - t) ** 2))
        for xb, yb in zip(x, y):
            state, _ = step(state, (jnp.asarray(xb), jnp.asarray(yb)))
            opt.zero_grad()
            torch.mean((net(torch.from_numpy(xb)) - torch.from_numpy(yb)) ** 2).backward()
            opt.step()
        got = funcnet.state_dict(state.params, model=model)
    for name, want in net.state_dict().items():
        # float64, 5 steps of updates of size lr: rounding of ~1e-16 per operation, amplified at most by
        # Adam's g / sqrt(v) near g = 0 (relative); 1e-12 leaves 1e3 ulps of room and no more
        np.testing.assert_allclose(np.asarray(got[name]), want.numpy(), rtol=1e-12, atol=1e-13, err_msg=name)
    moved = max(float(np.max(np.abs(v.numpy() - start[k]))) for k, v in net.state_dict().items())
    assert moved > 0.05 and int(state.step) == 5, moved
