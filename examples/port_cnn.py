"""Port a torch conv net with BatchNorm to funcnet, check it against torch, train it on digits.

    python examples/port_cnn.py [--epochs 10] [--float64]

The torch model below and ``funcnet.models.ConvNet`` are twins: the same children under the
same names, so ``theirs.state_dict()`` (parameters and BatchNorm buffers) loads into funcnet
with no renaming. The script checks the forward pass, the gradients and a few SGD-momentum
steps (parameters and running statistics) against torch from the same weights and batches,
prints the lines of code of both models, then trains the funcnet model end to end.
"""

from __future__ import annotations

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
    import _port

    from funcnet import models

    return _port.main(argv, description=__doc__.splitlines()[0], name="ConvNet", torch_model=TorchConvNet,
                      funcnet_model=models.ConvNet, torch_sources=(TorchConvNet,),
                      funcnet_sources=(models.ConvNet,), epochs=10)


if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(main())
