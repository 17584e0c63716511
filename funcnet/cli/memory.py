"""``funcnet memory``: the estimate table, from a parameter count, MLP sizes or a GPT's shapes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from funcnet.cli.parser import join_negative_values
from funcnet.memory import (
    OPTIMIZER_SLOTS,
    PRECISIONS,
    RECOMPUTE,
    dtype_bytes,
    estimate,
    format_table,
    mlp_params,
    parse_count,
    transformer_activations,
    transformer_params,
    zero_per_device,
)
from funcnet.memory.estimate import _sizes

__all__ = ["main", "build_parser"]

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
    cells = []
    for b in GRID_BATCH:
        row = []
        for s in GRID_SEQ:
            act = transformer_activations(args.layers, args.hidden, args.heads, s, b, vocab=args.vocab,
                                          bytes_per_value=bytes_per_value, recompute=args.recompute,
                                          flash=args.flash, dropout=not args.no_dropout)
            cells.append((b, s, act))
            row.append(f"{act / 1e9:.1f}{'*' if 20e9 <= act <= 50e9 else ' '}")
        table.add_row(str(b), *row)
    return table, cells


# The most devices ``--layouts`` plans for: ten times today's largest clusters. An N past it (a typo, a byte
# count) is refused by name instead of listing layouts nobody runs.
LAYOUTS_MAX = 2**20


_PIPELINE_FLAGS = ("pp", "microbatches", "schedule", "accumulate_in_place")


def _check_layout_flags(args, given: dict) -> None:
    """``--layouts`` lists dp x fsdp x tp x sp itself; a layout counts its own parameters and activations:
    flags that would be silently dropped are refused instead."""
    if args.layouts is not None:
        if not 1 <= args.layouts <= LAYOUTS_MAX:
            raise ValueError(f"--layouts {args.layouts}: expected a number of devices from 1 to {LAYOUTS_MAX:,}")
        fixed = [f"--{k} {getattr(args, k)}" if k != "sp" else "--sp" for k in ("dp", "fsdp", "tp", "sp") if given[k]]
        if fixed:
            raise ValueError(f"--layouts {args.layouts} lists every dp x fsdp x tp (with and without sp) of "
                             f"{args.layouts} devices, so {' '.join(fixed)} contradicts it: leave "
                             f"{'them' if len(fixed) > 1 else 'it'} out, or drop --layouts to plan that one layout")
        pipe = [f"--{k.replace('_', '-')}" for k in _PIPELINE_FLAGS if given[k]]
        if pipe:
            raise ValueError(f"--layouts {args.layouts} lists dp x fsdp x tp layouts without a pipeline, so "
                             f"{' '.join(pipe)} contradicts it: drop --layouts and give --dp/--fsdp/--tp with --pp "
                             f"to plan one pipelined layout (its devices are dp x fsdp x tp x pp)")
    for k, low in (("pp", 1), ("microbatches", 1)):
        if not low <= getattr(args, k) <= LAYOUTS_MAX:
            raise ValueError(f"--{k} {getattr(args, k)}: expected an int from {low} to {LAYOUTS_MAX:,}")
    ignored = [f"--{k.replace('_', '-')}" for k in ("params", "sizes", "activations", "flash", "activation_dtype")
               if given[k]]
    if ignored:
        raise ValueError(f"{', '.join(ignored)} {'do' if len(ignored) > 1 else 'does'} not apply to a layout "
                         f"(--dp/--fsdp/--tp/--sp/--device-memory/--layouts): the planner counts parameters and "
                         f"activations from the --transformer shapes in --precision's dtypes; leave "
                         f"{'them' if len(ignored) > 1 else 'it'} out")


def _check_zero_flags(args, given: dict) -> None:
    """``--zero`` shards one data-parallel replica's bytes over ``--dp``: the layout flags describe another plan."""
    if not given["dp"]:
        raise ValueError(f"--zero {args.zero} shards over the data-parallel devices: give their number, e.g. --dp 64")
    if not 1 <= args.dp <= LAYOUTS_MAX:
        raise ValueError(f"--dp {args.dp}: expected a number of devices from 1 to {LAYOUTS_MAX:,}")
    other = [f"--{k}" for k in ("fsdp", "tp", "sp") if given[k]]
    other += [f"--{k.replace('_', '-')}" for k in ("layouts", "device_memory") if getattr(args, k) is not None]
    other += [f"--{k.replace('_', '-')}" for k in _PIPELINE_FLAGS if given[k]]
    other += ["--reduce-in-place"] * args.reduce_in_place
    if other:
        raise ValueError(f"--zero {args.zero} plans --dp {args.dp} data-parallel devices that shard the state; "
                         f"{' '.join(other)} {'describe' if len(other) > 1 else 'describes'} a dp x fsdp x tp layout "
                         f"instead (--fsdp N is ZeRO-3 there): leave {'them' if len(other) > 1 else 'it'} out, or "
                         f"drop --zero")


