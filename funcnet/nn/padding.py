"""Padding layers, as torch.nn's: ZeroPad1d/2d/3d, ConstantPad1d/2d/3d, ReflectionPad1d/2d/3d,
ReplicationPad1d/2d/3d, CircularPad1d/2d/3d. No params, no state; the math is
``funcnet.nn.functional.pad``.

``padding``: an int (every side) or a tuple of ``2n`` ints, ``(left, right)``,
``(left, right, top, bottom)`` or ``(left, right, top, bottom, front, back)``, torch's order.

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import nn
    >>> nn.ReflectionPad1d(2).apply({}, jnp.arange(4.0).reshape(1, 1, 4)).tolist()
    [[[2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 1.0]]]
"""

from __future__ import annotations

from funcnet.nn.activation import _no_params
from funcnet.nn.functional import padding as _F
from funcnet.nn.module import Module

__all__ = [f"{kind}Pad{n}d" for kind in ("Zero", "Constant", "Reflection", "Replication", "Circular")
           for n in (1, 2, 3)]

_MODE = {"Zero": "constant", "Constant": "constant", "Reflection": "reflect", "Replication": "replicate",
         "Circular": "circular"}


def _padding(padding, n: int, cls: str) -> tuple[int, ...]:
    if isinstance(padding, int) and not isinstance(padding, bool):
        return (padding,) * (2 * n)
    pads = _F.check_pad(padding, cls) if isinstance(padding, (tuple, list)) else None
    if pads is None or len(pads) != 2 * n:
        raise ValueError(f"{cls}: padding must be an int or a tuple of {2 * n} ints, got {padding!r}")
    return pads


def _pad_layer(kind: str, n: int, padding, value=None) -> Module:
    cls = f"{kind}Pad{n}d"
    pads = _padding(padding, n, cls)
    mode = _MODE[kind]
    if kind == "Constant":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{cls}: value must be a number, got {value!r}")
        name = f"{cls}(padding={pads}, value={value})"
    else:
        name = f"{cls}({pads})"
        value = 0.0 if kind == "Zero" else None

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.pad(x, pads, mode, value)

    return Module(_no_params, apply, name=name)


def _make(kind: str, n: int):
    if kind == "Constant":
        def layer(padding, value: float) -> Module:
            return _pad_layer(kind, n, padding, value)
    else:
        def layer(padding) -> Module:
            return _pad_layer(kind, n, padding)
    what = {"Zero": "zeros", "Constant": "``value``", "Reflection": "the reflection of the input (edge excluded)",
            "Replication": "copies of the edge", "Circular": "the input wrapped around"}[kind]
    layer.__name__ = layer.__qualname__ = f"{kind}Pad{n}d"
    layer.__doc__ = (f"Pad the last {n} axes with {what}, as torch.nn.{kind}Pad{n}d. ``padding``: an int or "
                     f"{2 * n} ints, last axis first. See ``funcnet.nn.functional.pad``.")
    return layer


ZeroPad1d, ZeroPad2d, ZeroPad3d = (_make("Zero", n) for n in (1, 2, 3))
ConstantPad1d, ConstantPad2d, ConstantPad3d = (_make("Constant", n) for n in (1, 2, 3))
ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = (_make("Reflection", n) for n in (1, 2, 3))
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = (_make("Replication", n) for n in (1, 2, 3))
CircularPad1d, CircularPad2d, CircularPad3d = (_make("Circular", n) for n in (1, 2, 3))
