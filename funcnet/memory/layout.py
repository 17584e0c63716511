"""Per-device bytes of a GPT's training step under a parallel layout: data x FSDP x tensor x pipeline parallel.

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
- pipeline parallelism (``pp`` stages, ``microbatches`` M, ``schedule`` "gpipe" or "1f1b"): one stage of
  ``funcnet.parallel.pipeline.make_step`` as XLA compiles it (every stage holds the same): float32 params,
  gradients and optimizer state (the pipeline has no precision policy) of its ``L / pp`` blocks plus the
  embeddings and final LayerNorm, which every stage keeps; the stage inputs it holds
  (``held_microbatches``: ``min(pp, M)`` under 1F1B, M under GPipe, each ``b / M x s x h`` float32) and
  one slot for the gradient from the next stage; and in a backward tick the rerun of one microbatch's
  stage (``funcnet_activations`` of its blocks, and the embedding, head and loss, which every stage
  computes on every tick). The rerun's activations die as it makes the microbatch's gradients
  (``accum_buffer``: ``jax.vjp`` returns the stage's whole gradients, then added into the running sum;
  ``Layout(accumulate_in_place=True)`` drops it), so the total counts the larger of the two. With
  ``pp == 1`` and M > 1 (gradient accumulation) one microbatch's activations are held (M under "gpipe").
- funcnet's ZeRO steps (``zero`` = 0, 1, 2 or 3 over ``dp`` devices, a 1-D mesh:
  ``parallel.zero.make_zero_step``, ``parallel.fsdp.make_fsdp_step(zero=0 | 3)``) as XLA:CPU compiles them:
  float32 params (funcnet's bf16 policy keeps them float32 and casts them for the compute), whole up to
  stage 2, split from stage 3; the optimizer state split from stage 1; arrays split by
  ``fsdp.param_spec``'s rule (``held_elements``); the gradients whole at every stage with the second
  buffer of their all-reduce (stage 2's constraint compiles to the whole sum and a slice on CPU); stage 3
  also the params gathered whole (``gathered``); activations ``funcnet_activations`` of the batch slice.
  The total is the state plus the larger of the activations and the gradients with their buffer (the
  backward frees the one as it makes the other). ``zero_plan`` does the same from a parameter count.
  Checked against the compiled steps by ``benchmarks/parallel_step.py --cpu 4`` (every row within 10%).
- otherwise (``dp x fsdp x tp`` without ``zero``) the sum of the parts, in Megatron's and the ZeRO paper's
  terms (half-precision params with a float32 master copy under "bf16"/"fp16").

Not counted: the working memory of recomputation (with ``remat="full"``), XLA's temporaries, the batch
itself.

``fits``: whether the total is within ``device_memory`` bytes. ``layouts(n)`` lists the
(dp, fsdp, tp) that multiply to n; ``smallest_fitting`` picks the one with the least model
sharding (fsdp x tp, then tp) that fits: the least communication.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from funcnet.memory.estimate import OPTIMIZER_SLOTS, PRECISIONS, dtype_bytes

__all__ = ["REMAT", "SCHEDULES", "ZERO_STAGES", "Layout", "Plan", "Shape", "funcnet_activations", "gpt_arrays",
           "held_elements", "held_microbatches", "layouts", "plan", "smallest_fitting", "zero_plan"]

REMAT = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b")
ZERO_STAGES = (0, 1, 2, 3)  # funcnet.parallel.pipeline.KINDS, named here so planning never imports jax


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
    """A parallel layout: data-parallel replicas, FSDP shards and tensor-parallel ways (``sp``: sequence
    parallelism)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    sp: bool = False
    remat: str = "none"
    precision: str = "fp32"
    optimizer: str = "adam"
    reduce_in_place: bool = False  # True: the dp all-reduce writes into the gradients (no reduce_buffer)
    pp: int = 1  # pipeline stages
    microbatches: int = 1  # per data replica's batch, per step
    schedule: str = "1f1b"  # "gpipe" or "1f1b" (with microbatches > 1)
    accumulate_in_place: bool = False  # True: microbatch gradients added into the sum in place (no accum_buffer)
    zero: int | None = None  # funcnet's ZeRO step over the dp devices: 0 (replicated), 1, 2 or 3 (module docstring)

    @property
    def devices(self) -> int:
        """The devices the layout uses: dp x fsdp x tp x pp."""
        return self.dp * self.fsdp * self.tp * self.pp

    def __str__(self) -> str:
        extra = ", sp" if self.sp else ""
        pipe = f" x pp{self.pp}" if self.pp > 1 else ""
        micro = f", {self.microbatches} microbatches {self.schedule}" if self.microbatches > 1 else ""
        if self.zero is not None:
            return f"ZeRO-{self.zero} over dp{self.dp}, remat {self.remat}"
        return f"dp{self.dp} x fsdp{self.fsdp} x tp{self.tp}{pipe}{extra}, remat {self.remat}{micro}"


