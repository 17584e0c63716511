"""Checks that turn silent garbage and raw Python errors into one clear message.

Pure host-side validation, called before anything is compiled (``check_fit_args``,
``check_step_fn``) and after every epoch (``check_finite_record``), plus
``json_safe``, which keeps every JSON file funcnet writes strict.

torch counterpart: ``torch.autograd.set_detect_anomaly`` finds the first NaN inside the
backward pass; here the check is once per epoch (or per checkpointed stretch) on the host,
so it costs nothing inside the compiled step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["NonFiniteLossError", "check_fit_args", "check_pair", "check_finite", "check_step_fn",
           "check_finite_record", "check_finite_losses", "json_safe"]


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss; the message names the epoch or step and the fix."""


def _is_torch(value) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def check_pair(data, name: str, where: str = "fit") -> tuple:
    """``data`` as an ``(x, y)`` pair of array-likes with the same length, or a TypeError/ValueError."""
    if _is_torch(data):
        raise TypeError(f"{where}: {name} is a single torch {type(data).__name__}; pass a pair "
                        f"(x, y) of numpy or jax arrays, e.g. ({name}_x.numpy(), {name}_y.numpy())")
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        what = (f"an array of shape {tuple(np.shape(data))}" if hasattr(data, "shape")
                else f"a {type(data).__name__}" + (f" of length {len(data)}" if hasattr(data, "__len__") else ""))
        raise TypeError(f"{where}: {name} must be a pair (x, y) of inputs and labels, got {what}; "
                        f"pass {name}=(x, y)")
    x, y = data
    for part, value in (("x", x), ("y", y)):
        if _is_torch(value):
            raise TypeError(f"{where}: {name} {part} is a torch {type(value).__name__}; funcnet takes numpy or "
                            f"jax arrays: pass {part}.detach().cpu().numpy()")
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"{where}: {name} {part} must be a numpy or jax array, got {type(value).__name__}; "
                            f"wrap it with np.asarray")
        if np.ndim(value) < 1:
            raise ValueError(f"{where}: {name} {part} is a scalar; pass one row per example")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    return x, y


def check_finite(x, name: str, where: str = "fit") -> None:
    """Refuse NaN or infinite values in a floating array (integer arrays pass), naming the first one."""
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.inexact):
        return
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: {name} holds {int(bad.sum())} non-finite values (the first, {a[first]}, at "
                         f"index {first}); training on them gives a NaN loss: clean or drop those examples")


def check_tx(tx, where: str = "fit") -> None:
    if isinstance(tx, str):
        raise TypeError(f"{where}: tx must be an optax GradientTransformation, got the string {tx!r}; "
                        f"pass e.g. optax.{tx if tx.isidentifier() else 'adam'}(1e-3)")
    if not (hasattr(tx, "init") and hasattr(tx, "update")):
        hint = " (call it: optax.adam(1e-3), not optax.adam)" if callable(tx) else " such as optax.adam(1e-3)"
        raise TypeError(f"{where}: tx must be an optax GradientTransformation{hint}, got {tx!r:.60}")


def check_fit_args(tx, train_data, test_data=None, *, where: str = "fit") -> None:
    """Everything ``fit`` can check before it compiles: the optimizer, the two ``(x, y)`` pairs
    (numpy/jax arrays, equal lengths) and finite inputs."""
    check_tx(tx, where)
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if data is None and name == "test_data":
            continue
        x, y = check_pair(data, name, where)
        check_finite(x, f"{name} x", where)
        check_finite(y, f"{name} y", where)


def check_loss_fn(loss_fn, where: str = "fit") -> None:
    """The test metrics call ``loss_fn(outputs, targets, reduction="sum")`` at each epoch's end
    (``evaluate``): a loss without a ``reduction`` argument is refused before the first epoch
    runs, not after it. A callable whose signature cannot be read passes."""
    import inspect

    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.name == "reduction" or p.kind is p.VAR_KEYWORD for p in params):
        return
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    raise TypeError(f"{where}: loss_fn {name}{inspect.signature(loss_fn)} takes no reduction= argument, but the test "
                    f"metrics call loss_fn(outputs, targets, reduction='sum') at each epoch's end; add "
                    f"reduction='mean' to it (returning the sum for 'sum', the mean for 'mean', as funcnet.losses "
                    f"do), or leave test_data out")


def check_step_fn(step, where: str = "run_epoch") -> None:
    """``step`` must be what ``make_step`` returns (it carries the uncompiled ``step.raw``)."""
    if not callable(step) or not callable(getattr(step, "raw", None)):
        raise TypeError(f"{where}: the first argument must be the step from make_step(model, tx), got "
                        f"{type(step).__name__}; call {where}(make_step(model, tx), state, x, y, batch_size=...)")


_FIX = ("lower the learning rate (--lr), check the inputs for NaN/Inf, or train in fp32 "
        "(or with --precision fp16's loss scaling)")


def check_finite_record(record: dict, params: Any = None) -> None:
    """Raise ``NonFiniteLossError`` if an epoch record's losses, or the params, are not finite.

    ``record`` is one ``fit`` history entry (``epoch``, ``step``, ``train_loss``, ...). Call it
    before the record is saved anywhere, so the last checkpoint stays the last good one.
    """
    bad = [k for k, v in record.items() if k.endswith("loss") and isinstance(v, float) and not math.isfinite(v)]
    where = f"epoch {record.get('epoch', '?')} (step {record.get('step', '?')})"
    if bad:
        raise NonFiniteLossError(f"the loss is not finite in {where}: "
                                 + ", ".join(f"{k} = {record[k]}" for k in bad) + f"; {_FIX}")
    if params is not None:
        _check_params(params, where)


def check_finite_losses(losses, first_step: int, epoch: int, params: Any = None) -> None:
    """Raise ``NonFiniteLossError`` naming the first step (``first_step`` is the step number of
    ``losses[0]``, counting from 1) whose loss is not finite; for mid-epoch checkpoints."""
    a = np.asarray(losses, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        i = int(bad[0])
        raise NonFiniteLossError(f"the loss is not finite at step {first_step + i} (epoch {epoch}): "
                                 f"loss = {a[i]}; {_FIX}")
    if params is not None:
        _check_params(params, f"epoch {epoch}")


def _check_params(params, where: str) -> None:
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
            name = "/".join(str(getattr(e, "key", getattr(e, "idx", e))) for e in path)
            raise NonFiniteLossError(f"the parameters are not finite after {where} ({name} holds NaN/Inf); {_FIX}")


def json_safe(value):
    """A copy of ``value`` that strict JSON accepts: non-finite floats become the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (what ``float()`` and numpy read back).
    Use with ``json.dumps(..., allow_nan=False)``."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
