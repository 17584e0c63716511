"""Port a torch ResNet (BasicBlocks with downsample) to funcnet, check it, train it on digits.

    python examples/port_resnet.py [--epochs 5] [--float64]

``TorchResNet`` below and ``funcnet.models.ResNet`` are twins (torchvision's BasicBlock:
two 3x3 convs with BatchNorm, a 1x1 conv + BatchNorm shortcut when the shape changes), so
the torch state_dict loads with no renaming. Checked against torch from the same weights:
forward, gradients, SGD-momentum steps (parameters and running statistics), eval logits.
"""

from __future__ import annotations

import sys
from pathlib import Path

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
    import _port

    from funcnet import models

    return _port.main(argv, description=__doc__.splitlines()[0], name="ResNet", torch_model=TorchResNet,
                      funcnet_model=models.ResNet, torch_sources=(TorchBasicBlock, TorchResNet),
                      funcnet_sources=(models.BasicBlock, models.ResNet), epochs=5,
                      # two 5-epoch runs of the same code ended at 87.8% and 93.6%: the last epoch's test
                      # accuracy of this recipe (SGD-momentum at lr 0.05, BatchNorm's running statistics
                      # for eval) swings by several points, so the bar sits below both
                      min_accuracy=0.85)


if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(main())
