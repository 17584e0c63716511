"""Per-device bytes of a GPT's training step under a parallel layout: data x FSDP x tensor parallel.

``plan(shape, layout)`` says, before anything is launched, what each device holds:
params, gradients, a master copy, optimizer state and activations, with

- FSDP / ZeRO-3 (``fsdp``): every matrix split over the fsdp devices (its state too);
- tensor parallelism (``tp``, Megatron's rules, ``funcnet.parallel.tensor``): the block
  matrices and the vocabulary-split embedding over the tp devices, LayerNorms and the
  row-parallel biases whole on each;
- data parallelism (``dp``): replicas; the global batch is split over ``dp x fsdp``;
- activations per Korthikanti et al. 2022 (section 4.2, table 2) per layer, 16-bit values
  at p = 2 bytes: ``sbh (10 + 24/t + 5as/(ht))`` with dropout, of which the LayerNorm
  inputs, the qkv and MLP inputs and the residual dropout masks (``sbh (4p + 2)``) stay
  whole on every tp device unless ``sp`` (sequence parallelism) splits them too, giving
  ``sbh (34 + 5as/h) / t``; ``remat`` as ``memory.transformer_activations``'s ``recompute``;
- the gradient reduction buffer (``reduce_buffer``): with a data axis (``dp > 1``) each
  device's gradients (its fsdp x tp shard of them) are all-reduced over the data replicas
  into a second buffer of the same size, so they are held twice at the reduction. torch's
  DDP copies them into its buckets (``gradient_as_bucket_view=False``, the default); XLA
  combines the gradient all-reduces into one whose inputs (every gradient, live at once) and
  outputs are separate buffers (measured on CPU: ``python benchmarks/layout_memory.py``).
  ``Layout(reduce_in_place=True)`` drops it (DDP's ``gradient_as_bucket_view=True``). FSDP
  alone (``dp == 1``) has no such copy in the plan: each layer's whole gradient is
  reduce-scattered into its shard and freed, one layer at a time.

``fits``: whether the total is within ``device_memory`` bytes. ``layouts(n)`` lists the
(dp, fsdp, tp) that multiply to n; ``smallest_fitting`` picks the one with the least model
sharding (fsdp x tp, then tp) that fits: the least communication.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from funcnet.memory.estimate import OPTIMIZER_SLOTS, PRECISIONS, dtype_bytes

__all__ = ["REMAT", "Layout", "Plan", "Shape", "layouts", "plan", "smallest_fitting"]

REMAT = ("none", "selective", "full")


class Shape(NamedTuple):
    """A GPT's shape (``funcnet.gpt.GPTConfig``'s names; the LM head tied to the embedding).
    ``batch``: the global batch in sequences, split over ``dp x fsdp``."""

    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    block_size: int
    batch: int
    mlp_ratio: int = 4
    bias: bool = True
    dropout: bool = False


class Layout(NamedTuple):
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    sp: bool = False
    remat: str = "none"
    precision: str = "fp32"
    optimizer: str = "adam"
    reduce_in_place: bool = False  # True: the dp all-reduce writes into the gradients (no reduce_buffer)

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.tp

    def __str__(self) -> str:
        extra = ", sp" if self.sp else ""
        return f"dp{self.dp} x fsdp{self.fsdp} x tp{self.tp}{extra}, remat {self.remat}"


class Plan(NamedTuple):
    """Bytes on each device (``reduce_buffer``: the second copy of the gradients at the data-parallel
    all-reduce, module docstring); ``fits`` is None without a device memory."""

    params: int
    grads: int
    master: int
    optimizer: int
    activations: int
    reduce_buffer: int
    total: int
    fits: bool | None
    layout: Layout

    def as_dict(self) -> dict:
        return {k: v for k, v in self._asdict().items() if k != "layout"} | {"layout": str(self.layout)}


def _check(shape: Shape, layout: Layout) -> None:
    for name in ("dp", "fsdp", "tp"):
        v = getattr(layout, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"layout: {name} must be a positive int, got {v!r}")
    if layout.remat not in REMAT:
        raise ValueError(f"layout: remat must be one of {REMAT}, got {layout.remat!r}")
    if layout.precision not in PRECISIONS:
        raise ValueError(f"layout: precision must be one of {sorted(PRECISIONS)}, got {layout.precision!r}")
    if layout.optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"layout: optimizer must be one of {sorted(OPTIMIZER_SLOTS)}, got {layout.optimizer!r}")
    if shape.n_head % layout.tp:
        raise ValueError(f"layout: tp={layout.tp} must divide the {shape.n_head} heads (tensor parallelism splits "
                         f"heads); pick tp among the divisors of {shape.n_head}")
    if shape.batch % (layout.dp * layout.fsdp):
        raise ValueError(f"layout: the global batch {shape.batch} must split over dp x fsdp = "
                         f"{layout.dp * layout.fsdp} devices; pass a multiple of it")


def _param_count(shape: Shape, layout: Layout) -> float:
    """Parameters one device holds (fractional: a shard of a count)."""
    L, h, r, t, f = shape.n_layer, shape.n_embd, shape.mlp_ratio, layout.tp, layout.fsdp
    matrices = (4 + 2 * r) * h * h / (t * f)
    column_bias = (3 + r) * h / t if shape.bias else 0  # split with their column-parallel weights
    whole = (2 * h + 2 * h) if shape.bias else 2 * h  # two LayerNorms
    whole += 2 * h if shape.bias else 0  # the row-parallel biases, added after the all-reduce
    embeddings = shape.vocab_size * h / (t * f) + shape.block_size * h / f  # wte split by vocab, wpe by fsdp
    final_ln = 2 * h if shape.bias else h
    return L * (matrices + column_bias + whole) + embeddings + final_ln


def _activations(shape: Shape, layout: Layout, p: int) -> float:
    s, h, a, t = shape.block_size, shape.n_embd, shape.n_head, layout.tp
    b = shape.batch // (layout.dp * layout.fsdp)
    sbh, as2b = s * b * h, a * s * s * b
    mask = 1 if shape.dropout else 0
    whole = sbh * (4 * p + 2 * mask)  # LN inputs, qkv and MLP inputs, residual dropout masks
    split = sbh * 12 * p  # Q, K, V, attention output, GELU in and out: 3 + 1 + 2 x 4 values of h
    if layout.remat == "full":
        per_layer = p * sbh / (t if layout.sp else 1)  # each layer's input
    else:
        per_layer = whole / (t if layout.sp else 1) + split / t
        if layout.remat == "none":
            per_layer += as2b * (p + mask * (p + 1)) / t
    outside = (mask * sbh + 2 * p * sbh) / (t if layout.sp else 1) + 4 * s * b * shape.vocab_size / t
    return shape.n_layer * per_layer + outside


def plan(shape: Shape, layout: Layout = Layout(), *, device_memory: int | None = None) -> Plan:
    """Per-device bytes of one training step of the GPT ``shape`` under ``layout`` (module docstring)."""
    _check(shape, layout)
    precision = PRECISIONS[layout.precision]
    pb = dtype_bytes(precision["param_dtype"])
    master_b = dtype_bytes(precision["master_weights"]) if "master_weights" in precision else 0
    state_b = master_b or pb
    n = _param_count(shape, layout)
    act_b = 2 if layout.precision in ("bf16", "fp16") else 4
    parts = {"params": n * pb, "grads": n * pb, "master": n * master_b,
                 "optimizer": n * OPTIMIZER_SLOTS[layout.optimizer] * state_b,
                 "activations": _activations(shape, layout, act_b)}
    parts["reduce_buffer"] = parts["grads"] if layout.dp > 1 and not layout.reduce_in_place else 0
    parts = {k: round(v) for k, v in parts.items()}
    total = sum(parts.values())
    fits = None if device_memory is None else total <= device_memory
    return Plan(**parts, total=total, fits=fits, layout=layout)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt(n)) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def layouts(n_devices: int, shape: Shape, *, max_tp: int = 8, remats=REMAT, sp=(False,), precision="bf16",
            optimizer="adam", reduce_in_place: bool = False) -> list[Layout]:
    """Every ``Layout`` of ``n_devices`` (dp x fsdp x tp == n, tp within ``max_tp``, one node's
    GPUs, and dividing the heads) for each remat and sp choice, skipping those the batch
    cannot split over."""
    out = []
    for tp in [t for t in range(1, max_tp + 1) if n_devices % t == 0 and shape.n_head % t == 0]:
        rest = n_devices // tp
        for fsdp in _divisors(rest):
            dp = rest // fsdp
            if shape.batch % (dp * fsdp):
                continue
            for remat in remats:
                for s in sp if tp > 1 else (False,):
                    out.append(Layout(dp, fsdp, tp, s, remat, precision, optimizer, reduce_in_place))
    return out


def smallest_fitting(n_devices: int, shape: Shape, device_memory: int, **kw) -> Plan | None:
    """The fitting plan with the least model sharding (fsdp x tp, then tp, then remat), or None."""
    rank = {r: i for i, r in enumerate(REMAT)}
    fitting = [p for p in (plan(shape, lay, device_memory=device_memory) for lay in layouts(n_devices, shape, **kw))
               if p.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.layout.fsdp * p.layout.tp, p.layout.tp, rank[p.layout.remat],
                                       p.layout.sp, p.total))
