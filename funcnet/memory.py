"""Training memory: what a step keeps resident, estimated and measured.

A training step holds four things: the parameters, their gradients, the
optimizer state, and the activations the backward pass keeps. ``estimate``
counts them in closed form from a parameter count, ``estimate_tree`` from a real
params pytree and optax transformation, and ``measure`` reads XLA's buffer
assignment of a compiled function, so the figure is known before anything runs.

torch counterpart: ``torch.cuda.max_memory_allocated()`` after a step (read at run
time); here the compiler reports it ahead of time, on any backend, CPU included.

Sizes are bytes (int). GB in the table is 10**9 bytes, as in "7B params x 4 bytes = 28 GB".
"""

from __future__ import annotations

import argparse
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Estimate", "Measured", "OPTIMIZER_SLOTS", "PRECISIONS", "parse_count", "dtype_bytes", "tree_bytes",
    "mlp_params", "mlp_activations", "transformer_params", "transformer_activations", "RECOMPUTE",
    "estimate", "estimate_tree", "measure", "format_table", "main",
]  # fmt: skip

# Per-parameter state arrays each optimizer keeps (same shape as the parameter):
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
        return dict(self._asdict())


class Measured(NamedTuple):
    """XLA's memory analysis of one compiled executable, in bytes.

    ``total = arguments + outputs + temps - aliased``: every buffer the executable
    needs at once, where an output written into a donated argument's buffer
    (``aliased``) is counted once. A tuple result's ``outputs`` include XLA's table
    of pointers to its elements (8 bytes each). ``code`` (generated code size) is
    not in ``total``.
    """

    arguments: int
    outputs: int
    temps: int
    aliased: int
    code: int
    total: int

    def as_dict(self) -> dict[str, int]:
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


def tree_bytes(tree: Any) -> int:
    """Sum of ``size * itemsize`` over the leaves (arrays or ``jax.ShapeDtypeStruct``s); a PRNG
    key counts its key data (8 bytes for the default threefry key)."""
    return sum(math.prod(leaf.shape) * _itemsize(leaf.dtype) for leaf in jax.tree.leaves(tree))


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):  # PRNG keys: jnp.dtype cannot read them
        return int(dtype.itemsize)
    return int(jnp.dtype(dtype).itemsize)


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


RECOMPUTE = ("none", "selective", "full")


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def transformer_params(layers: int, hidden: int, vocab: int, seq: int, *, mlp_ratio: int = 4, bias: bool = True,
                       tied: bool = True) -> int:
    """Parameters of a GPT (nanoGPT's ``GPT``, ``funcnet.gpt.GPT``), counted by shape.

    Per layer: the qkv projection ``h x 3h``, the attention output ``h x h``, the MLP's
    ``h x rh`` and ``rh x h`` (r = ``mlp_ratio``), two LayerNorm weights; with ``bias``
    also their biases and the LayerNorm biases: ``(4 + 2r) h^2 + (9 + r) h`` (12h^2 + 13h
    at r = 4). Plus token (``vocab x h``) and position (``seq x h``) embeddings, the final
    LayerNorm, and the LM head ``vocab x h`` unless ``tied`` to the token embedding.
    LLaMA-7B's shape (32 layers, h 4096, vocab 32000) is 6.6e9 by this count (LLaMA's
    SwiGLU MLP with r = 8/3 and untied head make it 6.7e9).
    """
    L, h = _positive("layers", layers), _positive("hidden", hidden)
    V, s, r = _positive("vocab", vocab), _positive("seq", seq), _positive("mlp_ratio", mlp_ratio)
    per_layer = (4 + 2 * r) * h * h + ((3 + 1 + r + 1) * h + 4 * h if bias else 2 * h)
    final_ln = 2 * h if bias else h
    return L * per_layer + V * h + s * h + final_ln + (0 if tied else V * h)


