"""Mixed precision: torch.autocast + GradScaler vs funcnet's Policy + DynamicLossScale.

torch: the articles' loop (``with autocast(): loss = criterion(model(x), y)``,
``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``, ``scaler.update()``),
here on CPU with bfloat16, the low-precision type CPUs have. JAX: ``make_step`` with
``policy="bf16"`` and a ``DynamicLossScale`` in the ``TrainState``: one compiled
function whose overflow check, skipped update and scale adjustment all stay on device.

Both start from the same float32 weights and see the same digits batches; on a few
chosen steps one input pixel is inf, so the gradients are NaN and both must skip the
update and back the scale off. The scale sequences must be identical, the skipped
steps the same, and the losses equal to within what bfloat16 can resolve.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from torch import nn as tnn

from comparisons._core import Options, Result, Side, close, equal, expect, source, timed
from funcnet import data, interop, nn, train
from funcnet.precision import DynamicLossScale, get_policy

__all__ = ["TITLE", "run"]

TITLE = "Mixed precision: torch.autocast(bfloat16) + GradScaler vs Policy('bf16') + DynamicLossScale"

SIZES = [64, 128, 10]
STEPS, BATCH, LR = 44, 32, 0.4  # 1408 of the 1437 training digits
OVERFLOW_STEPS = (0, 9, 10, 23, 37)  # an inf pixel in the batch: NaN gradients, the step must be skipped
SCALER = dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=4)


# ----------------------------------------------------------------------------- torch
def torch_amp_train(model, batches, lr=LR):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    stepped = []
    optimizer.register_step_post_hook(lambda *_: stepped.append(len(losses) - 1))
    losses, scales = [], []
    for x, y in batches:
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)  # Linear runs in bfloat16, cross_entropy in float32
        scales.append(scaler.get_scale())  # the scale this step uses
        losses.append(loss.detach())
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # skips optimizer.step() if any gradient is inf/NaN
        scaler.update()
    return torch.stack(losses), scales, stepped


# ------------------------------------------------------------------------------- JAX
def jax_amp_train(model, params, xs, ys, key, lr=LR):
    tx = optax.sgd(lr)
    step = train.make_step(model, tx, policy="bf16")
    state = train.create_train_state(model, tx, key, params=params, loss_scale=DynamicLossScale(**SCALER))

    def body(state, batch):
        state, metrics = step.raw(state, batch)
        return state, (metrics, state.params)

    return jax.jit(lambda s: jax.lax.scan(body, s, (xs, ys)))(state)


# ------------------------------------------------------------------------------- run
def _batches():
    (x, y), _ = data.load("digits")
    xs = np.asarray(x[: STEPS * BATCH], np.float32).reshape(STEPS, BATCH, -1).copy()
    ys = np.asarray(y[: STEPS * BATCH]).reshape(STEPS, BATCH)
    for s in OVERFLOW_STEPS:
        xs[s, 0, 0] = np.inf
    return xs, ys


def run(opts: Options = Options()) -> Result:
    xs, ys = _batches()
    model = nn.MLP(SIZES)
    params = model.init(jax.random.key(0))
    torch_model = tnn.Sequential(tnn.Linear(64, 128), tnn.ReLU(), tnn.Linear(128, 10))
    torch_model.load_state_dict(interop.to_torch(params))
    fp32_model = tnn.Sequential(tnn.Linear(64, 128), tnn.ReLU(), tnn.Linear(128, 10))
    fp32_model.load_state_dict(interop.to_torch(params))
    batches = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in zip(xs, ys)]
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        t_logits = torch_model(batches[1][0])  # before any update: the same weights on both sides

    (t_losses, t_scales, t_stepped), t_sec = timed(torch_amp_train, torch_model, batches)
    # the same loop in float32, to measure how far bfloat16 itself moves the losses
    fp32_losses = _torch_fp32_losses(fp32_model, batches)

    # the one JAX-side weight that perturb shifts: the first output bias feeds every logit
    params["2"]["bias"] = params["2"]["bias"].at[0].add(opts.perturb)
    (_, (metrics, history)), j_sec = timed(jax_amp_train, model, params, jnp.asarray(xs),
                                               jnp.asarray(ys.astype(np.int32)), jax.random.key(1))
    policy = get_policy("bf16")
    j_logits = jax.jit(lambda p, x: model.apply(*policy.cast_to_compute((p, x))))(params, xs[1])
    j_losses = np.asarray(metrics["loss"])
    j_scales = np.asarray(metrics["loss_scale"])
    j_skipped = sorted(int(i) for i in np.flatnonzero(~np.asarray(metrics["grads_finite"])))
    t_skipped = sorted(set(range(STEPS)) - set(t_stepped))
    kept = np.array([s not in OVERFLOW_STEPS for s in range(STEPS)])
    t_np = t_losses.float().numpy()

    # params must be bit-identical across a skipped step (a step after step 0, which has no "before")
    unchanged = all(
        all(np.array_equal(np.asarray(a[s]), np.asarray(a[s - 1])) for a in jax.tree.leaves(history))
        for s in OVERFLOW_STEPS if s > 0)
    bf16_gap = float(np.max(np.abs(t_np[kept] - fp32_losses[kept])))
    checks = [
        equal("loss-scale sequence: JAX == torch, step by step", np.asarray(j_scales, np.float32),
              np.asarray(t_scales, np.float32), why="the scale each step used; same update rule, exactly"),
        equal("skipped steps: JAX == torch", j_skipped, t_skipped),
        equal("skipped steps are the overflow steps", t_skipped, list(OVERFLOW_STEPS)),
        expect("JAX: params bit-identical across every skipped step", unchanged,
               "lax.cond keeps the old params when the gradients are not finite"),
        # one bfloat16 ulp is 2**-8 relative; torch fuses bias into the matmul and rounds once,
        # XLA rounds the matmul and then the bias add, so a logit may differ by an ulp or two
        equal("dtype of the logits: bfloat16 on both sides", str(j_logits.dtype), str(t_logits.dtype).split(".")[1]),
        close("first-batch logits, bf16: JAX == torch autocast", j_logits, t_logits, rtol=2.0**-6, atol=2.0**-8,
              why="same weights; a few bfloat16 ulps"),
        equal("non-finite losses on the same steps", np.isfinite(j_losses), np.isfinite(t_np)),
        # cross_entropy runs in float32 on bfloat16 logits: the logit differences above move the
        # loss by ~1e-3, and SGD carries them into the weights. That is the size of bfloat16's own
        # effect (torch bf16 vs torch fp32, printed); 3e-3 allows for it and no more.
        close("losses on the kept steps: JAX bf16 == torch autocast bf16", j_losses[kept], t_np[kept],
              rtol=0.0, atol=3e-3, why=f"bfloat16 rounding; torch bf16 vs torch fp32 differ by up to {bf16_gap:.1e}"),
        expect("the scale grew and backed off", max(t_scales) > SCALER["init_scale"] and min(t_scales) <
               SCALER["init_scale"], f"torch scales from {min(t_scales):g} to {max(t_scales):g}"),
        expect("training works: last 8 kept losses average under 2/3 of the first 8",
               np.mean(t_np[kept][-8:]) < 2 / 3 * np.mean(t_np[kept][:8]),
               f"{np.mean(t_np[kept][:8]):.3f} -> {np.mean(t_np[kept][-8:]):.3f}"),
    ]
    shown = [1, 9, 11, 24, STEPS - 1]

    def table(losses, scales, skipped):
        rows = [f"  step {s:2d}: loss {losses[s]:.4f}  scale {scales[s]:>9g}{'  skipped' if s in skipped else ''}"
                for s in shown]
        return "\n".join([f"digits, {STEPS} steps of {BATCH}, SGD lr {LR}, overflow at {list(OVERFLOW_STEPS)}",
                          *rows, f"skipped: {skipped}"])

    return Result(
        name="mixed_precision", title=TITLE,
        torch=Side(source(torch_amp_train), table(t_np, t_scales, t_skipped), t_sec),
        jax=Side(source(jax_amp_train), table(j_losses, j_scales, j_skipped), j_sec),
        checks=checks,
        notes=(f"GradScaler({', '.join(f'{k}={v:g}' for k, v in SCALER.items())}) on both sides. bfloat16 "
               f"has float32's range, so nothing overflows by itself; the inf inputs stand in for the "
               f"float16 overflows the scaler exists for. Largest |loss(bf16) - loss(fp32)| in torch "
               f"itself: {bf16_gap:.2e}."),
        series={"loss scale per step": {"torch GradScaler": [float(s) for s in t_scales],
                                        "JAX DynamicLossScale": [float(s) for s in j_scales]},
                "loss per step (bf16)": {"torch autocast": [float(v) for v in t_np],
                                         "JAX Policy('bf16')": [float(v) for v in j_losses]}},
    )


def _torch_fp32_losses(model, batches, lr=LR):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        if torch.isfinite(loss):
            loss.backward()
            optimizer.step()
    return np.asarray(losses)
