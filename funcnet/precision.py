"""Mixed precision: a dtype policy and loss scaling, as data.

torch counterpart: ``torch.autocast`` (run ops in a low-precision dtype while the
weights stay float32) and ``torch.amp.GradScaler`` (scale the loss so small
float16 gradients do not underflow, skip the step when they overflow).

- ``Policy(param_dtype, compute_dtype, output_dtype)``: master weights stay in
  ``param_dtype``; the forward and backward pass run on a ``cast_to_compute`` copy;
  the loss comes back in ``output_dtype``. Parse one with ``get_policy("bf16")`` or
  ``get_policy("params=float32,compute=float16,output=float32")``.
- ``DynamicLossScale`` / ``StaticLossScale`` / ``NoOpLossScale``: pytrees with
  ``loss_scale``, ``scale(loss)``, ``unscale(grads)`` and ``adjust(grads_finite)``,
  which returns the next state (nothing mutates), so they ride in a jitted step.
- ``all_finite(tree)`` and ``select_tree(pred, a, b)``: the overflow test and the
  "keep the old params on a skipped step" switch, both on device.

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import precision
    >>> tree = precision.cast_floating({"w": jnp.ones(2), "n": jnp.arange(2)}, jnp.bfloat16)
    >>> str(tree["w"].dtype), str(tree["n"].dtype)  # floats cast, integers kept
    ('bfloat16', 'int32')
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Policy",
    "get_policy",
    "cast_floating",
    "DynamicLossScale",
    "StaticLossScale",
    "NoOpLossScale",
    "LossScale",
    "all_finite",
    "select_tree",
    "Precision",
    "resolve_precision",
]

_DTYPES = {**dict.fromkeys(["float32", "f32", "fp32", "float", "full", "single"], jnp.float32),
           **dict.fromkeys(["bfloat16", "bf16"], jnp.bfloat16),
           **dict.fromkeys(["float16", "f16", "fp16", "half"], jnp.float16),
           **dict.fromkeys(["float64", "f64", "fp64", "double"], jnp.float64)}
_KEYS = {"params": "param_dtype", "param": "param_dtype", "p": "param_dtype",
         "compute": "compute_dtype", "c": "compute_dtype",
         "output": "output_dtype", "o": "output_dtype"}
# Short names follow torch autocast: float32 master weights, low-precision compute,
# float32 loss (autocast runs cross_entropy/softmax in float32).
_SHORT = {"fp32": ("float32", "float32", "float32"),
          "bf16": ("float32", "bfloat16", "float32"),
          "fp16": ("float32", "float16", "float32")}
_INT32_MAX = 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)


def _dtype(name: Any, where: str) -> np.dtype:
    if isinstance(name, str):
        if name.strip().lower() in _DTYPES:
            return np.dtype(_DTYPES[name.strip().lower()])
    else:
        try:
            dt = np.dtype(name)
        except TypeError:
            dt = None
        if dt is not None and jnp.issubdtype(dt, jnp.floating):
            return dt
    raise ValueError(
        f"{where}: unknown floating dtype {name!r}; expected one of "
        f"float32/bfloat16/float16/float64 (or f32, bf16, f16, fp16, half, ...); "
        f"use one of those names or a floating dtype such as jnp.bfloat16"
    )


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with every floating array leaf cast to ``dtype``; integer, bool and
    non-array leaves (labels, step counters, Python scalars) are returned as they are."""
    dtype = np.dtype(dtype)

    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray(x, dtype)
        return x

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which dtype params are stored in, computed in and returned in.

    Hashable, so it can be a static argument of ``jax.jit``. ``str(policy)`` gives
    the canonical string that ``get_policy`` parses back.
    """

    param_dtype: Any = jnp.float32
    compute_dtype: Any = jnp.float32
    output_dtype: Any = jnp.float32

    def __post_init__(self):
        for f in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, f, _dtype(getattr(self, f), f"Policy({f}=...)"))

    @classmethod
    def from_string(cls, spec: str) -> Policy:
        """Parse ``"fp32"``/``"bf16"``/``"fp16"`` or ``"params=float32,compute=bfloat16,output=float32"``.

        Keys (``params``/``p``, ``compute``/``c``, ``output``/``o``) left out default to float32.
        """
        if not isinstance(spec, str):
            raise TypeError(f"a policy string is expected, got {type(spec).__name__} {spec!r}; "
                            f"write e.g. 'bf16' or 'params=float32,compute=bfloat16,output=float32'")
        text = spec.strip().lower()
        if text in _SHORT:
            return cls(*_SHORT[text])
        if "=" not in text:
            raise ValueError(f"unknown precision policy {spec!r}; expected one of {sorted(_SHORT)} "
                             f"or 'params=<dtype>,compute=<dtype>,output=<dtype>'")
        fields: dict[str, np.dtype] = {}
        for part in text.split(","):
            key, sep, value = (s.strip() for s in part.partition("="))
            if not sep or key not in _KEYS:
                raise ValueError(f"policy {spec!r}: unknown entry {part.strip()!r}; expected "
                                 f"params=<dtype>, compute=<dtype> or output=<dtype>, comma-separated")
            if _KEYS[key] in fields:
                raise ValueError(f"policy {spec!r}: {key!r} is given twice; give each of "
                                 f"params, compute and output at most once")
            fields[_KEYS[key]] = _dtype(value, f"policy {spec!r}, {key}=")
        return cls(**fields)

    def __str__(self) -> str:
        return (f"params={self.param_dtype.name},compute={self.compute_dtype.name},"
                f"output={self.output_dtype.name}")

    def cast_to_param(self, tree: Any) -> Any:
        """``tree``'s floating leaves in ``param_dtype`` (the stored weights)."""
        return cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        """``tree``'s floating leaves in ``compute_dtype`` (the forward's arithmetic)."""
        return cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """``tree``'s floating leaves in ``output_dtype`` (what the forward returns)."""
        return cast_floating(tree, self.output_dtype)