def transformer_activations(layers: int, hidden: int, heads: int, seq: int, batch: int, *, vocab: int = 0,
                            bytes_per_value: int = 2, recompute: str = "none", flash: bool = False,
                            dropout: bool = True, logits_bytes: int = 4) -> int:
    """Bytes of activations a GPT's backward pass keeps, per Korthikanti et al. 2022
    ("Reducing Activation Recomputation in Large Transformer Models", section 4).

    Per layer, with s = ``seq``, b = ``batch``, h = ``hidden``, a = ``heads`` and p =
    ``bytes_per_value`` (2 in the paper: 16-bit activations, 1-byte dropout masks):

    - attention: LayerNorm output (the qkv input) ``psbh``, Q and K ``2psbh``, softmax
      output ``p a s^2 b``, its dropout mask ``a s^2 b`` and output ``p a s^2 b``, V
      ``psbh``, the output projection's input ``psbh``, its dropout mask ``sbh``;
    - MLP: its input ``psbh``, the GELU input ``4psbh`` and output ``4psbh``, dropout mask ``sbh``;
    - the two LayerNorm inputs ``2psbh``.

    That is ``sbh (16p + 2) + a s^2 b (2p + 1)``, the paper's ``sbh (34 + 5as/h)`` at p = 2.
    ``dropout=False`` (nanoGPT's dropout 0, funcnet.gpt's default) drops the masks and the
    dropout outputs: ``16 p sbh + p a s^2 b``.

    ``recompute``: ``"none"``; ``"selective"`` recomputes the attention core (softmax,
    its dropout, the attention over V), dropping the ``a s^2 b`` terms; ``"full"`` keeps
    only each layer's input, ``p sbh`` (the paper's 2sbh), and recomputes the rest during
    the backward (one layer at a time; that working memory is not counted, as in the paper).
    ``flash``: an attention kernel that keeps no ``s x s`` matrix (FlashAttention, torch's
    ``scaled_dot_product_attention`` fused kernels) drops the ``a s^2 b`` terms too.

    Outside the layers (``vocab`` > 0 adds them, section 4.3 of the paper): the embedding
    dropout mask ``sbh`` (with ``dropout``), the final LayerNorm's input and the LM head's
    input ``2psbh``, and the logits that the cross entropy keeps, in ``logits_bytes``
    (float32 in the paper: ``4sbv``).
    """
    L, h, a = _positive("layers", layers), _positive("hidden", hidden), _positive("heads", heads)
    s, b, p = _positive("seq", seq), _positive("batch", batch), _positive("bytes_per_value", bytes_per_value)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if not isinstance(vocab, (int, np.integer)) or isinstance(vocab, bool) or vocab < 0:
        raise ValueError(f"vocab must be an int >= 0 (0 leaves out the embeddings and logits), got {vocab!r}")
    sbh, as2b = s * b * h, a * s * s * b
    mask = 1 if dropout else 0
    if recompute == "full":
        per_layer = p * sbh
    else:
        per_layer = sbh * (16 * p + 2 * mask)
        if recompute == "none" and not flash:
            per_layer += as2b * (p + mask * (p + 1))
    outside = 0
    if vocab:
        outside = mask * sbh + 2 * p * sbh + _positive("logits_bytes", logits_bytes) * s * b * int(vocab)
    return L * per_layer + outside


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


def estimate_tree(params: Any, tx: Any, *, activations: int = 0) -> Estimate:
    """Bytes of a step training ``params`` with the optax transformation ``tx``.

    params: the real pytree (arrays or ``jax.ShapeDtypeStruct``s); grads are the
    same tree in the same dtypes (what ``jax.grad`` returns); the optimizer state
    is ``tx.init(params)`` traced with ``jax.eval_shape``, so nothing is allocated
    and every leaf counts, scalars included (Adam's step count: 4 bytes).
    """
    if not hasattr(tx, "init") or not callable(tx.init):
        raise TypeError(f"tx must be an optax GradientTransformation (with .init), got {type(tx).__name__}")
    act = _check_bytes(activations)
    p = tree_bytes(params)
    opt = tree_bytes(jax.eval_shape(tx.init, params))
    return Estimate(params=p, grads=p, master=0, optimizer=opt, activations=act, total=2 * p + opt + act)


def measure(fn: Callable, *args, **kwargs) -> Measured:
    """XLA's compiled memory analysis of ``fn(*args, **kwargs)``; nothing is executed.

    ``fn``: a plain function (jitted here) or a ``jax.jit`` result, which keeps its
    options: pass ``jax.jit(step, donate_argnums=(0, 1))`` to count donation, the
    JAX counterpart of torch's in-place ``optimizer.step()``. Arguments may be
    arrays or ``jax.ShapeDtypeStruct``s. An already compiled executable
    (``jax.jit(f).lower(...).compile()``) is read as it is, with no arguments.
    """
    if hasattr(fn, "memory_analysis"):
        if args or kwargs:
            raise TypeError("measure(compiled) takes no arguments: the executable was compiled for its own")
        compiled = fn
    else:
        compiled = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args, **kwargs).compile()
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError(f"this backend ({jax.default_backend()}) gives no memory analysis for compiled code")
    arg, out = stats.argument_size_in_bytes, stats.output_size_in_bytes
    tmp, alias = stats.temp_size_in_bytes, stats.alias_size_in_bytes
    return Measured(
        arguments=int(arg), outputs=int(out), temps=int(tmp), aliased=int(alias),
        code=int(stats.generated_code_size_in_bytes), total=int(arg + out + tmp - alias),
    )  # fmt: skip