class Plan(NamedTuple):
    """Bytes on each device (the first pipeline stage's with ``pp > 1``; ``reduce_buffer``: the second
    copy of the gradients at the data-parallel all-reduce, ``accum_buffer``: the one of a
    microbatch's gradients before they join the sum, module docstring); ``fits`` is None without
    a device memory."""

    params: int
    grads: int
    master: int
    optimizer: int
    activations: int
    reduce_buffer: int
    accum_buffer: int
    total: int
    fits: bool | None
    layout: Layout
    gathered: int = 0  # ZeRO-3: the whole params all-gathered for the forward and backward

    def as_dict(self) -> dict:
        """The fields as a plain dict, the layout as its text."""
        return {k: v for k, v in self._asdict().items() if k != "layout"} | {"layout": str(self.layout)}


def held_microbatches(layout: Layout) -> int:
    """Microbatches whose activations the first stage holds at once: all M under GPipe (every
    forward before any backward), ``min(pp, M)`` under 1F1B (``pp - 1`` warm-up forwards, then one
    forward and one backward in turn); ``funcnet.parallel.pipeline.schedule(...).held`` counts the same."""
    return layout.microbatches if layout.schedule == "gpipe" else min(layout.pp, layout.microbatches)


def _check(shape: Shape, layout: Layout) -> None:
    for name in ("dp", "fsdp", "tp", "pp", "microbatches"):
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
    if layout.zero is not None:
        if isinstance(layout.zero, bool) or layout.zero not in ZERO_STAGES:
            raise ValueError(f"layout: zero must be one of {ZERO_STAGES} (funcnet's ZeRO step over the dp devices) "
                             f"or None, got {layout.zero!r}")
        other = [f"{k}={getattr(layout, k)}" for k in ("fsdp", "tp", "pp", "microbatches") if getattr(layout, k) != 1]
        if other or layout.sp:
            raise ValueError(f"layout: zero={layout.zero} plans funcnet's ZeRO step on a 1-D mesh of dp devices; "
                             f"{', '.join(other + ['sp'] * layout.sp)} describe another program: leave them at 1 "
                             f"(fsdp=N alone is the dp x fsdp x tp planner's ZeRO-3)")
    if layout.schedule not in SCHEDULES:
        raise ValueError(f"layout: schedule must be one of {SCHEDULES}, got {layout.schedule!r}")
    if shape.n_layer % layout.pp:
        raise ValueError(f"layout: pp={layout.pp} stages do not split the {shape.n_layer} layers (each stage runs "
                         f"n_layer / pp of them); pick pp among the divisors of {shape.n_layer}")
    replica = shape.batch // (layout.dp * layout.fsdp)
    if replica % layout.microbatches:
        raise ValueError(f"layout: the batch of {replica} sequences per data replica (global batch {shape.batch} "
                         f"over dp x fsdp = {layout.dp * layout.fsdp}) does not split into microbatches="
                         f"{layout.microbatches}; pick a batch that is a multiple of {layout.microbatches * layout.dp * layout.fsdp} "
                         f"or a microbatch count dividing {replica}")


def _param_count(shape: Shape, layout: Layout) -> float:
    """Parameters one device holds (fractional: a shard of a count)."""
    L, h, r, t, f = shape.n_layer // layout.pp, shape.n_embd, shape.mlp_ratio, layout.tp, layout.fsdp
    matrices = (4 + 2 * r) * h * h / (t * f)
    column_bias = (3 + r) * h / t if shape.bias else 0  # split with their column-parallel weights
    whole = (2 * h + 2 * h) if shape.bias else 2 * h  # two LayerNorms
    whole += 2 * h if shape.bias else 0  # the row-parallel biases, added after the all-reduce
    embeddings = shape.vocab_size * h / (t * f) + shape.block_size * h / f  # wte split by vocab, wpe by fsdp
    final_ln = 2 * h if shape.bias else h
    return L * (matrices + column_bias + whole) + embeddings + final_ln


def _activations(shape: Shape, layout: Layout, p: int) -> float:
    s, h, a, t = shape.block_size, shape.n_embd, shape.n_head, layout.tp
    b = shape.batch // (layout.dp * layout.fsdp * layout.microbatches)  # one microbatch
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
    held = held_microbatches(layout)
    outside = (mask * sbh + 2 * p * sbh) / (t if layout.sp else 1) + 4 * s * b * shape.vocab_size / t
    return held * (shape.n_layer * per_layer + outside)