def get_policy(spec: str | Policy) -> Policy:
    """A ``Policy`` from a policy or a string (see ``Policy.from_string``)."""
    return spec if isinstance(spec, Policy) else Policy.from_string(spec)


def all_finite(tree: Any) -> jax.Array:
    """Scalar bool: no inf or NaN in any leaf (True for an empty tree). torch: GradScaler's found_inf, negated."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def select_tree(pred: Any, on_true: Any, on_false: Any) -> Any:
    """Leafwise ``jnp.where(pred, on_true, on_false)`` over two trees of one structure; ``pred`` a scalar bool.

    The on-device form of GradScaler's "skip ``optimizer.step()``": both updates are
    computed, one is kept, and nothing goes back to the host.
    """
    pred = jnp.asarray(pred)
    if pred.shape != ():
        raise ValueError(f"select_tree needs a scalar predicate, got shape {pred.shape}; reduce it first "
                         f"(e.g. with all_finite)")
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _has_float64() -> bool:
    return jax.default_backend() != "tpu"


def _inverse(scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(w, post)``, float32 scalars whose product is GradScaler's ``inv_scale`` exactly:
    ``float32(1 / float64(scale))``. Above 2**126 that reciprocal is a float32 subnormal,
    which XLA would flush to zero (and every gradient with it), so it is returned as a
    normal ``w`` rounded on the subnormal grid, times ``post = 2**-64``.

    TPUs have no float64: there the reciprocal is taken in float32, which is the same
    number whenever the scale is a power of two (GradScaler's defaults keep it one)."""
    if not _has_float64():
        return jnp.float32(1.0) / scale.astype(jnp.float32), jnp.float32(1.0)
    with jax.enable_x64(True):
        s = scale.astype(jnp.float64)
        big = s > 2.0**126
        v = jnp.where(big, 2.0**64, 1.0) / s
        grid = 1.5 * 2.0 ** (52 - 85)  # adding and removing it rounds to multiples of 2**-85 = 2**64 * 2**-149
        w = jnp.where(big, (v + grid) - grid, v).astype(jnp.float32)
    return w, jnp.where(big, jnp.float32(2.0**-64), jnp.float32(1.0))


def _unscale(grads: Any, w: jax.Array, post: jax.Array) -> Any:
    # float32 at least: a bfloat16/float16 gradient times 1/scale would round again in 8 or 11 bits
    def one(g):
        if not (hasattr(g, "dtype") and jnp.issubdtype(g.dtype, jnp.floating)):
            return g
        dt = jnp.promote_types(g.dtype, jnp.float32)
        return g.astype(dt) * w.astype(dt) * post.astype(dt)

    return jax.tree.map(one, grads)


def _scale_loss(loss: Any, scale: jax.Array) -> jax.Array:
    # like torch: the product is taken in float32 (or wider) and returned in the loss's dtype
    loss = jnp.asarray(loss)
    dt = jnp.promote_types(loss.dtype, jnp.float32)
    return (loss.astype(dt) * scale.astype(dt)).astype(loss.dtype)


def _times(scale: jax.Array, factor: float) -> jax.Array:
    """float32(scale * factor) with the product in float64, rounded once, as torch's
    ``_amp_update_scale_`` computes it (factor is a C++ double there)."""
    if float(np.float32(factor)) == factor:
        # a product of two float32 values is exact in float64, so float32 arithmetic rounds the same way
        return scale * np.float32(factor)
    if not _has_float64():  # TPU: one float32 rounding; torch rounds the float64 product once
        return scale * np.float32(factor)
    with jax.enable_x64(True):
        return (scale.astype(jnp.float64) * factor).astype(jnp.float32)