def format_table(result: Estimate | Measured, *, n_params: int | str | None = None, title: str | None = None):
    """A rich ``Table`` of an ``Estimate`` or ``Measured``: bytes, decimal size (GB = 1e9),
    binary size (GiB = 2**30), share of total and, given ``n_params``, bytes per
    parameter. Zero rows other than total are left out."""
    from rich.table import Table

    n = parse_count(n_params) if n_params is not None else None
    default = "training memory estimate" if isinstance(result, Estimate) else "XLA memory analysis"
    table = Table(title=title or default)
    for col in ("part", "bytes", "size", "binary", "share") + (("bytes/param",) if n else ()):
        table.add_column(col, justify="left" if col == "part" else "right")
    total = result.total
    for name, value in result._asdict().items():
        if value == 0 and name != "total":
            continue
        # Measured parts do not add up to total (aliased buffers are subtracted), so no share there
        share = f"{100 * value / total:.1f}%" if total and name != "total" and isinstance(result, Estimate) else ""
        row = [name, f"{value:,}", _human(value, 1000, "B"), _human(value, 1024, "iB"), share]
        if n:
            row.append(f"{value / n:.2f}")
        table.add_row(*row, style="bold" if name == "total" else None)
    return table


def _human(value: int, base: int, unit: str) -> str:
    for prefix in ("", "k" if base == 1000 else "K", "M", "G", "T"):
        if abs(value) < base or prefix == "T":
            return f"{value:.0f} B" if not prefix else f"{value:.2f} {prefix}{unit}"
        value /= base
    return ""  # pragma: no cover


def _parse_sizes(text: str) -> list[int]:
    try:
        return _sizes([int(s) for s in text.replace(",", " ").split()])
    except ValueError:
        raise ValueError(f"--sizes {text!r}: expected positive ints separated by commas, e.g. 784,128,10") from None


_COUNT_MAX = 10**30


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like funcnet train's errors, instead of argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# The batch x sequence-length grid ``funcnet memory --transformer`` prints the activation row over.
GRID_BATCH = (1, 2, 4, 8)
GRID_SEQ = (512, 1024, 2048, 4096)


def _transformer_grid(args, bytes_per_value: int) -> tuple[Any, list[tuple[int, int, int]]]:
    """A rich Table of activation GB over GRID_BATCH x GRID_SEQ, and the (batch, seq, bytes)
    cells between 20 and 50 GB (the articles' range)."""
    from rich.table import Table

    table = Table(title=f"activations (GB) by batch x sequence length: {args.layers} layers, hidden {args.hidden}, "
                        f"{args.heads} heads, {bytes_per_value}-byte values, recompute={args.recompute}"
                        f"{', flash' if args.flash else ''}; * = within the articles' 20-50 GB")
    table.add_column("batch \\ seq", justify="right")
    for s in GRID_SEQ:
        table.add_column(str(s), justify="right")
    inside = []
    for b in GRID_BATCH:
        row = []
        for s in GRID_SEQ:
            act = transformer_activations(args.layers, args.hidden, args.heads, s, b, vocab=args.vocab,
                                          bytes_per_value=bytes_per_value, recompute=args.recompute,
                                          flash=args.flash, dropout=not args.no_dropout)
            mark = 20e9 <= act <= 50e9
            inside += [(b, s, act)] if mark else []
            row.append(f"{act / 1e9:.1f}{'*' if mark else ' '}")
        table.add_row(str(b), *row)
    return table, inside