# ---------------------------------------------------------------------------- funcnet's own programs
# What XLA compiles for funcnet's ZeRO steps (``Layout(zero=...)``) and pipeline (``pp > 1``), checked on CPU
# against the compiled steps of benchmarks/parallel_step.py.

MIN_SIZE = 1024  # funcnet.parallel.fsdp.MIN_SIZE: an array with fewer elements stays whole on every device
PARAM_BYTES = 4  # funcnet keeps float32 params under every precision policy (bf16 casts them for the compute)


def gpt_arrays(shape: Shape) -> list[tuple[int, ...]]:
    """The shapes of ``funcnet.gpt.GPT``'s parameter arrays (the LM head tied to ``wte``)."""
    h, rh, L = shape.n_embd, shape.mlp_ratio * shape.n_embd, shape.n_layer
    block = [(3 * h, h), (h, h), (rh, h), (h, rh), (h,), (h,)]  # c_attn, attn c_proj, c_fc, mlp c_proj, ln_1/2
    if shape.bias:
        block += [(3 * h,), (h,), (rh,), (h,), (h,), (h,)]  # the Linears' biases, the LayerNorms' biases
    rest = [(shape.vocab_size, h), (shape.block_size, h), (h,)] + ([(h,)] if shape.bias else [])
    return block * L + rest


def held_elements(arrays, n: int, *, min_size: int = MIN_SIZE) -> int:
    """Elements one of ``n`` devices holds of ``arrays`` placed by ``funcnet.parallel.fsdp.param_spec``: an
    array of at least ``min_size`` elements is split ``n`` ways along an axis ``n`` divides; when none does,
    along its largest axis of at least ``n`` entries padded to a multiple of ``n`` (as FSDP2), each device
    holding ``ceil(d / n)`` of its ``d`` rows; it stays whole when it is smaller or no axis has ``n`` entries."""
    total = 0
    for a in arrays:
        size = math.prod(a)
        if n == 1 or size < min_size:
            total += size
        elif any(d % n == 0 for d in a):
            total += size // n
        elif any(d >= n for d in a):
            d = max(a)
            total += size // d * -(-d // n)
        else:
            total += size
    return total


def funcnet_activations(shape: Shape, batch: int, p: int, remat: str = "none", layers: int | None = None) -> int:
    """Bytes of activations the backward of ``funcnet.gpt.GPT`` keeps for ``batch`` sequences of ``layers``
    blocks (default all) plus the embedding, the head and the loss, at ``p`` bytes a value.

    Without remat what JAX's autodiff saves (``jax.ad_checkpoint.print_saved_residuals``): per layer
    20 s b h + 3 a s^2 b values, the paper's 16 s b h + a s^2 b (Korthikanti et al. 2022, no dropout;
    the GELU keeps its derivative, ``nn.functional.gelu``'s ``custom_jvp``, where the paper counts its
    input) and beside them the LayerNorms' centred and normalised inputs (4 s b h) and the masked
    scores and their exp (2 a s^2 b). ``GPT(remat="selective" | "full")`` keeps the
    paper's lists (16 s b h; s b h). Outside the blocks: 2 s b h (the final LayerNorm's input and output) and
    3 s b V float32 values (the logits, their softmax and its gradient)."""
    s, h, a, V = shape.block_size, shape.n_embd, shape.n_head, shape.vocab_size
    L = shape.n_layer if layers is None else layers
    sbh, as2b, mask = s * batch * h, a * s * s * batch, 1 if shape.dropout else 0
    if remat == "full":
        per_layer = p * sbh
    elif remat == "selective":
        per_layer = sbh * (16 * p + 2 * mask)
    else:
        per_layer = 20 * p * sbh + 3 * p * as2b + mask * (2 * sbh + as2b * (p + 1))
    return L * per_layer + 2 * p * sbh + mask * sbh + 3 * 4 * s * batch * V