def _number(value: Any, name: str, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a Python number, got {type(value).__name__} {value!r}; {fix}")
    return float(value)


def _static(**kw):
    return dataclasses.field(metadata={"static": True}, **kw)


_UNSET: Any = object()  # "build from hyperparameters"; None is a legal leaf in tree maps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, init=False, eq=False)
class DynamicLossScale:
    """torch.amp.GradScaler's scale as a pytree: ``loss_scale`` (float32 scalar) and
    ``counter`` (int32 scalar: consecutive finite steps, torch's growth tracker) are
    leaves; the three hyperparameters are static.

    ``adjust(grads_finite)`` applies ``_amp_update_scale_``: a non-finite step multiplies
    the scale by ``backoff_factor`` and zeroes the counter; a finite step increments it,
    and on reaching ``growth_interval`` multiplies the scale by ``growth_factor`` (unless
    that overflows float32, when the scale stays) and zeroes it. Products are rounded
    to float32 from float64, as torch does, so the scale sequences are bit-identical,
    with one exception: XLA flushes float32 subnormals to zero, so a scale driven below
    2**-126 (142 straight overflows from 2**16) becomes 0 where torch keeps a subnormal.
    The keywords ``loss_scale=``/``counter=`` rebuild a given state (``jax.tree`` uses them).
    """

    loss_scale: jax.Array
    counter: jax.Array
    growth_factor: float = _static()
    backoff_factor: float = _static()
    growth_interval: int = _static()

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, *, loss_scale: Any = _UNSET, counter: Any = _UNSET):
        growth_factor = _number(growth_factor, "growth_factor", "use e.g. growth_factor=2.0 (torch's default)")
        backoff_factor = _number(backoff_factor, "backoff_factor", "use e.g. backoff_factor=0.5")
        if not growth_factor > 1.0 or not np.isfinite(growth_factor):
            raise ValueError(f"growth_factor={growth_factor!r}: expected a finite number > 1 (it grows the "
                             f"scale after growth_interval finite steps); use e.g. growth_factor=2.0")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor={backoff_factor!r}: expected a number in (0, 1) (it shrinks "
                             f"the scale after an overflow); use e.g. backoff_factor=0.5")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)) \
                or not 0 < growth_interval <= _INT32_MAX:
            raise ValueError(f"growth_interval={growth_interval!r}: expected a positive int (at most "
                             f"{_INT32_MAX}, the int32 counter's range); use e.g. growth_interval=2000")
        if loss_scale is _UNSET:  # built by a user, not by unflattening
            init = _number(init_scale, "init_scale", "use e.g. init_scale=2.0**16")
            if not 0 < init <= _F32_MAX:
                raise ValueError(f"init_scale={init_scale!r}: expected a positive number finite in float32; "
                                 f"use e.g. init_scale=2.0**16 (torch's default)")
            loss_scale = jnp.asarray(init, jnp.float32)
        if counter is _UNSET:
            counter = jnp.zeros((), jnp.int32)
        for name, value in [("loss_scale", loss_scale), ("counter", counter), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor), ("growth_interval", int(growth_interval))]:
            object.__setattr__(self, name, value)

    def scale(self, loss: Any) -> jax.Array:
        """``loss * loss_scale`` in the loss's dtype. torch: ``scaler.scale(loss)``."""
        return _scale_loss(loss, self.loss_scale)

    def unscale(self, grads: Any) -> Any:
        """Floating leaves times ``1 / loss_scale``, in float32 (or wider). torch: ``scaler.unscale_``.

        The reciprocal is torch's (taken in float64, rounded to float32), so the
        unscaled gradients are bit-identical, also at scales above 2**126.
        """
        return _unscale(grads, *_inverse(self.loss_scale))

    def adjust(self, grads_finite: Any) -> DynamicLossScale:
        """The next state, given whether this step's (scaled) gradients were all finite."""
        finite = jnp.asarray(grads_finite)
        if finite.shape != () or finite.dtype != jnp.bool_:
            raise ValueError(f"grads_finite must be a scalar bool, got dtype {finite.dtype} shape {finite.shape}; "
                             f"pass all_finite(grads)")
        successful = self.counter + 1
        at_interval = successful == self.growth_interval
        grown = _times(self.loss_scale, self.growth_factor)
        grown = jnp.where(jnp.isfinite(grown), grown, self.loss_scale)
        scale = jnp.where(finite, jnp.where(at_interval, grown, self.loss_scale),
                          _times(self.loss_scale, self.backoff_factor))
        counter = jnp.where(finite & ~at_interval, successful, 0).astype(jnp.int32)
        return dataclasses.replace(self, loss_scale=scale, counter=counter)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, init=False, eq=False)
