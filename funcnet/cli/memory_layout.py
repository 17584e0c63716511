"""``funcnet memory --transformer ... --dp/--fsdp/--tp/--sp/--pp/--microbatches/--schedule/--device-memory/--layouts``:
per-device bytes of a layout."""

from __future__ import annotations

import re

from funcnet.memory import layout as _layout

__all__ = ["parse_bytes", "print_layout", "wide_console"]

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_bytes(text: str) -> int:
    """``"80GB"`` -> 80e9, ``"16GiB"`` -> 16 * 2**30, ``"141e9"`` -> 141e9."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", str(text))
    if m is None:
        raise ValueError(f"--device-memory {text!r}: expected a size such as 80GB, 141GB or 16GiB")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])


def wide_console(*tables):
    """A rich Console at least as wide as each table's natural width: piped output (80 columns unless
    COLUMNS says otherwise) or a narrow terminal gets every figure whole, never rich's "1.…"; a terminal
    narrower than the table wraps its lines instead."""
    from rich.console import Console

    console = Console()
    unbounded = console.options.update_width(10**6)  # a measure is clamped to the width it is given
    needed = max((console.measure(t, options=unbounded).maximum for t in tables), default=0)
    return Console(width=needed) if needed > console.width else console


def _shape(args) -> _layout.Shape:
    for k in ("layers", "hidden", "heads", "seq", "batch"):
        if getattr(args, k) is None or getattr(args, k) <= 0:
            raise ValueError(f"--transformer with a layout needs a positive --{k}")
    if args.vocab <= 0:
        raise ValueError("--transformer with a layout needs --vocab (the embedding is split or replicated by it)")
    return _layout.Shape(args.layers, args.hidden, args.heads, args.vocab, args.seq, args.batch, args.mlp_ratio,
                         dropout=not args.no_dropout)


def _row(plan, memory) -> list[str]:
    gb = lambda v: f"{v / 1e9:,.2f}"
    fits = "-" if plan.fits is None else ("yes" if plan.fits else "no")
    lay = plan.layout
    return [str(lay.dp), str(lay.fsdp), str(lay.tp), str(lay.pp), "yes" if lay.sp else "-", lay.remat,
            gb(plan.params), gb(plan.grads), gb(plan.reduce_buffer), gb(plan.accum_buffer), gb(plan.master),
            gb(plan.optimizer), gb(plan.activations), gb(plan.total), fits]


def _figures(plan) -> dict:
    """A plan's bytes, its layout's fields and whether it fits, for ``--json``."""
    return {**{k: v for k, v in plan._asdict().items() if k != "layout"}, "layout": plan.layout._asdict()}


def _pipeline_note(shape, lay) -> str:
    """The accounting behind a pipelined (or microbatched) plan, with its sources."""
    held = _layout.held_microbatches(lay)
    why = "every forward before any backward" if lay.schedule == "gpipe" else "P - 1 warm-up forwards, then 1F1B"
    micro = shape.batch // (lay.dp * lay.fsdp * lay.microbatches)
    return (f"pipeline: each of the {lay.pp} stages of funcnet.parallel.pipeline runs {shape.n_layer // lay.pp} of the "
            f"{shape.n_layer} layers and keeps their float32 params, grads and optimizer state plus the embeddings; "
            f"it holds {held} of the {lay.microbatches} microbatches' stage inputs ({micro} "
            f"sequence{'' if micro == 1 else 's'} each) at once ({lay.schedule}: {why}) and in each backward tick "
            f"reruns one microbatch's stage (its blocks, the embedding, head and loss)"
            + ("" if lay.microbatches == 1 or lay.accumulate_in_place else
               "; total: the larger of that rerun and the accum buffer (the microbatch's gradients before they "
               "join the sum)"))


def print_layout(args, remat_given: bool = False) -> int:
    """Print the per-device memory of the --dp/--fsdp/--tp layout (or of every layout of --layouts N) and return the
    exit status."""
    import json

    from rich.table import Table

    shape = _shape(args)
    memory = None if args.device_memory is None else parse_bytes(args.device_memory)
    common = {"precision": args.precision, "optimizer": args.optimizer,
              "reduce_in_place": getattr(args, "reduce_in_place", False)}
    pipe = {"pp": getattr(args, "pp", 1), "microbatches": getattr(args, "microbatches", 1),
            "schedule": getattr(args, "schedule", "1f1b"),
            "accumulate_in_place": getattr(args, "accumulate_in_place", False)}
    title = (f"per device (GB): {shape.n_layer} layers, hidden {shape.n_embd}, {shape.n_head} heads, vocab "
             f"{shape.vocab_size}, seq {shape.block_size}, global batch {shape.batch}, {args.optimizer}, "
             f"{args.precision}" + ("" if memory is None else f", {memory / 1e9:g} GB per device")
             + ("" if pipe["microbatches"] == 1 else f", {pipe['microbatches']} microbatches {pipe['schedule']}")
             + ("" if pipe["pp"] == 1 else ": the first pipeline stage"))
    table = Table(title=title)
    for c in ("dp", "fsdp", "tp", "pp", "sp", "remat", "params", "grads", "reduce buffer", "accum buffer", "master",
              "optimizer", "activations", "total", "fits"):
        table.add_column(c, justify="left" if c == "remat" else "right")
    if args.layouts:
        kw = dict(common, sp=(False, True), **({"remats": (args.recompute,)} if remat_given else {}))
        lays = _layout.layouts(args.layouts, shape, **kw)
        if not lays:
            raise ValueError(f"no layout of {args.layouts} devices splits the batch {shape.batch} and the "
                             f"{shape.n_head} heads")
        plans = [_layout.plan(shape, lay, device_memory=memory) for lay in lays]
        best = None if memory is None else _layout.smallest_fitting(args.layouts, shape, memory, **kw)
        if args.json:
            print(json.dumps({"device_memory": memory, "layouts": [_figures(p) for p in plans],
                              "smallest_fitting": None if best is None else _figures(best)}, indent=2))
            return 0
        for p in plans:
            table.add_row(*_row(p, memory))
        console = wide_console(table)
        console.print(table)
        if memory is not None:
            console.print("smallest fitting layout: " + (f"{best.layout} ({best.total / 1e9:.1f} GB per device)"
                                                         if best else "none fits"))
        return 0
    lay = _layout.Layout(args.dp, args.fsdp, args.tp, args.sp, args.recompute, **common, **pipe)
    plan = _layout.plan(shape, lay, device_memory=memory)
    if args.json:
        print(json.dumps({"device_memory": memory, "layouts": [_figures(plan)]}, indent=2))
        return 0
    table.add_row(*_row(plan, memory))
    console = wide_console(table)
    console.print(table)
    if lay.pp > 1 or lay.microbatches > 1:
        console.print(_pipeline_note(shape, lay))
    if memory is not None:
        console.print(f"{'fits' if plan.fits else 'does not fit'}: {plan.total / 1e9:.1f} GB of "
                      f"{memory / 1e9:g} GB per device on {lay.devices} devices")
    return 0
