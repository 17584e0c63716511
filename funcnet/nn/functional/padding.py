"""Padding, as torch.nn.functional.pad: constant (negative pads crop), reflect, replicate, circular.

``pad`` lists (before, after) pairs from the **last** axis backwards, torch's order:
``(left, right)`` pads the last axis, ``(left, right, top, bottom)`` the last two, and so on.
The non-constant modes pad the last 1, 2 or 3 axes of an input with one or two more axes
(unbatched or batched), as torch. The gradient is autodiff's: a reflected or replicated
element's gradient is the sum over its copies, as torch's backward kernels add them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["pad"]

PAD_MODES = ("constant", "reflect", "replicate", "circular")
_JNP_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def check_pad(pad, where: str) -> tuple[int, ...]:
    """``pad`` as a tuple of ints of even length, or a clear error."""
    try:
        values = tuple(pad)
    except TypeError:
        values = None
    if (values is None or not values or len(values) % 2
            or not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in values)):
        raise ValueError(f"{where}: pad must be a sequence of ints of even length ((left, right) for the last axis, "
                         f"then (top, bottom), ...), got {pad!r}")
    return tuple(int(p) for p in values)


def pad(input, pad, mode: str = "constant", value: float | None = None):
    """Pad ``input``, as torch.nn.functional.pad. ``pad``: ``(before_last, after_last,
    before_second_last, ...)``; ``mode``: ``"constant"`` (``value``, default 0; negative
    entries crop), ``"reflect"`` (mirror without the edge; each pad < that axis' size),
    ``"replicate"`` (repeat the edge), ``"circular"`` (wrap around; each pad <= the size)."""
    where = "pad"
    pads = check_pad(pad, where)
    if mode not in PAD_MODES:
        raise ValueError(f"{where}: mode must be one of {PAD_MODES}, got {mode!r}")
    if mode != "constant" and value is not None:
        raise ValueError(f"{where}: padding mode {mode!r} doesn't take in value argument; drop value=")
    x = jnp.asarray(input)
    k = len(pads) // 2
    if k > x.ndim:
        raise ValueError(f"{where}: padding length should be less than or equal to two times the input dimension, "
                         f"but got padding length {len(pads)} and an input of shape {tuple(x.shape)}")
    pairs = [(pads[2 * i], pads[2 * i + 1]) for i in range(k)][::-1]  # first padded axis first
    if mode == "constant":
        fill = jnp.asarray(0 if value is None else value, x.dtype)
        config = [(0, 0, 0)] * (x.ndim - k) + [(lo, hi, 0) for lo, hi in pairs]
        for size, (lo, hi, _) in zip(x.shape[x.ndim - k:], config[x.ndim - k:]):
            if size + lo + hi < 0:
                raise ValueError(f"{where}: pad {tuple(pads)} crops more than the input of shape {tuple(x.shape)} "
                                 f"has; the padded size would be {size + lo + hi}")
        return jax.lax.pad(x, fill, config)
    if k > 3 or x.ndim not in (k + 1, k + 2):
        raise ValueError(f"{where}: padding size {len(pads)} is not supported for a {x.ndim}D input of shape "
                         f"{tuple(x.shape)} in mode {mode!r}: the non-constant modes pad the last 1, 2 or 3 axes of "
                         f"a 2D/3D, 3D/4D or 4D/5D input (padding size 2, 4 or 6)")
    for size, (lo, hi) in zip(x.shape[x.ndim - k:], pairs):
        limit = size if mode == "circular" else size - 1 if mode == "reflect" else None
        if min(lo, hi) < 0 or (limit is not None and max(lo, hi) > limit):
            bound = f"in [0, {limit}]" if limit is not None else ">= 0"
            raise ValueError(f"{where}: padding {(lo, hi)} of an axis of size {size} (input shape {tuple(x.shape)}) "
                             f"must be {bound} in mode {mode!r}")
    return jnp.pad(x, [(0, 0)] * (x.ndim - k) + pairs, mode=_JNP_MODE[mode])