class StaticLossScale:
    """A fixed scale (torch: ``loss * s`` then ``grad / s`` by hand); ``adjust`` returns it unchanged."""

    loss_scale: jax.Array

    def __init__(self, scale: float = _UNSET, *, loss_scale: Any = _UNSET):
        if loss_scale is _UNSET:
            if scale is _UNSET:
                raise TypeError("StaticLossScale needs a scale; use e.g. StaticLossScale(1024.0)")
            value = _number(scale, "scale", "use e.g. StaticLossScale(1024.0)")
            if not 0 < value <= _F32_MAX:
                raise ValueError(f"scale={scale!r}: expected a positive number finite in float32; "
                                 f"use e.g. StaticLossScale(1024.0)")
            loss_scale = jnp.asarray(value, jnp.float32)
        object.__setattr__(self, "loss_scale", loss_scale)

    def scale(self, loss: Any) -> jax.Array:
        """The loss times the scale, multiplied in float32 (or wider) and returned in the loss's dtype, as torch."""
        return _scale_loss(loss, self.loss_scale)

    def unscale(self, grads: Any) -> Any:
        """The gradients times 1/scale, in float32 at least (a half-precision gradient is widened first)."""
        return _unscale(grads, *_inverse(self.loss_scale))

    def adjust(self, grads_finite: Any) -> StaticLossScale:
        """The same scale: a static scale never changes."""
        del grads_finite
        return self


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class NoOpLossScale:
    """No scaling (torch: ``GradScaler(enabled=False)``); ``unscale`` only widens to float32."""

    @property
    def loss_scale(self) -> jax.Array:
        """Always 1.0, a float32 scalar."""
        return jnp.float32(1.0)

    def scale(self, loss: Any) -> jax.Array:
        """The loss as it is."""
        return jnp.asarray(loss)

    def unscale(self, grads: Any) -> Any:
        """The gradients, half-precision ones widened to float32."""
        return _unscale(grads, jnp.float32(1.0), jnp.float32(1.0))

    def adjust(self, grads_finite: Any) -> NoOpLossScale:
        """Itself: nothing to adjust."""
        del grads_finite
        return self


LossScale = DynamicLossScale | StaticLossScale | NoOpLossScale


class Precision(NamedTuple):
    """``fit(precision=...)`` spelled out: a policy (or None: float32) and the initial loss-scale
    state (or None: no scaling). ``Precision("fp16", DynamicLossScale(init_scale=2.0**10))``."""

    policy: Any = None
    loss_scale: Any = None


# Lightning's precision strings (``Trainer(precision=...)``) and ours, as (policy, scaled?).
_LIGHTNING = {"32": (None, False), "32-true": (None, False), "fp32": (None, False),
              "bf16-mixed": ("bf16", False), "bf16": ("bf16", False),
              "16-mixed": ("fp16", True), "fp16": ("fp16", True)}


def resolve_precision(precision: Any) -> tuple[Any, Any]:
    """``(policy, loss_scale)`` for ``fit(precision=...)``.

    ``None``/``"32"``/``"32-true"``/``"fp32"``: float32, no scaling. ``"bf16-mixed"``/``"bf16"``:
    float32 master params, bfloat16 compute, no scaling (bfloat16 has float32's range).
    ``"16-mixed"``/``"fp16"``: float16 compute with ``DynamicLossScale()``, torch's GradScaler
    defaults. A ``Policy`` or a policy string (``"params=float32,compute=bfloat16,output=float32"``)
    runs unscaled; ``Precision(policy, loss_scale)`` gives both.
    """
    if isinstance(precision, Precision):
        return (None if precision.policy is None else get_policy(precision.policy)), precision.loss_scale
    if precision is None or isinstance(precision, Policy):
        return precision, None
    if isinstance(precision, str):
        key = precision.strip().lower()
        if key in _LIGHTNING:
            policy, scaled = _LIGHTNING[key]
            return policy, DynamicLossScale() if scaled else None
        if "=" in key:
            return get_policy(precision), None
        raise ValueError(f"precision={precision!r} is not known; expected one of {', '.join(_LIGHTNING)} "
                         f"(Lightning's names and ours), a Policy, or Precision(policy, loss_scale); "
                         f"'16-true'/'bf16-true' (half-precision master weights) are not supported")
    raise TypeError(f"precision must be a string such as 'bf16-mixed', a Policy or a Precision, got "
                    f"{type(precision).__name__} {precision!r:.60}")
