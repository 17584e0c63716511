"""``convert_optimizer``: a torch optimizer (and its lr scheduler) as one optax transformation.

The update rules are in ``optim.rules`` and the schedules in ``optim.schedules``; this file reads
torch's param groups, maps them onto the params tree by torch's parameter names, and checks
what cannot be converted before anything runs. torch is never imported here: the optimizer
and scheduler arrive as objects and are read through their attributes.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from funcnet.interop.optim import rules
from funcnet.interop.optim.schedules import schedules

SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam")
_NOT_UPDATED = "not in the optimizer"


def _number(group, key, i):
    value = group[key]
    if hasattr(value, "item"):  # torch accepts a one-element Tensor for lr and betas
        if getattr(value, "numel", lambda: 1)() != 1:
            raise ValueError(f"convert_optimizer: param_groups[{i}][{key!r}] is a tensor of shape "
                             f"{tuple(value.shape)}, expected one number")
        value = value.item()
    return float(value)


def _betas(group, i):
    b1, b2 = group["betas"]
    return _number({"b": b1}, "b", i), _number({"b": b2}, "b", i)


def _read(name, group, i):
    """``(builder, the name of its momentum argument or None, its other arguments)``."""
    n = lambda key: _number(group, key, i)
    flag = lambda key: bool(group.get(key, False))
    if name == "SGD":
        return rules.sgd, "momentum", dict(momentum=n("momentum"), use_momentum=n("momentum") != 0,
                                           dampening=n("dampening"), nesterov=flag("nesterov"),
                                           weight_decay=n("weight_decay"), maximize=flag("maximize"))
    if name in ("Adam", "AdamW"):
        b1, b2 = _betas(group, i)
        decoupled = name == "AdamW" or flag("decoupled_weight_decay")
        return rules.adam, "b1", dict(b1=b1, b2=b2, eps=n("eps"), weight_decay=n("weight_decay"),
                                      decoupled=decoupled, amsgrad=flag("amsgrad"), maximize=flag("maximize"))
    if name == "Adamax":
        b1, b2 = _betas(group, i)
        return rules.adamax, "b1", dict(b1=b1, b2=b2, eps=n("eps"), weight_decay=n("weight_decay"),
                                        maximize=flag("maximize"))
    if name == "NAdam":
        b1, b2 = _betas(group, i)
        return rules.nadam, "b1", dict(b1=b1, b2=b2, eps=n("eps"), weight_decay=n("weight_decay"),
                                       momentum_decay=n("momentum_decay"),
                                       decoupled=flag("decoupled_weight_decay"), maximize=flag("maximize"))
    if name == "RMSprop":
        return rules.rmsprop, "momentum", dict(momentum=n("momentum"), use_momentum=n("momentum") > 0,
                                               alpha=n("alpha"), eps=n("eps"), centered=flag("centered"),
                                               weight_decay=n("weight_decay"), maximize=flag("maximize"))
    if name == "Adagrad":
        return rules.adagrad, None, dict(lr_decay=n("lr_decay"), eps=n("eps"),
                                         initial_accumulator_value=n("initial_accumulator_value"),
                                         weight_decay=n("weight_decay"), maximize=flag("maximize"))
    return rules.adadelta, None, dict(rho=n("rho"), eps=n("eps"), weight_decay=n("weight_decay"),
                                      maximize=flag("maximize"))


def _group_transform(name, group, i, lr, momentum_schedule):
    builder, momentum_name, kwargs = _read(name, group, i)
    if momentum_schedule is None:
        return builder(lr, **kwargs)
    # OneCycleLR cycles momentum (SGD, RMSprop) or beta1 (the Adam family) at every step:
    # optax.inject_hyperparams re-evaluates it from the step count, as torch's scheduler does
    kwargs[momentum_name] = momentum_schedule
    static = tuple(k for k in kwargs if k != momentum_name)
    return optax.inject_hyperparams(builder, static_args=static)(learning_rate=lr, **kwargs)


def _check_optimizer(torch_optimizer):
    import torch

    name = type(torch_optimizer).__name__
    if not isinstance(torch_optimizer, torch.optim.Optimizer):
        raise TypeError(f"convert_optimizer: expected a torch.optim optimizer, got {type(torch_optimizer).__name__}")
    if name not in SUPPORTED_OPTIMIZERS or type(torch_optimizer) is not getattr(torch.optim, name):
        raise ValueError(f"convert_optimizer: {type(torch_optimizer).__module__}.{type(torch_optimizer).__qualname__} "
                         f"is not supported; supported: torch.optim {', '.join(SUPPORTED_OPTIMIZERS)} (write the "
                         f"rule as an optax chain otherwise)")
    for i, group in enumerate(torch_optimizer.param_groups):
        for p in group["params"]:
            if p.is_complex():
                raise ValueError(f"convert_optimizer: param_groups[{i}] holds a complex parameter ({p.dtype}, shape "
                                 f"{tuple(p.shape)}); torch's rules treat its real and imaginary parts as separate "
                                 f"real numbers (view_as_real), the converted rules would not; keep the real and "
                                 f"imaginary parts as two real parameters")
    stepped = sum(1 for s in torch_optimizer.state.values()
                  if float(s.get("step", 0)) > 0 or s.get("momentum_buffer") is not None)
    if stepped:
        raise ValueError(f"convert_optimizer: the {name} has already taken steps ({stepped} parameters have "
                         f"optimizer state: moments, buffers), and the converted transform starts from fresh "
                         f"state, so it would not continue torch's run; convert the optimizer before its first "
                         f"step()")
    return name


def _labeller(torch_optimizer, module):
    """``labels(tree)`` for optax.multi_transform: each leaf's dotted path is its torch name,
    labelled by the param group that holds it (``_NOT_UPDATED`` for none, or a frozen one)."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    label_of = {name: _NOT_UPDATED for group in names.values() for name in group}
    for i, group in enumerate(torch_optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError(f"convert_optimizer: param_groups[{i}] holds a tensor of shape {tuple(p.shape)} that "
                                 f"is not a parameter of module= ({type(module).__name__}); pass the module whose "
                                 f"parameters the optimizer was built on")
            for name in names[id(p)]:
                # torch skips a parameter whose .grad is None (requires_grad=False): it stays as it is
                label_of[name] = f"param_groups[{i}]" if p.requires_grad else _NOT_UPDATED

    def key(k):
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    def labels(tree):
        def one(path, leaf):
            name = ".".join(key(k) for k in path)
            if name not in label_of:
                raise ValueError(f"convert_optimizer: the params tree has {name!r}, which is not a parameter name of "
                                 f"module= ({type(module).__name__}); pass params as interop.from_torch(module) "
                                 f"gives them (nested dicts keyed by torch's names)")
            return label_of[name]
        return jax.tree_util.tree_map_with_path(one, tree)

    return labels, set(label_of.values())


def convert_optimizer(torch_optimizer: Any, scheduler: Any = None, params: Any = None, *, module: Any = None,
                      step_scheduler: str = "step", steps_per_epoch: int | None = None) -> optax.GradientTransformation:
    """torch's optimizer (and lr scheduler) as an ``optax.GradientTransformation`` that
    trains as torch does: same defaults, same formulas, same first steps.

    - ``torch_optimizer``: torch.optim SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax or
      NAdam, before its first ``step()``. Every option is read off its param groups;
      foreach/fused/capturable/differentiable do not change the math and are ignored; a
      Tensor lr or beta is read as its value.
    - ``scheduler``: StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR,
      OneCycleLR (with its momentum/beta1 cycle), SequentialLR of these, or LambdaLR whose
      function runs on a jax array. Every group's lr follows it from its own initial lr, from
      the scheduler's current ``last_epoch`` on. ``step_scheduler="step"``: the loop calls
      ``scheduler.step()`` after every optimizer step; ``"epoch"`` with ``steps_per_epoch=N``:
      once every N steps.
    - ``module``: the torch module the optimizer was built on; needed when the optimizer has
      several param groups, or does not hold every parameter: each leaf of the params tree is
      found by its dotted path, torch's name (tied parameters by any of their names), and
      updated by its group's rule; a parameter in no group, or with ``requires_grad=False``,
      is left as it is (``optax.set_to_zero``). Without ``module``, one param group is applied
      to every leaf.
    - ``params``: the params tree (``interop.from_torch(module)``), optional: given, it is
      checked here against the optimizer, before training starts.

    Use it as any optax optimizer: ``state = tx.init(params)``, ``updates, state =
    tx.update(grads, state, params)``, ``params = optax.apply_updates(params, updates)``.
    """
    name = _check_optimizer(torch_optimizer)
    if step_scheduler not in ("step", "epoch"):
        raise ValueError(f"convert_optimizer: step_scheduler={step_scheduler!r}, expected 'step' (scheduler.step() "
                         f"after every optimizer step) or 'epoch' (once per epoch, with steps_per_epoch=N)")
    if step_scheduler == "epoch":
        if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
            raise ValueError(f"convert_optimizer: step_scheduler='epoch' needs steps_per_epoch, the number of "
                             f"optimizer steps per epoch (an int >= 1), got {steps_per_epoch!r}")
    elif steps_per_epoch is not None:
        raise ValueError(f"convert_optimizer: steps_per_epoch={steps_per_epoch!r} is for step_scheduler='epoch'; "
                         f"with step_scheduler='step' the scheduler steps with every optimizer step")
    groups = torch_optimizer.param_groups
    if scheduler is None:
        plans = [(_number(g, "lr", i), None) for i, g in enumerate(groups)]
    else:
        plans = schedules(scheduler, torch_optimizer, step_scheduler, steps_per_epoch)
    transforms = {f"param_groups[{i}]": _group_transform(name, g, i, *plans[i]) for i, g in enumerate(groups)}

    if module is None:
        if len(groups) != 1:
            raise ValueError(f"convert_optimizer: the {name} has {len(groups)} param groups; pass module= (the torch "
                             f"module it was built on) so that each parameter is found by its torch name")
        frozen = sum(1 for p in groups[0]["params"] if not p.requires_grad)
        if frozen:
            raise ValueError(f"convert_optimizer: the {name} holds {frozen} parameters with requires_grad=False, "
                             f"which torch does not update; pass module= so that they are found by name and left "
                             f"as they are")
        if params is not None:
            leaves, held = len(jax.tree.leaves(params)), len(groups[0]["params"])
            if leaves != held:
                raise ValueError(f"convert_optimizer: params has {leaves} arrays but the {name} holds {held} "
                                 f"parameters; pass module= so that the parameters it holds are found by name "
                                 f"(the others are then left as they are)")
        return transforms["param_groups[0]"]

    if not hasattr(module, "named_parameters"):
        raise TypeError(f"convert_optimizer: module= must be the torch.nn.Module the optimizer was built on, got "
                        f"{type(module).__name__}")
    labels, used = _labeller(torch_optimizer, module)
    if params is not None:
        labels(params)  # every leaf is a torch name: checked now, not at the first step
    if used == {"param_groups[0]"}:
        return transforms["param_groups[0]"]
    transforms = {k: v for k, v in transforms.items() if k in used}
    if _NOT_UPDATED in used:
        transforms[_NOT_UPDATED] = optax.set_to_zero()
    return optax.multi_transform(transforms, labels)