def main(argv: Sequence[str] | None = None) -> int:
    """``funcnet memory``: print the estimate table; returns the exit status."""
    from rich.console import Console

    parser = _OneLineParser(prog="funcnet memory", description="Estimate the memory of one training step.")
    parser.add_argument("--params", help="parameter count, e.g. 7B, 125M, 7e9 (default: counted from --sizes or "
                                         "the --transformer shapes)")
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_SLOTS))
    parser.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS),
                        help="bf16/fp16: half params and grads, float32 master copy and state")  # fmt: skip
    parser.add_argument("--sizes", help="MLP layer sizes for the activations, e.g. 784,128,10")
    parser.add_argument("--batch", type=int, help="batch size for the activations (with --sizes or --transformer)")
    parser.add_argument("--activations", default="0", help="activation bytes, e.g. 20e9 (instead of --sizes/--batch)")
    t = parser.add_argument_group("transformer (Korthikanti et al. 2022 activations)")
    t.add_argument("--transformer", action="store_true", help="derive the activations from a GPT's shapes")
    t.add_argument("--layers", type=int, help="number of layers, e.g. 32")
    t.add_argument("--hidden", type=int, help="hidden size, e.g. 4096")
    t.add_argument("--heads", type=int, help="attention heads, e.g. 32")
    t.add_argument("--vocab", type=int, default=0, help="vocabulary size, e.g. 32000 (adds embeddings and logits)")
    t.add_argument("--seq", type=int, help="sequence length, e.g. 2048")
    t.add_argument("--mlp-ratio", type=int, default=4, help="MLP hidden size / hidden size (default 4)")
    t.add_argument("--activation-dtype", default="bf16",
                   help="dtype of the kept activations (default bf16: the paper's 16-bit activations)")
    t.add_argument("--recompute", default="none", choices=RECOMPUTE, help="activation recomputation (default none)")
    t.add_argument("--flash", action="store_true", help="attention that keeps no s x s scores (FlashAttention)")
    t.add_argument("--no-dropout", action="store_true", help="no dropout masks (nanoGPT's dropout=0)")
    args = parser.parse_args(argv)
    grid = None
    try:
        sizes = _parse_sizes(args.sizes) if args.sizes else None
        shapes = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq")}
        if args.transformer:
            missing = [f"--{k}" for k, v in dict(shapes, batch=args.batch).items() if v is None]
            if missing:
                raise ValueError(f"--transformer needs {', '.join(missing)} (e.g. --layers 32 --hidden 4096 "
                                 f"--heads 32 --vocab 32000 --seq 2048 --batch 1)")
            if sizes is not None or args.activations != "0":
                raise ValueError("--transformer derives the activations: leave out --sizes and --activations")
            for k, v in dict(shapes, batch=args.batch, mlp_ratio=args.mlp_ratio).items():
                if v <= 0 or v > 10**7:
                    raise ValueError(f"--{k.replace('_', '-')} must be a positive integer up to 1e7, got {v}")
            if not 0 <= args.vocab <= 10**8:
                raise ValueError(f"--vocab must be an integer in [0, 1e8], got {args.vocab}")
            if args.hidden % args.heads:
                raise ValueError(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
            value_bytes = dtype_bytes(args.activation_dtype)
            counted = transformer_params(args.layers, args.hidden, max(args.vocab, 1), args.seq,
                                         mlp_ratio=args.mlp_ratio)
            n = parse_count(args.params) if args.params is not None else counted
            act = transformer_activations(args.layers, args.hidden, args.heads, args.seq, args.batch,
                                          vocab=args.vocab, bytes_per_value=value_bytes, recompute=args.recompute,
                                          flash=args.flash, dropout=not args.no_dropout)
            grid = _transformer_grid(args, value_bytes) + (args.batch, value_bytes)
            sizes, args.batch = None, None
        elif any(v is not None for v in shapes.values()):
            raise ValueError("--layers/--hidden/--heads/--seq describe a transformer: add --transformer")
        else:
            if args.params is None and sizes is None:
                raise ValueError("give --params (e.g. 7B), --sizes (e.g. 784,128,10) or --transformer shapes "
                                 "to count them from")
            n = parse_count(args.params) if args.params is not None else mlp_params(sizes)
            act = parse_count(args.activations)
            if (sizes is None) != (args.batch is None):
                raise ValueError("--sizes and --batch go together: activations need the layer sizes and the batch "
                                 "size")
        for flag, value in (("--params", n), ("--activations", act)):
            if value > _COUNT_MAX:  # past this the table's float formatting overflows
                raise ValueError(f"{flag} {getattr(args, flag[2:])} is about 1e{len(str(value)) - 1}, beyond what this table shows "
                                 f"(at most 1e30); pass a realistic size such as 7B or 20e9")
        if args.batch is not None and args.batch <= 0:
            raise ValueError(f"--batch must be a positive integer, got {args.batch}")
        kw = {} if sizes is None else {"sizes": sizes, "batch": args.batch}
        est = estimate(n, args.optimizer, activations=0 if sizes else act, **kw, **PRECISIONS[args.precision])
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    title = f"{n:,} parameters, {args.optimizer}, {args.precision}"
    console = Console()
    console.print(format_table(est, n_params=n, title=title))
    if grid is not None:
        table, inside, batch, value_bytes = grid
        if args.params is not None and n != counted:
            console.print(f"(--params {args.params} is used for the table; these shapes count {counted:,} parameters)")
        console.print(f"activations (Korthikanti et al. 2022, sbh(34 + 5as/h) bytes per layer at 16 bits; here "
                      f"{value_bytes}-byte values, recompute={args.recompute}): {act / 1e9:.1f} GB at batch {batch}, "
                      f"sequence length {args.seq}")
        console.print(table)
        cells = ", ".join(f"{b}x{s}" for b, s, _ in inside) or "none of this grid"
        console.print(f"the articles' 20-50 GB of activations: batch x sequence length {cells}")
    return 0
