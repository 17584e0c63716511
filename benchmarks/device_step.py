"""A bf16 GPT train step on 1 and N devices: tokens/s, model FLOPs utilisation (MFU) against the
device's bf16 peak, and ``memory.layout.plan`` against the measured peak (``memory_stats()``).

``python benchmarks/device_step.py`` (on a GPU or TPU; run by ``benchmarks/device_check.sh``);
``--tiny`` runs a 1-layer model on whatever JAX has (the CPU path the tests run).
FLOPs per token: 6 N + 12 L h s (nanoGPT's ``estimate_mfu``, PaLM's appendix B).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import gpt
from funcnet import step as fstep
from funcnet.parallel import tensor as tp
from funcnet.memory import layout

# dense bf16 peak FLOP/s per device, by jax's device_kind (vendor data sheets)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "TPU v4": 275e12,
             "TPU v5e": 197e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12}


def peak(kind: str) -> float | None:
    return next((v for k, v in PEAK_BF16.items() if k.lower() in kind.lower()), None)


def run(cfg: gpt.GPTConfig, per_device_batch: int, n: int, steps: int) -> dict:
    model, tx = gpt.GPT(cfg, dtype=jnp.bfloat16), optax.adamw(3e-4)
    state = fstep.create_train_state(model, tx, jax.random.key(0))
    step = tp.make_tp_step(model, tx, mesh=tp.mesh(data=n), state=state)
    state = jax.device_put(state, step.shardings)
    rng = np.random.default_rng(0)
    b = per_device_batch * n
    x = jax.device_put(rng.integers(0, cfg.vocab_size, (b, cfg.block_size)).astype(np.int32), step.batch_sharding)
    state, m = step(state, (x, x))  # compile
    jax.block_until_ready(m)
    start = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, (x, x))
    jax.block_until_ready(m)
    seconds = (time.perf_counter() - start) / steps
    n_params = sum(int(a.size) for a in jax.tree.leaves(state.params))
    flops = (6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size) * b * cfg.block_size
    stats = jax.devices()[0].memory_stats() or {}
    shape = layout.Shape(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.block_size, b)
    planned = layout.plan(shape, layout.Layout(dp=n, precision="fp32"))
    # bf16 params, grads and Adam state (the model's dtype throughout): half the fp32 plan's state,
    # activations at 2 bytes
    bf16 = layout.plan(shape, layout.Layout(dp=n, precision="bf16"))
    planned_total = (planned.params + planned.grads + planned.optimizer) // 2 + bf16.activations
    return {"n": n, "tokens_per_s": b * cfg.block_size / seconds, "seconds": seconds,
            "mfu": flops / seconds / n / (peak(jax.devices()[0].device_kind) or float("nan")),
            "peak_bytes": stats.get("peak_bytes_in_use"), "planned": planned_total, "loss": float(m["loss"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a 1-layer model, for the CPU path")
    args = p.parse_args(argv)
    if args.tiny:
        cfg, batch, steps = gpt.GPTConfig(16, 64, 1, 2, 32), 2, 2
    else:
        cfg, batch, steps = gpt.GPTConfig(1024, 50304, 12, 12, 768), 8, 10  # GPT-2 small, nanoGPT's shape
    kind = jax.devices()[0].device_kind
    print(f"bf16 GPT step: {cfg}, {batch} sequences per device, on {kind} (bf16 peak "
          f"{peak(kind) or 'unknown'} FLOP/s)")
    counts = sorted({1, len(jax.devices())})
    for n in counts:
        r = run(cfg, batch, n, steps)
        peak_text = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 1e9:.2f} GB"
        print(f"{n} device(s): {r['tokens_per_s']:,.0f} tokens/s, {r['seconds'] * 1e3:.1f} ms/step, MFU "
              f"{r['mfu']:.1%}, peak memory {peak_text} (device 0) vs planned {r['planned'] / 1e9:.2f} GB, "
              f"loss {r['loss']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