def _funcnet_zero(args, n: int, activations: int, batch: int | None):
    """funcnet's own ZeRO step per device (``memory.layout``): from the --transformer shapes with --batch
    sequences per device, else from the parameter count."""
    from funcnet.memory import layout

    if args.transformer:
        shape = layout.Shape(args.layers, args.hidden, args.heads, max(args.vocab, 1), args.seq,
                             batch * args.dp, args.mlp_ratio, dropout=not args.no_dropout)
        return layout.plan(shape, layout.Layout(dp=args.dp, precision=args.precision, optimizer=args.optimizer,
                                                remat=args.recompute, zero=args.zero))
    return layout.zero_plan(n, args.zero, args.dp, optimizer=args.optimizer, activations=activations)


def _funcnet_zero_table(plan, args):
    """The table of funcnet's ZeRO step per device, labelled as such."""
    from rich.table import Table

    table = Table(title=f"per device: funcnet's ZeRO-{args.zero} step over --dp {args.dp} (what it compiles on "
                        f"XLA:CPU: float32 params, whole gradients and their all-reduce buffer"
                        f"{', the gathered params' if args.zero == 3 else ''})")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    table.add_column("GB", justify="right")
    rows = [("params", plan.params), ("optimizer", plan.optimizer), ("gathered params", plan.gathered),
            ("grads", plan.grads), ("reduce buffer", plan.reduce_buffer), ("activations", plan.activations),
            ("total (peak)", plan.total)]
    for name, value in rows:
        if value or name.startswith("total"):
            table.add_row(name, f"{value:,}", f"{value / 1e9:,.2f}", style="bold" if name.startswith("total") else None)
    table.caption = ("total: params + optimizer state + gathered params + the larger of the activations and the "
                     "gradients with their all-reduce buffer (the backward frees the one as it makes the other)")
    return table


