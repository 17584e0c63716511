"""The articles' table: bytes of a training step from a parameter count.

Params, gradients, an optional master copy, optimizer state and activations, in closed
form (``estimate``), for an MLP from its layer sizes or a GPT from its shapes.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from funcnet.memory.transformer import transformer_activations, transformer_params

# momentum buffer, Adam's first and second moments (mu, nu), and so on.
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "nesterov": 1, "adagrad": 1, "rmsprop": 1, "lion": 1, "adam": 2, "adamw": 2}

# Mixed precision as DeepSpeed/ZeRO counts it: the model holds half-precision
# parameters and gradients, the optimizer holds a float32 master copy and float32
# state, so Adam costs 2 + 2 + 4 + 8 = 16 bytes per parameter.
PRECISIONS = {
    "fp32": {"param_dtype": "float32"},
    "bf16": {"param_dtype": "bfloat16", "master_weights": "float32"},
    "fp16": {"param_dtype": "float16", "master_weights": "float32"},
}

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*$")
_DTYPE_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "fp8": "float8_e4m3fn",
}  # fmt: skip



class Estimate(NamedTuple):
    """Bytes per part of a training step; ``total`` is their sum.

    ``master`` is the extra high-precision copy of the parameters that mixed
    precision keeps (0 without one). ``as_dict()`` is the dict view.
    """

    params: int
    grads: int
    master: int
    optimizer: int
    activations: int
    total: int

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict of bytes."""
        return dict(self._asdict())


