"""The bubble and the activation memory of funcnet.parallel.pipeline's GPipe and 1F1B schedules, as a table.

For each (stages P, microbatches M, schedule): the bubble counted in the table the pipeline runs
(idle slots / all slots) beside GPipe's closed form (P - 1) / (M + P - 1); how many microbatches'
stage inputs a stage holds at once (read off the table); and XLA's compiled temps of one
stage's program (``funcnet.memory.measure``, nothing runs) with what the held inputs come to.
GPipe's temps grow by one stage input per microbatch, 1F1B's stay put: the last column is the
temps minus those of the same schedule with the fewest microbatches of the run, against the
held inputs' difference. Simulated CPU devices (set here before JAX starts).

    python benchmarks/pipeline.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from fractions import Fraction
from pathlib import Path

STAGES_MICRO = [(2, 2), (2, 4), (2, 8), (4, 4), (4, 8), (4, 16)]
QUICK = [(2, 2), (2, 4)]


def measure(cases, *, rows: int = 2, n_embd: int = 32, block_size: int = 16) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from funcnet import gpt, memory
    from funcnet.parallel import pipeline as pp

    out, base = [], {}
    for stages, micro in cases:
        cfg = gpt.GPTConfig(block_size, 64, stages, 2, n_embd)  # one block per stage
        params = jax.eval_shape(gpt.GPT(cfg).init, jax.random.key(0))
        rest, blocks = jax.eval_shape(pp.split_params, params)
        idx = jax.ShapeDtypeStruct((rows * micro, block_size), jnp.int32)
        slot = rows * block_size * n_embd * 4  # one microbatch's stage input, float32
        for kind in pp.KINDS:
            vg = pp.make_value_and_grad(cfg, pp.mesh(stages), micro, kind)
            s = vg.schedule
            temps = memory.measure(vg, rest, blocks, idx, idx).temps
            idle = int((s.table[:, :, 0] == pp.IDLE).sum())
            first = base.setdefault((stages, kind), (temps, s.held))
            out.append({"stages": stages, "microbatches": micro, "schedule": kind, "ticks": s.ticks, "idle": idle,
                        "bubble": idle / (s.ticks * stages), "gpipe_formula": (stages - 1) / (micro + stages - 1),
                        "bubble_equal": Fraction(idle, s.ticks * stages) == Fraction(stages - 1, micro + stages - 1),
                        "held": s.held, "slot_bytes": slot, "temps": temps, "temps_growth": temps - first[0],
                        "held_growth_bytes": (s.held - first[1]) * slot})
    return out


def table(rows: list[dict]) -> str:
    lines = [("| P | M | schedule | ticks | idle slots | bubble | (P-1)/(M+P-1) | inputs held | temps (bytes) | "
             "temps growth | held growth |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stages']} | {r['microbatches']} | {r['schedule']} | {r['ticks']} | {r['idle']} | "
                     f"{r['bubble']:.3f} | {r['gpipe_formula']:.3f} | {r['held']} | {r['temps']:,} | "
                     f"{r['temps_growth']:,} | {r['held_growth_bytes']:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small cases (the smoke test)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    cases = QUICK if args.quick else STAGES_MICRO
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={max(p for p, _ in cases)}"
    rows = measure(cases)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    bad = [r for r in rows if not r["bubble_equal"] or r["temps_growth"] != r["held_growth_bytes"]]
    for r in bad:
        print(f"MISMATCH: {r}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
