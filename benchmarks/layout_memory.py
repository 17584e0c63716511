"""The layout planner against XLA's memory analysis: one small GPT's train step on 8 simulated-CPU layouts.

``python benchmarks/layout_memory.py`` prints the memory guide's planner-vs-measured table: for
each ``(data, fsdp, model)`` mesh, the compiled step's per-device arguments and temps
(``compiled.memory_analysis()``) against ``funcnet.memory.layout.plan``'s params + Adam
state and its gradients + gradient reduction buffer + activations, and the collectives the
compiled HLO holds (``parallel.tensor.collective_stats``). The largest all-reduce and
all-gather per layout say what XLA moves: the gradients (one combined all-reduce over the
data axis), the weights (FSDP's all-gather) or the batch's activations.

``--dump DIR`` writes each layout's compiled HLO next to it (``DIR/hlo_<d><f><m>.txt``);
``XLA_FLAGS=--xla_dump_to=DIR`` gives XLA's own buffer assignment and live ranges; ``--json PATH``
writes the rows.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYOUTS = [
    (1, 1, 1),
    (2, 1, 1),
    (1, 1, 2),
    (1, 1, 4),
    (2, 1, 2),
    (1, 2, 1),
    (1, 2, 2),
    (1, 4, 1),
]
CONFIG = {
    "block_size": 8,
    "vocab_size": 128,
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 128,
    "dropout": 0.0,
}
BATCH = 4  # global, split over data x fsdp

_OP = re.compile(r"= ([^=\n]*?) (all-reduce|all-gather)\(")
_SHAPE = re.compile(r"\b(f32|s32|pred)\[([0-9,]*)\]")


def _largest(text: str, op: str) -> str:
    """The collective ``op`` of the HLO that moves the most: its result shape, or for a combined
    (tuple) one the count of its arrays and their bytes."""
    text = re.sub(r"/\*index=\d+\*/", "", text)
    best, best_bytes = "-", -1
    for m in _OP.finditer(text):
        if m.group(2) != op:
            continue
        shapes = _SHAPE.findall(m.group(1))
        nbytes = sum(
            (1 if t == "pred" else 4) * math.prod(int(d) for d in dims.split(",") if d)
            for t, dims in shapes
        )
        if nbytes > best_bytes:
            best_bytes = nbytes
            best = (
                f"{shapes[0][0]}[{shapes[0][1]}]"
                if len(shapes) == 1
                else f"{len(shapes)} arrays, {nbytes:,} B"
            )
    return best


def measure(layouts=LAYOUTS, dump: Path | None = None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import gpt
    from funcnet import step as fstep
    from funcnet.parallel import tensor as tp
    from funcnet.memory import layout

    base, tx = gpt.GPTConfig(**CONFIG), optax.adam(1e-3)
    shape = layout.Shape(
        base.n_layer, base.n_embd, base.n_head, base.vocab_size, base.block_size, BATCH
    )
    batch = (jax.ShapeDtypeStruct((BATCH, base.block_size), jnp.int32),) * 2
    rows = []
    for d, f, m in layouts:
        cfg = base._replace(qkv_groups=m)
        model = gpt.GPT(cfg)
        abstract = jax.eval_shape(
            functools.partial(fstep.create_train_state, model, tx), jax.random.key(0)
        )
        step = tp.make_tp_step(
            model, tx, mesh=tp.mesh(d, f, m), state=abstract, config=cfg
        )
        compiled = step.lower(abstract, batch).compile()
        stats, text = compiled.memory_analysis(), compiled.as_text()
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"hlo_{d}{f}{m}.txt").write_text(text)
        p = layout.plan(shape, layout.Layout(d, f, m))
        c = tp.collective_stats(text)
        rows.append(
            {
                "layout": (d, f, m),
                "arguments": int(stats.argument_size_in_bytes),
                "temps": int(stats.temp_size_in_bytes),
                "plan": p._asdict() | {"layout": str(p.layout)},
                "all-reduce": c["all-reduce"],
                "all-gather": c["all-gather"],
                "largest all-reduce": _largest(text, "all-reduce"),
                "largest all-gather": _largest(text, "all-gather"),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| (data, fsdp, model) | arguments | planned params + Adam | temps | planned grads + reduce buffer "
        "+ activations | measured total | planned total | deviation |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["plan"]
        measured = r["arguments"] + r["temps"]
        state = p["params"] + p["optimizer"]
        out.append(
            f"| {r['layout']} | {r['arguments']:,} | {state:,} | {r['temps']:,} | {p['grads']:,} + "
            f"{p['reduce_buffer']:,} + {p['activations']:,} | {measured:,} | {p['total']:,} | "
            f"{measured / p['total'] - 1:+.1%} |"
        )
    return "\n".join(out)


def collectives(rows: list[dict]) -> str:
    out = [
        "(data, fsdp, model)  all-reduces (bytes)               largest one  all-gathers (bytes)              largest one"
    ]
    for r in rows:
        ar, ag = r["all-reduce"], r["all-gather"]
        out.append(
            f"{r['layout']!s:19s}  {ar['count']:3d} ({ar['bytes']:>10,})  {r['largest all-reduce']:>22s}  "
            f"{ag['count']:3d} ({ag['bytes']:>10,})  {r['largest all-gather']:>22s}"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dump", type=Path, help="write each layout's compiled HLO here"
    )
    parser.add_argument("--json", type=Path, help="write the rows the tables print to this JSON file")
    args = parser.parse_args(argv)
    from funcnet import parallel

    parallel.simulate_cpu_devices(
        max(d * f * m for d, f, m in LAYOUTS)
    )  # before JAX starts
    rows = measure(dump=args.dump)
    print(
        f"GPT {CONFIG}, global batch {BATCH}, Adam, float32, no remat; bytes per device "
        f"(XLA's memory analysis of the compiled step vs funcnet.memory.layout.plan)\n"
    )
    print(table(rows))
    within = sum(
        abs((r["arguments"] + r["temps"]) / r["plan"]["total"] - 1) <= 0.10
        for r in rows
    )
    print(f"\n{within} of {len(rows)} layouts within 10%\n")
    print(collectives(rows))
    if args.json:  # layouts as lists; table() takes them back as tuples
        args.json.write_text(json.dumps({"config": str(CONFIG), "batch": BATCH, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
