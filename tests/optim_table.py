"""The optimizer/scheduler table: torch's training loop beside its ``convert_optimizer`` twin.

Run as a script (``JAX_ENABLE_X64=1 python tests/optim_table.py``), it trains a small MLP for
100 steps in float64 with each torch optimizer (and scheduler) of ``CASES`` and with the
converted optax transform, each side taking the gradient of the same loss with its own
autodiff, and prints one JSON line ``{case: max relative error of the parameters}``.
tests/test_interop_optim.py runs it once, in its own process (float64 needs x64 before JAX
starts), and checks every row.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

STEPS = 100
O, L = "torch.optim", "torch.optim.lr_scheduler"
# id: (optimizer from P, the model's parameters (or groups from M, the model), scheduler from OPT or None, options)
CASES = {
    "SGD": (f"{O}.SGD(P, lr=0.05)", None, {}),
    "SGD-momentum": (f"{O}.SGD(P, lr=0.05, momentum=0.9)", None, {}),
    "SGD-dampening-wd": (f"{O}.SGD(P, lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)", None, {}),
    "SGD-nesterov-maximize": (f"{O}.SGD(P, lr=0.002, momentum=0.8, nesterov=True, maximize=True)", None, {}),
    "Adam": (f"{O}.Adam(P, lr=0.01)", None, {}),
    "Adam-amsgrad-wd": (f"{O}.Adam(P, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)", None, {}),
    "Adam-maximize-eps": (f"{O}.Adam(P, lr=torch.tensor(0.01), eps=1e-3, maximize=True)", None, {}),
    "AdamW": (f"{O}.AdamW(P, lr=0.01)", None, {}),
    "AdamW-amsgrad": (f"{O}.AdamW(P, lr=0.01, weight_decay=0.3, amsgrad=True)", None, {}),
    "RMSprop": (f"{O}.RMSprop(P, lr=0.005)", None, {}),
    "RMSprop-centered-momentum-wd": (f"{O}.RMSprop(P, lr=0.002, alpha=0.95, eps=1e-3, centered=True, momentum=0.5, "
                                     f"weight_decay=0.01)", None, {}),
    "RMSprop-momentum-maximize": (f"{O}.RMSprop(P, lr=0.002, momentum=0.5, maximize=True)", None, {}),
    "Adagrad": (f"{O}.Adagrad(P, lr=0.05)", None, {}),
    "Adagrad-decay-acc-wd": (f"{O}.Adagrad(P, lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-6, "
                             f"weight_decay=0.01)", None, {}),
    "Adadelta": (f"{O}.Adadelta(P)", None, {}),
    "Adadelta-rho-wd": (f"{O}.Adadelta(P, lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.01)", None, {}),
    "Adamax": (f"{O}.Adamax(P)", None, {}),
    "Adamax-wd-maximize": (f"{O}.Adamax(P, lr=0.01, betas=(0.8, 0.95), weight_decay=0.01, maximize=True)", None, {}),
    "NAdam": (f"{O}.NAdam(P)", None, {}),
    "NAdam-wd": (f"{O}.NAdam(P, lr=0.005, momentum_decay=0.01, weight_decay=0.01)", None, {}),
    "NAdam-decoupled": (f"{O}.NAdam(P, lr=0.005, weight_decay=0.1, decoupled_weight_decay=True)", None, {}),
    # schedulers
    "StepLR": (f"{O}.SGD(P, lr=0.05, momentum=0.9)", f"{L}.StepLR(OPT, step_size=15, gamma=0.5)", {}),
    "MultiStepLR": (f"{O}.Adam(P, lr=0.01)", f"{L}.MultiStepLR(OPT, milestones=[10, 40, 40, 70], gamma=0.5)", {}),
    "ExponentialLR": (f"{O}.RMSprop(P, lr=0.005, momentum=0.5)", f"{L}.ExponentialLR(OPT, gamma=0.97)", {}),
    "CosineAnnealingLR": (f"{O}.AdamW(P, lr=0.01)", f"{L}.CosineAnnealingLR(OPT, T_max=30, eta_min=1e-4)", {}),
    "LinearLR": (f"{O}.SGD(P, lr=0.05)", f"{L}.LinearLR(OPT, start_factor=0.1, total_iters=40)", {}),
    "OneCycleLR-cos-Adam": (f"{O}.Adam(P, lr=0.01)", f"{L}.OneCycleLR(OPT, max_lr=0.02, total_steps=100)", {}),
    "OneCycleLR-linear-3phase-SGD": (f"{O}.SGD(P, lr=0.01, momentum=0.9, nesterov=True)",
                                     f"{L}.OneCycleLR(OPT, max_lr=0.1, total_steps=110, anneal_strategy='linear', "
                                     f"three_phase=True)", {}),
    "OneCycleLR-no-momentum-NAdam": (f"{O}.NAdam(P, lr=0.01)", f"{L}.OneCycleLR(OPT, max_lr=0.01, epochs=10, "
                                     f"steps_per_epoch=10, pct_start=0.25, cycle_momentum=False)", {}),
    "SequentialLR": (f"{O}.SGD(P, lr=0.05, momentum=0.9)",
                     f"{L}.SequentialLR(OPT, [{L}.LinearLR(OPT, start_factor=0.2, total_iters=10), "
                     f"{L}.CosineAnnealingLR(OPT, T_max=50), {L}.ExponentialLR(OPT, gamma=0.98)], milestones=[10, 60])",
                     {}),
    "LambdaLR": (f"{O}.Adam(P, lr=0.01)", f"{L}.LambdaLR(OPT, lambda t: 0.5 ** (t // 20) / (1 + 0.01 * t))", {}),
    "StepLR-per-epoch": (f"{O}.Adam(P, lr=0.01)", f"{L}.StepLR(OPT, step_size=3, gamma=0.7)",
                         {"step_scheduler": "epoch", "steps_per_epoch": 7}),
    "ExponentialLR-resumed": (f"{O}.SGD(P, lr=0.05)", f"{L}.ExponentialLR(OPT, gamma=0.97)", {"resume": 12}),
    # param groups, matched by torch's names
    "groups-SGD-lr-wd": (f"{O}.SGD([{{'params': M[0].parameters(), 'lr': 0.1, 'weight_decay': 0.05}}, "
                         f"{{'params': M[2].parameters()}}], lr=0.02, momentum=0.9)", None, {"module": True}),
    "groups-AdamW-OneCycleLR": (f"{O}.AdamW([{{'params': [M[0].weight, M[2].weight], 'weight_decay': 0.1}}, "
                                f"{{'params': [M[0].bias, M[2].bias], 'weight_decay': 0.0, 'betas': (0.7, 0.9)}}])",
                                f"{L}.OneCycleLR(OPT, max_lr=[0.02, 0.05], total_steps=100)", {"module": True}),
    "groups-partial-and-frozen": (f"{O}.Adam([{{'params': [M[2].weight, M[2].bias]}}, {{'params': [M[0].bias], "
                                  f"'lr': 0.05}}], lr=0.01)", None, {"module": True, "freeze": "0.bias"}),
}


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(dtype)


def _data(dtype=np.float64):
    rng = np.random.default_rng(0)
    return rng.standard_normal((16, 3)).astype(dtype), rng.standard_normal((16, 2)).astype(dtype)


def _torch_run(case, scale=1.0, dtype=torch.float64, steps=STEPS):
    """torch's parameters after ``steps`` steps, from the initial ones times ``scale``, and
    ``(params, transform)`` converted before the first step."""
    make_opt, make_sched, options = CASES[case]
    x, y = (torch.from_numpy(a) for a in _data(str(dtype).removeprefix("torch.")))
    model = _model(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    if options.get("freeze"):
        model.get_parameter(options["freeze"]).requires_grad_(False)
    opt = eval(make_opt, {"torch": torch, "P": model.parameters(), "M": model})  # the table's own text
    sched = eval(make_sched, {"torch": torch, "OPT": opt}) if make_sched else None
    for _ in range(options.get("resume", 0)):
        sched.step()  # a scheduler restored at a later epoch (its optimizer is fresh)
    converted = _convert(case, model, opt, sched)  # before torch's first step, from the same values
    per_epoch = options.get("steps_per_epoch", 1)
    for step in range(steps):
        opt.zero_grad()
        torch.mean((model(x) - y) ** 2).backward()
        opt.step()
        if sched is not None and (step + 1) % per_epoch == 0:
            sched.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}, converted


def _convert(case, model, opt, sched):
    from funcnet import interop

    options = CASES[case][2]
    params = interop.from_torch(model)
    kwargs = {k: options[k] for k in ("step_scheduler", "steps_per_epoch") if k in options}
    return params, interop.convert_optimizer(opt, sched, params, module=model if options.get("module") else None,
                                             **kwargs)


def _jax_run(params, tx, steps=STEPS):
    import jax
    import jax.numpy as jnp
    import optax

    x, y = _data(params["0"]["weight"].dtype)

    def loss(p):
        h = jnp.tanh(x @ p["0"]["weight"].T + p["0"]["bias"])
        return jnp.mean((h @ p["2"]["weight"].T + p["2"]["bias"] - y) ** 2)

    @jax.jit
    def train(p):
        def step(carry, _):
            p, state = carry
            updates, state = tx.update(jax.grad(loss)(p), state, p)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(step, (p, tx.init(p)), None, length=steps)[0][0]

    trained = train(params)
    return {f"{a}.{b}": np.asarray(v) for a, layer in trained.items() for b, v in layer.items()}


def _error(a, b):
    return max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in b)


def run_case(case, dtype=torch.float64, steps=STEPS):
    """``(error, floor, moved)``: the converted transform's relative error against torch;
    torch's own spread when its initial parameters move by about one rounding (1e-15 in
    float64, 1e-7 in float32), which shows how much this row's trajectory amplifies rounding;
    how far torch moved the parameters."""
    start = {k: v.detach().numpy().copy() for k, v in _model(dtype).state_dict().items()}
    want, (params, tx) = _torch_run(case, dtype=dtype, steps=steps)
    got = _jax_run(params, tx, steps)
    assert all(v.dtype == want[k].dtype for k, v in got.items())
    floor = _error(_torch_run(case, 1 + (1e-15 if dtype == torch.float64 else 1e-7), dtype, steps)[0], want)
    moved = max(float(np.max(np.abs(want[k] - start[k]))) for k in want)
    return _error(got, want), floor, moved


CONVERTED = "interop.convert model + AdamW + OneCycleLR, 50 steps"


def run_converted_model(steps=50):
    """A torch model through ``interop.convert`` and its optimizer through
    ``convert_optimizer``, trained beside torch: ``(error, floor, moved)`` as ``run_case``."""
    import jax
    import jax.numpy as jnp
    import optax

    import funcnet
    from funcnet import interop, nn

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 6)), rng.standard_normal((16, 3))

    def torch_run(scale):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(),
                                  torch.nn.Linear(8, 3)).double()
        with torch.no_grad():
            for p in net.parameters():
                p.mul_(scale)
        opt = torch.optim.AdamW([{"params": [net[0].weight, net[3].weight]},
                                 {"params": [net[0].bias, net[1].weight, net[1].bias, net[3].bias],
                                  "weight_decay": 0.0}], lr=1e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=steps)
        model, params, state = interop.convert(net)
        tx = interop.convert_optimizer(opt, sched, params, module=net)
        start = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
        for _ in range(steps):
            opt.zero_grad()
            torch.mean((net(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).backward()
            opt.step()
            sched.step()
        return {k: v.detach().numpy() for k, v in net.state_dict().items()}, start, (model, params, state, tx)

    want, start, (model, params, state, tx) = torch_run(1.0)

    def loss(p):
        out, _ = nn.call(model, p, state, jnp.asarray(x), train=True)
        return jnp.mean((out - y) ** 2)

    @jax.jit
    def train(p):
        def step(carry, _):
            p, opt_state = carry
            updates, opt_state = tx.update(jax.grad(loss)(p), opt_state, p)
            return (optax.apply_updates(p, updates), opt_state), None

        return jax.lax.scan(step, (p, tx.init(p)), None, length=steps)[0][0]

    got = {k: np.asarray(v) for k, v in funcnet.state_dict(train(params), {}, model=model).items()}
    floor = _error(torch_run(1 + 1e-15)[0], want)
    return _error(got, want), floor, max(float(np.max(np.abs(want[k] - start[k]))) for k in want)


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)  # torch keeps NAdam's mu_product in the default dtype
    torch.set_num_threads(1)
    results = {case: run_case(case) for case in (sys.argv[1:] or CASES)}
    if not sys.argv[1:]:
        results[CONVERTED] = run_converted_model()
    print(json.dumps(results))
