"""Port a torch ResNet (BasicBlocks with downsample) to funcnet, check it, train it on digits.

    python examples/port_resnet.py [--epochs 5] [--float64]

``TorchResNet`` below and ``funcnet.models.ResNet`` are twins (torchvision's BasicBlock:
two 3x3 convs with BatchNorm, a 1x1 conv + BatchNorm shortcut when the shape changes), so
the torch state_dict loads with no renaming. Checked against torch from the same weights:
forward, gradients, SGD-momentum steps (parameters and running statistics), eval logits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn as tnn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class TorchBasicBlock(tnn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = tnn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(planes)
        self.relu = tnn.ReLU()
        self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = tnn.Sequential(tnn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                             tnn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class TorchResNet(tnn.Module):
    def __init__(self, num_classes=10, widths=(16, 32), blocks=1, image=8):
        super().__init__()
        self.unflatten = tnn.Unflatten(1, (1, image, image))
        self.conv1 = tnn.Conv2d(1, widths[0], 3, 1, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(widths[0])
        self.relu = tnn.ReLU()
        stages, inplanes = [], widths[0]
        for i, planes in enumerate(widths):
            stages.append(tnn.Sequential(*[TorchBasicBlock(inplanes if b == 0 else planes, planes,
                                                           stride=2 if (i > 0 and b == 0) else 1)
                                           for b in range(blocks)]))
            inplanes = planes
        self.layers = tnn.ModuleList(stages)
        self.avgpool = tnn.AdaptiveAvgPool2d(1)
        self.flatten = tnn.Flatten()
        self.fc = tnn.Linear(widths[-1], num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(self.unflatten(x))))
        for layer in self.layers:
            x = layer(x)
        return self.fc(self.flatten(self.avgpool(x)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
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
    theirs, ours = TorchResNet(), models.ResNet()
    dtype = "float64" if args.float64 else "float32"
    diffs = compare(ours, theirs, x_tr, y_tr, steps=args.steps, dtype=dtype)
    torch_lines = source_lines(TorchBasicBlock) + source_lines(TorchResNet)
    ours_lines = source_lines(models.BasicBlock) + source_lines(models.ResNet)
    print(f"lines of code: torch {torch_lines}, funcnet {ours_lines}")
    print(f"max |funcnet - torch| ({dtype}, {args.steps} SGD-momentum steps): "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    tol = 1e-10 if args.float64 else 1e-4
    if max(diffs.values()) > tol:
        print(f"MISMATCH: above the tolerance {tol:g}", file=sys.stderr)
        return 1
    state, history = funcnet.fit(ours, optax.sgd(0.05, momentum=0.9), (x_tr, y_tr), (x_te, y_te),
                                 epochs=args.epochs, batch_size=32, key=jax.random.key(0), progress=False)
    final = history[-1]
    print(f"funcnet ResNet on digits, {args.epochs} epochs: train loss {final['train_loss']:.4f}, "
          f"test accuracy {final['test_accuracy']:.4f}")
    return 0 if final["test_accuracy"] > 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