def _zero_plan(shape: Shape, layout: Layout, device_memory: int | None) -> Plan:
    """``funcnet.parallel.zero.make_zero_step`` (stages 1, 2) and ``fsdp.make_fsdp_step(zero=0 | 3)`` over
    ``dp`` devices, as XLA:CPU compiles them (module docstring)."""
    n, z = layout.dp, layout.zero
    arrays = gpt_arrays(shape)
    whole, shard = held_elements(arrays, 1), held_elements(arrays, n)
    slots = OPTIMIZER_SLOTS[layout.optimizer]
    act_b = 2 if layout.precision in ("bf16", "fp16") else 4
    parts = {"params": (shard if z == 3 else whole) * PARAM_BYTES, "grads": whole * PARAM_BYTES, "master": 0,
             "optimizer": slots * (shard if z >= 1 else whole) * PARAM_BYTES,
             "activations": funcnet_activations(shape, shape.batch // n, act_b, layout.remat)}
    parts["reduce_buffer"] = parts["grads"] if n > 1 and not layout.reduce_in_place else 0
    parts["accum_buffer"] = 0
    gathered = whole * PARAM_BYTES if z == 3 and n > 1 else 0
    # the activations die as the backward makes the gradients: the peak is the larger of the two
    total = (parts["params"] + parts["optimizer"] + gathered
             + max(parts["activations"], parts["grads"] + parts["reduce_buffer"]))
    fits = None if device_memory is None else total <= device_memory
    return Plan(**parts, total=total, fits=fits, layout=layout, gathered=gathered)


def zero_plan(n_params: int, stage: int, dp: int, *, optimizer: str = "adam", activations: int = 0) -> Plan:
    """funcnet's ZeRO ``stage`` step over ``dp`` devices from a parameter count alone: ``_zero_plan``'s
    accounting with every array split evenly (no shapes to apply ``fsdp.param_spec``'s rule to) and
    ``activations`` bytes per device as given. Beside ``memory.zero_per_device`` (the ZeRO paper's
    half-precision params and gradients): float32 params, whole gradients and their all-reduce buffer at
    every stage, ZeRO-3's gathered params."""
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be a positive int (the devices ZeRO shards over), got {dp!r}")
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_SLOTS)}, got {optimizer!r}")
    whole = n_params * PARAM_BYTES
    shard = math.ceil(n_params / dp) * PARAM_BYTES
    parts = {"params": shard if stage == 3 else whole, "grads": whole, "master": 0,
             "optimizer": OPTIMIZER_SLOTS[optimizer] * (shard if stage >= 1 else whole),
             "activations": int(activations), "reduce_buffer": whole if dp > 1 else 0, "accum_buffer": 0}
    gathered = whole if stage == 3 and dp > 1 else 0
    total = parts["params"] + parts["optimizer"] + gathered + max(parts["activations"],
                                                                 parts["grads"] + parts["reduce_buffer"])
    return Plan(**parts, total=total, fits=None, layout=Layout(dp=dp, optimizer=optimizer, zero=stage),
                gathered=gathered)


def _pipeline_plan(shape: Shape, layout: Layout, device_memory: int | None) -> Plan:
    """``funcnet.parallel.pipeline.make_step`` on one stage (every stage holds the same): module docstring."""
    n = _param_count(shape, layout)
    t = layout.tp if layout.sp else 1
    micro = shape.batch // (layout.dp * layout.fsdp * layout.microbatches)
    stage_input = micro * shape.block_size * shape.n_embd * PARAM_BYTES / t  # the stage's dtype: its params'
    inputs = (held_microbatches(layout) + 1) * stage_input  # the held inputs and one output-gradient slot
    rerun = funcnet_activations(shape, micro, PARAM_BYTES, layout.remat, shape.n_layer // layout.pp) / layout.tp
    parts = {"params": n * PARAM_BYTES, "grads": n * PARAM_BYTES, "master": 0,
             "optimizer": n * OPTIMIZER_SLOTS[layout.optimizer] * PARAM_BYTES, "activations": inputs + rerun}
    parts["reduce_buffer"] = parts["grads"] if layout.dp > 1 and not layout.reduce_in_place else 0
    parts["accum_buffer"] = parts["grads"] if layout.microbatches > 1 and not layout.accumulate_in_place else 0
    parts = {k: round(v) for k, v in parts.items()}
    # a backward tick: the rerun's activations die as it makes the microbatch's gradients
    total = (parts["params"] + parts["optimizer"] + parts["grads"] + parts["reduce_buffer"] + round(inputs)
             + max(round(rerun), parts["accum_buffer"]))
    fits = None if device_memory is None else total <= device_memory
    return Plan(**parts, total=total, fits=fits, layout=layout)


def plan(shape: Shape, layout: Layout = Layout(), *, device_memory: int | None = None) -> Plan:
    """Per-device bytes of one training step of the GPT ``shape`` under ``layout`` (module docstring)."""
    _check(shape, layout)
    if layout.zero is not None:
        return _zero_plan(shape, layout, device_memory)
    if layout.pp > 1:
        return _pipeline_plan(shape, layout, device_memory)
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
    parts["accum_buffer"] = parts["grads"] if layout.microbatches > 1 and not layout.accumulate_in_place else 0
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
