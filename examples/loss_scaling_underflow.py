"""Why float16 training needs loss scaling: small gradients underflow to zero.

Trains an MLP (64-256-256-256-256-10) on the digits in float32 until it is
confident, then takes the gradient of the whole training set's mean loss three ways:

- float32 throughout (the reference);
- forward and backward in float16, no scaling: backpropagated values below
  float16's range (about 6e-8, subnormals included) become 0;
- float16 with the loss multiplied by a scale (2**16 by default) before the backward
  pass and the gradients divided by it afterwards, in float32 (torch: GradScaler).

and prints, per layer, the fraction of weight-gradient entries that are zero where
the float32 gradient is not, and the relative error against float32.

    python examples/loss_scaling_underflow.py [--epochs 40] [--scale 65536]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import data, losses, nn, train
from funcnet.precision import StaticLossScale, get_policy


def gradients(model, params, x, y, policy, loss_scale):
    """d loss / d params with the forward and backward pass in ``policy``'s compute dtype."""

    def loss_fn(p):
        p, xc = policy.cast_to_compute((p, x))
        logits = policy.cast_to_output(model.apply(p, xc))
        return loss_scale.scale(losses.cross_entropy(logits, y))

    return loss_scale.unscale(jax.grad(loss_fn)(params))  # float32, divided by the scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--scale", type=float, default=2.0**16)
    parser.add_argument("--quick", action="store_true", help="2 epochs: the CI setting")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 2

    (x_tr, y_tr), _ = data.load("digits")
    model, tx = nn.MLP([64, 256, 256, 256, 256, 10]), optax.adam(1e-3)
    state, history = train.fit(model, tx, (x_tr, y_tr), epochs=args.epochs, batch_size=32,
                               key=jax.random.key(0), progress=False)
    print(f"trained {args.epochs} epochs in float32: train loss {history[-1]['train_loss']:.2e}")

    x, y = jnp.asarray(x_tr), jnp.asarray(y_tr)  # mean over 1437 examples: small per-example terms
    ref = gradients(model, state.params, x, y, get_policy("fp32"), StaticLossScale(1.0))
    plain = gradients(model, state.params, x, y, get_policy("fp16"), StaticLossScale(1.0))
    scaled = gradients(model, state.params, x, y, get_policy("fp16"), StaticLossScale(args.scale))
    info = jnp.finfo(jnp.float16)
    print(f"float16: smallest positive value {float(info.smallest_subnormal):.1e}, full precision only above "
          f"{float(info.smallest_normal):.1e}; loss scale {args.scale:g}\n")
    print(f"{'weight':10s} {'median |g|':>11s} {'zero where float32 is not':>27s} {'relative error':>21s}")
    print(f"{'':10s} {'float32':>11s} {'no scaling':>13s} {'scaled':>13s} {'no scaling':>10s} {'scaled':>10s}")
    unscaled_lost, scaled_lost = [], []
    for name in ref:
        r, a, b = (np.ravel(t[name]["weight"]) for t in (ref, plain, scaled))
        nonzero = r != 0
        lost_a, lost_b = np.mean(a[nonzero] == 0), np.mean(b[nonzero] == 0)
        err_a, err_b = (np.linalg.norm(g - r) / np.linalg.norm(r) for g in (a, b))
        print(f"{name + '.weight':10s} {np.median(np.abs(r[nonzero])):>11.1e} {lost_a:>13.1%} {lost_b:>13.1%} "
              f"{err_a:>10.1e} {err_b:>10.1e}")
        unscaled_lost.append(lost_a)
        scaled_lost.append(lost_b)
    print(f"\nunderflow to zero: {min(unscaled_lost):.1%}-{max(unscaled_lost):.1%} without scaling, "
          f"{min(scaled_lost):.1%}-{max(scaled_lost):.1%} with scale {args.scale:g}")
    if not (all(b <= a for a, b in zip(unscaled_lost, scaled_lost)) and sum(scaled_lost) < sum(unscaled_lost)):
        print("FAILED: loss scaling did not lower the underflow (some layer lost more, or none lost less)",
              file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(main())
