"""Port a torch conv net with BatchNorm to funcnet, check it against torch, train it on digits.

    python examples/port_cnn.py [--epochs 10] [--float64]

The torch model below and ``funcnet.models.ConvNet`` are twins: the same children under the
same names, so ``theirs.state_dict()`` (parameters and BatchNorm buffers) loads into funcnet
with no renaming. The script checks the forward pass, the gradients and a few SGD-momentum
steps (parameters and running statistics) against torch from the same weights and batches,
prints the lines of code of both models, then trains the funcnet model end to end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn as tnn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class TorchConvNet(tnn.Module):
    def __init__(self, num_classes=10, channels=(16, 32), image=8):
        super().__init__()
        c1, c2 = channels
        self.unflatten = tnn.Unflatten(1, (1, image, image))
        self.conv1 = tnn.Conv2d(1, c1, 3, padding=1, bias=False)
        self.bn1 = tnn.BatchNorm2d(c1)
        self.conv2 = tnn.Conv2d(c1, c2, 3, padding=1, bias=False)
        self.bn2 = tnn.BatchNorm2d(c2)
        self.pool = tnn.MaxPool2d(2)
        self.flatten = tnn.Flatten()
        self.fc = tnn.Linear(c2 * (image // 4) ** 2, num_classes)

    def forward(self, x):
        x = self.unflatten(x)
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return self.fc(self.flatten(x))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps compared against torch")
    parser.add_argument("--float64", action="store_true", help="compare in float64 (JAX x64 on)")
    args = parser.parse_args(argv)

    import jax

    if args.float64:
        jax.config.update("jax_enable_x64", True)
    import optax
    from _port import compare, source_lines

    import funcnet
    from funcnet import data, models

    (x_tr, y_tr), (x_te, y_te) = data.load("digits")
    torch.manual_seed(0)
    theirs, ours = TorchConvNet(), models.ConvNet()
    dtype = "float64" if args.float64 else "float32"
    diffs = compare(ours, theirs, x_tr, y_tr, steps=args.steps, dtype=dtype)
    print(f"lines of code: torch {source_lines(TorchConvNet)}, funcnet {source_lines(models.ConvNet)}")
    print(f"max |funcnet - torch| ({dtype}, {args.steps} SGD-momentum steps): "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    tol = 1e-10 if args.float64 else 1e-4
    if max(diffs.values()) > tol:
        print(f"MISMATCH: above the tolerance {tol:g}", file=sys.stderr)
        return 1
    state, history = funcnet.fit(ours, optax.sgd(0.05, momentum=0.9), (x_tr, y_tr), (x_te, y_te),
                                 epochs=args.epochs, batch_size=32, key=jax.random.key(0), progress=False)
    final = history[-1]
    print(f"funcnet ConvNet on digits, {args.epochs} epochs: train loss {final['train_loss']:.4f}, "
          f"test accuracy {final['test_accuracy']:.4f}")
    return 0 if final["test_accuracy"] > 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