def parse_count(n: int | float | str) -> int:
    """A parameter count from ``7_000_000_000``, ``7e9``, ``"7B"``, ``"125M"``, ``"1.5B"``.

    Suffixes (case-insensitive): K = 1e3, M = 1e6, B or G = 1e9, T = 1e12.
    """
    if isinstance(n, bool):
        raise TypeError(f"parameter count must be a number or a string like '7B', got the bool {n!r}")
    if isinstance(n, (int, np.integer)):
        value = Decimal(int(n))
    elif isinstance(n, (float, np.floating)):
        if not math.isfinite(n):
            raise ValueError(f"parameter count must be finite, got {n!r}")
        value = Decimal(repr(float(n)))
    elif isinstance(n, str):
        m = _COUNT.match(n)
        if m is None or m.group(2).upper() not in _SCALE:
            raise ValueError(
                f"cannot read the parameter count {n!r}: expected a number with an optional suffix "
                f"K (1e3), M (1e6), B (1e9) or T (1e12), e.g. '7B', '125M', '1.5B' or '7e9'"
            )
        try:
            value = Decimal(m.group(1)) * _SCALE[m.group(2).upper()]
        except InvalidOperation as e:  # pragma: no cover - the regex admits only numbers
            raise ValueError(f"cannot read the parameter count {n!r}") from e
    else:
        raise TypeError(f"parameter count must be an int, a float or a string like '7B', got {type(n).__name__} {n!r}")
    if value < 0:
        raise ValueError(f"parameter count must be >= 0, got {n!r}")
    if value != value.to_integral_value():
        raise ValueError(f"parameter count must be a whole number, {n!r} is {value}")
    return int(value)


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype``: a jnp/numpy dtype or a name (float32/fp32, bfloat16/bf16, ...)."""
    name = _DTYPE_ALIASES.get(dtype.lower(), dtype) if isinstance(dtype, str) else dtype
    try:
        dt = None if name is None else jnp.dtype(name)  # np.dtype(None) would be float64
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biufcV":
        raise ValueError(
            f"unknown dtype {dtype!r}: expected a numeric dtype such as 'float32' ('fp32'), "
            f"'bfloat16' ('bf16'), 'float16' ('fp16'), 'float64' or 'int8', or a jnp dtype"
        )
    return int(dt.itemsize)


def _sizes(sizes: Sequence[int]) -> list[int]:
    sizes = list(sizes)
    if len(sizes) < 2 or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in sizes):
        raise ValueError(
            f"layer sizes must be at least two positive ints (input, ..., output), got {sizes!r}; "
            f"e.g. [784, 128, 10]"
        )
    return [int(s) for s in sizes]


def mlp_params(sizes: Sequence[int]) -> int:
    """Parameters of an MLP of ``nn.Linear`` layers with bias: sum of (in + 1) * out."""
    sizes = _sizes(sizes)
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))


def mlp_activations(sizes: Sequence[int], batch: int, dtype: Any = "float32") -> int:
    """Bytes the backward pass of a Linear/ReLU MLP with a softmax cross-entropy keeps.

    ``batch * sum(sizes)`` elements: the input (for the first weight's gradient),
    each hidden layer's ReLU output (its mask and the next weight's gradient both
    come from it) and the output's softmax. These are the tensors torch's autograd
    saves for ``nn.Linear``, ``nn.ReLU`` and ``F.cross_entropy``.
    """
    sizes = _sizes(sizes)
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    return int(batch) * sum(sizes) * dtype_bytes(dtype)


def _check_bytes(value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"activations must be a number of bytes >= 0 (an int), got {value!r}")
    return int(value)


def estimate(
    n_params: int | float | str | None = None,
    optimizer: str = "adam",
    param_dtype: Any = "float32",
    *,
    grad_dtype: Any = None,
    state_dtype: Any = None,
    compute_dtype: Any = None,
    master_weights: Any = None,
    activations: int = 0,
    sizes: Sequence[int] | None = None,
    batch: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    vocab: int | None = None,
    seq: int | None = None,
    mlp_ratio: int = 4,
    recompute: str = "none",
    flash: bool = False,
    dropout: bool = True,
) -> Estimate:
    """Closed-form bytes of one training step of ``n_params`` parameters.

    - params: ``n * bytes(param_dtype)``, the weights the model computes with.
    - grads: ``n * bytes(grad_dtype)`` (default ``param_dtype``).
    - master: ``n * bytes(master_weights)`` when a master copy is kept (mixed
      precision with float32 master weights), else 0.
    - optimizer: ``n * slots * bytes(state_dtype)``, slots from ``OPTIMIZER_SLOTS``
      (sgd 0, momentum 1, adam/adamw 2); ``state_dtype`` defaults to the master
      dtype if there is one, else ``param_dtype``. Scalars (Adam's step count) are
      left out.
    - activations: ``activations`` bytes as given, or ``mlp_activations(sizes,
      batch, compute_dtype)`` (``compute_dtype`` defaults to ``param_dtype``).

    A GPT's shapes (``layers``, ``hidden``, ``heads``, ``vocab``, ``seq``, ``batch``,
    ``mlp_ratio``) give both: the parameter count from ``transformer_params`` (the LM head
    tied, as nanoGPT) and the activations from ``transformer_activations`` in
    ``compute_dtype`` bytes per value, with ``recompute``, ``flash`` and ``dropout`` as there.

    ``estimate("7B", "adam")`` is 28e9 / 28e9 / 56e9 bytes; with
    ``**PRECISIONS["bf16"]`` it is 14e9 + 14e9 + 28e9 (master) + 56e9.
    """
    shapes = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq)
    if any(v is not None for v in shapes.values()):
        missing = [k for k, v in dict(shapes, batch=batch).items() if v is None]
        if missing:
            raise ValueError(f"transformer shapes need layers, hidden, heads, vocab, seq and batch; missing "
                             f"{', '.join(missing)}")
        if sizes is not None or activations:
            raise ValueError("give the activations as transformer shapes or as sizes/activations, not both")
        counted = transformer_params(layers, hidden, vocab, seq, mlp_ratio=mlp_ratio)
        if n_params is not None and parse_count(n_params) != counted:
            raise ValueError(f"n_params {n_params!r} disagrees with the {counted:,} parameters of these transformer "
                             f"shapes; leave n_params out to count them from the shapes")
        n_params = counted
        activations = transformer_activations(
            layers, hidden, heads, seq, batch, vocab=vocab, recompute=recompute, flash=flash, dropout=dropout,
            bytes_per_value=dtype_bytes(param_dtype if compute_dtype is None else compute_dtype))
        batch = None
    if n_params is None:
        raise ValueError("give n_params (e.g. '7B') or transformer shapes (layers, hidden, heads, vocab, seq, batch)")
    n = parse_count(n_params)
    if not isinstance(optimizer, str) or optimizer.lower() not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {sorted(OPTIMIZER_SLOTS)}")
    slots = OPTIMIZER_SLOTS[optimizer.lower()]
    p_bytes = dtype_bytes(param_dtype)
    g_bytes = dtype_bytes(param_dtype if grad_dtype is None else grad_dtype)
    m_bytes = 0 if master_weights is None else dtype_bytes(master_weights)
    if state_dtype is None:
        state_dtype = param_dtype if master_weights is None else master_weights
    s_bytes = dtype_bytes(state_dtype)
    if sizes is not None or batch is not None:
        if activations:
            raise ValueError(
                f"give activations either in bytes ({activations!r}) or as sizes and batch, not both"
            )
        if sizes is None or batch is None:
            raise ValueError(f"activations from layer sizes need sizes and batch, got {sizes=!r}, {batch=!r}")
        activations = mlp_activations(sizes, batch, param_dtype if compute_dtype is None else compute_dtype)
    else:
        _check_bytes(activations)
    parts = dict(params=n * p_bytes, grads=n * g_bytes, master=n * m_bytes, optimizer=n * slots * s_bytes)
    parts["activations"] = int(activations)
    return Estimate(**parts, total=sum(parts.values()))


ZERO_STAGES = (0, 1, 2, 3)


def zero_per_device(est: Estimate, stage: int, dp: int) -> Estimate:
    """``est`` (one whole model's bytes) per device under ZeRO ``stage`` over ``dp`` data-parallel devices.

    The ZeRO paper's accounting (Rajbhandari et al. 2020, Figure 1): with mixed-precision Adam a
    parameter costs 2 (fp16/bf16 params) + 2 (grads) + K bytes, K = 12 the float32 master copy,
    momentum and variance (here ``master + optimizer``). Stage 1 (P_os) splits those K bytes over
    ``dp``, stage 2 (P_os+g) the gradients too, stage 3 (P_os+g+p) the parameters too; 0 is plain
    data parallelism. 7.5B parameters on 64 devices: 120, 31.4, 16.6 and 1.9 GB. Activations stay
    whole on each device (each has its own batch slice); ``total`` is the new sum."""
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES} (0: none, 1: optimizer state, 2: and gradients, "
                         f"3: and parameters), got {stage!r}")
    if isinstance(dp, bool) or not isinstance(dp, (int, np.integer)) or dp < 1:
        raise ValueError(f"dp must be a positive int (the data-parallel devices ZeRO shards over), got {dp!r}")
    split = lambda v, on: v / dp if on else v  # noqa: E731 (one line per part below)
    parts = dict(params=split(est.params, stage >= 3), grads=split(est.grads, stage >= 2),
                 master=split(est.master, stage >= 1), optimizer=split(est.optimizer, stage >= 1))
    parts = {k: math.ceil(v) for k, v in parts.items()}
    parts["activations"] = est.activations
    return Estimate(**parts, total=sum(parts.values()))