def build_parser() -> argparse.ArgumentParser:
    """The ``funcnet memory`` parser: every flag with its help and default."""
    parser = _OneLineParser(prog="funcnet memory", description="Estimate the memory of one training step.")
    parser.add_argument("--params", help="parameter count, e.g. 7B, 125M, 7e9 (default: counted from --sizes or "
                                         "the --transformer shapes)")
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_SLOTS),
                        help="its state per parameter: sgd none, momentum and the like one copy, adam and adamw two "
                             "(default %(default)s)")
    parser.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS),
                        help="bf16/fp16: half params and grads, float32 master copy and state "
                             "(default %(default)s)")  # fmt: skip
    parser.add_argument("--sizes", help="MLP layer sizes for the activations, e.g. 784,128,10 (default: none)")
    parser.add_argument("--batch", type=int,
                        help="batch size for the activations (with --sizes or --transformer; default: none)")
    parser.add_argument("--activations", default="0",
                        help="activation bytes, e.g. 20e9 (instead of --sizes/--batch; default %(default)s)")
    t = parser.add_argument_group("transformer (Korthikanti et al. 2022 activations)")
    t.add_argument("--transformer", action="store_true", help="derive the activations from a GPT's shapes")
    t.add_argument("--layers", type=int, help="number of layers, e.g. 32 (default: none; needed by --transformer)")
    t.add_argument("--hidden", type=int, help="hidden size, e.g. 4096 (default: none; needed by --transformer)")
    t.add_argument("--heads", type=int, help="attention heads, e.g. 32 (default: none; needed by --transformer)")
    t.add_argument("--vocab", type=int, default=0,
                   help="vocabulary size, e.g. 32000 (adds embeddings and logits; default %(default)s)")
    t.add_argument("--seq", type=int, help="sequence length, e.g. 2048 (default: none; needed by --transformer)")
    t.add_argument("--mlp-ratio", type=int, default=4, help="MLP hidden size / hidden size (default %(default)s)")
    t.add_argument("--activation-dtype",
                   help="dtype of the kept activations (default bf16: the paper's 16-bit activations)")
    t.add_argument("--recompute", "--remat", dest="recompute", choices=RECOMPUTE,
                   help="activation recomputation (default none)")
    t.add_argument("--flash", action="store_true", help="attention that keeps no s x s scores (FlashAttention)")
    t.add_argument("--no-dropout", action="store_true", help="no dropout masks (nanoGPT's dropout=0)")
    lay = parser.add_argument_group("parallel layout (per-device bytes; with --transformer)")
    lay.add_argument("--dp", type=int, help="data-parallel replicas (default 1)")
    lay.add_argument("--fsdp", type=int, help="FSDP / ZeRO-3 devices (default 1)")
    lay.add_argument("--tp", type=int, help="tensor-parallel devices, Megatron's split (default 1)")
    lay.add_argument("--sp", action="store_true", help="sequence parallelism in the LayerNorm/dropout regions")
    lay.add_argument("--reduce-in-place", action="store_true",
                     help="the data-parallel all-reduce writes into the gradients (torch DDP's "
                          "gradient_as_bucket_view=True): no second copy of them")
    pipe = parser.add_argument_group(
        "pipeline (per device: one stage of funcnet.parallel.pipeline as it compiles: float32 state of its L/P layers "
        "and the embeddings, the held stage inputs, one microbatch's rerun)")
    pipe.add_argument("--pp", type=int, help="pipeline stages P, each running L/P of the --layers (default 1: none)")
    pipe.add_argument("--microbatches", type=int, metavar="M",
                      help="microbatches per data replica's batch, per step (default 1)")
    pipe.add_argument("--schedule", choices=("gpipe", "1f1b"),
                      help="1f1b (default): a stage holds min(P, M) microbatches' stage inputs; gpipe: all M of "
                           "them (every forward before any backward)")
    pipe.add_argument("--accumulate-in-place", action="store_true",
                      help="microbatch gradients added into the sum in place (torch's .grad, Megatron's "
                           "gradient_accumulation_fusion): no second copy of them (default: one, as jax.vjp gives)")
    lay.add_argument("--device-memory",
                     help="memory of one device, e.g. 80GB, 141GB, 16GiB: says if it fits (default: none, not said)")
    lay.add_argument("--layouts", type=int, metavar="N",
                     help=f"list every dp x fsdp x tp layout of N devices (tp <= 8; N up to {LAYOUTS_MAX:,}), under "
                          f"--remat's policy if given (else each), and the smallest that fits (default: none)")
    z = parser.add_argument_group("ZeRO (per-device bytes of data parallelism: the formula of Rajbhandari et al. "
                                  "2020, Figure 1, and funcnet's own step)")
    z.add_argument("--zero", type=int, choices=(1, 2, 3),
                   help="shard over --dp devices the optimizer state and master copy (1), also the gradients (2), "
                        "also the parameters (3): mixed-precision Adam's (2 + 2 + K) bytes per parameter, K = 12, "
                        "become 2 + 2 + K/Nd, 2 + (2 + K)/Nd, (2 + 2 + K)/Nd; beside it funcnet's own step "
                        "(float32 params, whole gradients; with --transformer, --batch is per device) "
                        "(default: none, no sharding)")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object (bytes, as the funcnet.memory functions return "
                             "them) instead of the tables")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``funcnet memory``: print the estimate table; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(join_negative_values(list(sys.argv[1:] if argv is None else argv)))
    given = {k: getattr(args, k) is not None for k in ("dp", "fsdp", "tp", "params", "sizes", "activation_dtype",
                                                         "recompute", "pp", "microbatches", "schedule")}
    given.update(sp=args.sp, flash=args.flash, activations=args.activations != "0",
                 accumulate_in_place=args.accumulate_in_place)
    for k, default in (("dp", 1), ("fsdp", 1), ("tp", 1), ("activation_dtype", "bf16"), ("recompute", "none"),
                       ("pp", 1), ("microbatches", 1), ("schedule", "1f1b")):
        if getattr(args, k) is None:
            setattr(args, k, default)
    if args.zero is not None:
        try:
            _check_zero_flags(args, given)
        except ValueError as e:
            parser.error(str(e))
    elif args.layouts is not None or args.device_memory is not None or args.reduce_in_place \
            or any(given[k] for k in ("dp", "fsdp", "tp", "sp") + _PIPELINE_FLAGS):
        try:
            if not args.transformer:
                raise ValueError("--dp/--fsdp/--tp/--sp/--pp/--microbatches/--schedule/--reduce-in-place/"
                                 "--device-memory/--layouts need --transformer and its shapes")
            _check_layout_flags(args, given)
            from funcnet.cli.memory_layout import print_layout

            return print_layout(args, remat_given=given["recompute"])
        except (ValueError, TypeError) as e:
            parser.error(str(e))
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
        per_device = None if args.zero is None else zero_per_device(est, args.zero, args.dp)
        ours = None if args.zero is None else _funcnet_zero(args, n, est.activations, None if grid is None else grid[2])
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    if args.json:
        figures = {"parameters": n, "optimizer": args.optimizer, "precision": args.precision, "bytes": est.as_dict()}
        if grid is not None:
            figures.update(counted_parameters=counted, activations={"bytes": act, "batch": grid[2], "seq": args.seq},
                           grid=[{"batch": b, "seq": s, "bytes": v} for b, s, v in grid[1]])
        if per_device is not None:
            figures.update(zero=args.zero, dp=args.dp, per_device=per_device.as_dict(),
                           funcnet_per_device={k: v for k, v in ours._asdict().items() if k not in ("fits", "layout")})
        print(json.dumps(figures, indent=2))
        return 0
    from funcnet.cli.memory_layout import wide_console

    title = f"{n:,} parameters, {args.optimizer}, {args.precision}"
    table = format_table(est, n_params=n, title=title)
    ours_table = None if per_device is None else _funcnet_zero_table(ours, args)
    console = wide_console(table, *([] if grid is None else [grid[0]]), *([] if ours_table is None else [ours_table]))
    console.print(table)
    if per_device is not None:
        console.print(format_table(per_device, n_params=n, title=f"per device: the ZeRO paper's formula, ZeRO-{args.zero} over --dp "
                                                                     f"{args.dp} (Rajbhandari et al. 2020)"))
        formula = {1: "2Ψ + 2Ψ + KΨ/Nd", 2: "2Ψ + (2 + K)Ψ/Nd", 3: "(2 + 2 + K)Ψ/Nd"}[args.zero]
        console.print(f"ZeRO-{args.zero} (Rajbhandari et al. 2020, Figure 1: {formula}, Ψ parameters, K bytes of "
                      f"optimizer state, Nd = {args.dp} devices): {per_device.total / 1e9:.1f} GB per device, "
                      f"{est.total / 1e9:.1f} GB without ZeRO")
        console.print(ours_table)
    if grid is not None:
        table, cells, batch, value_bytes = grid
        inside = [(b, s, v) for b, s, v in cells if 20e9 <= v <= 50e9]
        if args.params is not None and n != counted:
            console.print(f"(--params {args.params} is used for the table; these shapes count {counted:,} parameters)")
        console.print(f"activations (Korthikanti et al. 2022, sbh(34 + 5as/h) bytes per layer at 16 bits; here "
                      f"{value_bytes}-byte values, recompute={args.recompute}): {act / 1e9:.1f} GB at batch {batch}, "
                      f"sequence length {args.seq}")
        console.print(table)
        cells = ", ".join(f"{b}x{s}" for b, s, _ in inside) or "none of this grid"
        console.print(f"the articles' 20-50 GB of activations: batch x sequence length {cells}")
    return 0
