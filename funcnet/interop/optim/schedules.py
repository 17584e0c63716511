"""torch.optim.lr_scheduler schedulers as optax schedules, one per param group.

torch's schedulers update ``group["lr"]`` step by step (the chainable form); each has a
closed form in the scheduler's epoch count ``last_epoch``, which is what is written here, as
a function of that count. ``schedules(...)`` then maps optax's update count to torch's
epoch: ``last_epoch + count`` when ``scheduler.step()`` follows every optimizer step,
``last_epoch + count // steps_per_epoch`` when it runs once per epoch, so a scheduler the
user has already stepped continues from where it is. optax.schedules is used where its
formula is torch's to the last bit that matters (MultiStepLR, LinearLR). Written out:
ExponentialLR and StepLR, because optax.exponential_decay's ``gamma ** k`` drifts in
float32 (see ``_power``); CosineAnnealingLR, because torch's curve keeps going past
``T_max`` (back up, period ``2 * T_max``) where optax's cosine_decay_schedule stays at its
end value; OneCycleLR, because torch's phase boundaries (``pct_start * total_steps - 1``,
as floats) are not optax's onecycle ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

SUPPORTED_SCHEDULERS = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "OneCycleLR",
                        "SequentialLR", "LambdaLR")

_Fn = Callable[[jax.Array], jax.Array]  # torch's epoch count (an integer array) -> the group's lr


def _f(t):
    return jnp.asarray(t, jnp.result_type(float))


def _power(gamma: float, k):
    """``gamma ** k`` as ``exp(k * log(gamma))``, ``log`` taken in float64 here: in float32,
    optax.exponential_decay's ``gamma ** k`` starts from gamma rounded to float32 and drifts
    k times that rounding (0.997 ** 1000: 2e-5 relative; this form: 2e-8)."""
    if gamma <= 0:
        return gamma ** _f(k)
    return jnp.exp(_f(k) * math.log(gamma))


def _cosine(base, eta_min, t_max):
    def lr(t):
        if float(t_max).is_integer():  # cos has period 2 * T_max: reduce t exactly, in integers,
            t = t % (2 * int(t_max))   # so that float32 keeps its digits after many periods
        return eta_min + (base - eta_min) * (1 + jnp.cos(jnp.pi * _f(t) / t_max)) / 2
    return lr


def _lambda(scheduler, i, base) -> _Fn:
    fn = scheduler.lr_lambdas[i]
    try:
        out = jax.eval_shape(fn, jax.ShapeDtypeStruct((), jnp.result_type(int)))
    except Exception as err:  # noqa: BLE001 - the reason is shown to the user
        raise ValueError(
            f"convert_optimizer: LambdaLR's lr_lambda for param group {i} ({getattr(fn, '__name__', fn)!r}) does "
            f"not run on a traced step count, so it cannot become an optax schedule: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}; write it with jax.numpy (jnp.minimum for min, "
            f"jnp.where for if/else, jnp.cos for math.cos)") from None
    if getattr(out, "shape", None) != ():
        raise ValueError(f"convert_optimizer: LambdaLR's lr_lambda for param group {i} returns {out!r} on a step "
                         f"count, expected one number (the lr factor)")
    return lambda t: base * _f(fn(t))


def _one_cycle_parts(scheduler, group):
    anneal = getattr(scheduler, "_anneal_func_type", "cos")
    if anneal not in ("cos", "linear"):
        raise ValueError(f"convert_optimizer: OneCycleLR anneal_strategy {anneal!r}, expected 'cos' or 'linear'")

    def anneal_fn(start, end, pct):
        if anneal == "cos":
            return end + (start - end) / 2.0 * (jnp.cos(jnp.pi * pct) + 1)
        return (end - start) * pct + start

    def curve(start_key, end_key):
        phases = [(float(p["end_step"]), group[p[start_key]], group[p[end_key]]) for p in scheduler._schedule_phases]

        def fn(t):
            t = _f(t)
            value, start_step, done = jnp.zeros((), t.dtype), 0.0, jnp.asarray(False)
            for k, (end_step, lo, hi) in enumerate(phases):
                here = jnp.logical_not(done) & ((t <= end_step) | (k == len(phases) - 1))
                value = jnp.where(here, anneal_fn(lo, hi, (t - start_step) / (end_step - start_step)), value)
                done, start_step = done | here, end_step
            return value

        return fn

    lr = curve("start_lr", "end_lr")
    momentum = curve("start_momentum", "end_momentum") if scheduler.cycle_momentum else None
    return lr, momentum


def _group_fns(scheduler, i, group, *, nested=False) -> tuple[_Fn, _Fn | None]:
    """``(lr(t), momentum(t) or None)`` for param group ``i`` at torch's epoch count ``t``."""
    name = type(scheduler).__name__
    base = float(scheduler.base_lrs[i]) if hasattr(scheduler, "base_lrs") else None
    if name == "StepLR":
        return (lambda t: base * _power(scheduler.gamma, t // scheduler.step_size)), None
    elif name == "ExponentialLR":
        return (lambda t: base * _power(scheduler.gamma, t)), None
    elif name == "MultiStepLR":
        sched = optax.piecewise_constant_schedule(
            base, {int(m): scheduler.gamma ** n for m, n in scheduler.milestones.items()})
    elif name == "LinearLR":
        sched = optax.linear_schedule(base * scheduler.start_factor, base * scheduler.end_factor,
                                      scheduler.total_iters)
    elif name == "CosineAnnealingLR":
        return _cosine(base, scheduler.eta_min, scheduler.T_max), None
    elif name == "LambdaLR":
        return _lambda(scheduler, i, base), None
    elif name == "OneCycleLR":
        lr, momentum = _one_cycle_parts(scheduler, group)
        if momentum is not None and nested:
            raise ValueError("convert_optimizer: a OneCycleLR with cycle_momentum=True inside SequentialLR is not "
                             "supported (its momentum cycle would restart at the milestone); build it with "
                             "cycle_momentum=False")
        return lr, momentum
    elif name == "SequentialLR":
        parts = [_group_fns(s, i, group, nested=True)[0] for s in scheduler._schedulers]
        milestones = [int(m) for m in scheduler._milestones]

        def sequential(t):
            out = parts[0](t)
            for m, part in zip(milestones, parts[1:]):
                # from milestone m on, the next scheduler runs from its own epoch 0
                out = jnp.where(t >= m, part(jnp.maximum(t - m, 0)), out)
            return out

        return sequential, None
    else:
        raise ValueError(f"convert_optimizer: scheduler {name} is not supported; supported: "
                         f"{', '.join(SUPPORTED_SCHEDULERS)} (convert the lr rule by hand as an optax schedule "
                         f"otherwise)")
    return (lambda t: sched(_f(t))), None


def schedules(scheduler, optimizer, step_scheduler: str, steps_per_epoch: int | None):
    """Per param group ``(lr_schedule, momentum_schedule or None)``, functions of optax's
    update count, after checking ``scheduler`` drives ``optimizer`` and that each group's
    current lr is the scheduler's formula at its ``last_epoch``."""
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError(f"convert_optimizer: the scheduler ({type(scheduler).__name__}) drives another optimizer "
                         f"than the one passed; pass the scheduler built on this optimizer")
    offset = int(scheduler.last_epoch)
    if offset < 0:
        raise ValueError(f"convert_optimizer: {type(scheduler).__name__}.last_epoch is {offset}, expected >= 0 "
                         f"(a scheduler is at epoch 0 once built)")
    per = 1 if step_scheduler == "step" else int(steps_per_epoch)

    def at(fn):
        def schedule(count):
            return fn(offset + jnp.asarray(count, jnp.result_type(int)) // per)
        return schedule

    out = []
    for i, group in enumerate(optimizer.param_groups):
        lr_fn, momentum_fn = _group_fns(scheduler, i, group)
        want, have = float(np.asarray(lr_fn(jnp.asarray(offset)))), float(group["lr"])
        scale = abs(float(scheduler.base_lrs[i])) if hasattr(scheduler, "base_lrs") else abs(want)
        # torch's lr is a Python float; here it is the default float (float32 without x64)
        rel = max(1e-9, 1000 * float(jnp.finfo(jnp.result_type(float)).eps))
        if not math.isclose(want, have, rel_tol=rel, abs_tol=rel * 1e-3 * scale):
            raise ValueError(
                f"convert_optimizer: param group {i} has lr {have:.8g}, but {type(scheduler).__name__} at last_epoch="
                f"{offset} gives {want:.8g}; the lr was changed outside this scheduler (by hand, or by a second "
                f"scheduler on the same optimizer), which the converted schedule cannot know; pass the one "
                f"scheduler that sets the lr")
        out.append((at(lr_fn), None if momentum_fn is None else at(momentum_fn)))
    return out
