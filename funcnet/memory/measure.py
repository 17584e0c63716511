"""What XLA says a compiled step needs (``measure``), the bytes of real pytrees
(``estimate_tree``), and the table both are printed as."""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from funcnet.memory.estimate import Estimate, _check_bytes, parse_count


class Measured(NamedTuple):
    """XLA's memory analysis of one compiled executable, in bytes.

    ``total = arguments + outputs + temps - aliased``: every buffer the executable
    needs at once, where an output written into a donated argument's buffer
    (``aliased``) is counted once. A tuple result's ``outputs`` include XLA's table
    of pointers to its elements (8 bytes each). ``code`` (generated code size; of code
    built without LLVM's optimizations where ``measure`` compiled it, see
    ``compile_to_read``) is not in ``total``.
    """

    arguments: int
    outputs: int
    temps: int
    aliased: int
    code: int
    total: int

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict of bytes."""
        return dict(self._asdict())


def tree_bytes(tree: Any) -> int:
    """Sum of ``size * itemsize`` over the leaves (arrays or ``jax.ShapeDtypeStruct``s); a PRNG
    key counts its key data (8 bytes for the default threefry key)."""
    return sum(math.prod(leaf.shape) * _itemsize(leaf.dtype) for leaf in jax.tree.leaves(tree))


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):  # PRNG keys: jnp.dtype cannot read them
        return int(dtype.itemsize)
    return int(jnp.dtype(dtype).itemsize)


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


def compile_to_read(lowered):
    """Compile ``lowered`` (``jax.jit(f).lower(...)``) to read what XLA made of it (memory
    analysis, optimized HLO, collectives), not to run it.

    On CPU the machine code is generated without LLVM's optimizations
    (``xla_backend_optimization_level=0``): XLA's HLO passes and buffer assignment, all
    that a reader sees, come before code generation and are the same
    (``tests/test_memory.py`` checks both against a default compile), and the compile takes
    about half the time. The executable runs correctly, only slower; call it once at
    most. Other backends compile as ``lowered.compile()`` does.
    """
    if jax.default_backend() == "cpu":
        return lowered.compile(compiler_options={"xla_backend_optimization_level": 0})
    return lowered.compile()


def measure(fn: Callable, *args, **kwargs) -> Measured:
    """XLA's compiled memory analysis of ``fn(*args, **kwargs)``; nothing is executed
    (compiled by ``compile_to_read``).

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
        compiled = compile_to_read((fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args, **kwargs))
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
