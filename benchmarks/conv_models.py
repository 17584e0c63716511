"""The whole models of benchmarks/conv.py: ResNet-18, a ConvNeXt-style stack and a MobileNetV3-style
stack in torch.nn, converted by ``funcnet.interop.convert``; ResNet-18 also hand-written in funcnet.nn.
Forward (eval) and an SGD-momentum train step, funcnet against torch eager (and torch.compile)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn as tnn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from port_resnet import TorchBasicBlock


def torch_resnet18(widths=(64, 128, 256, 512), num_classes=10):
    """torchvision's resnet18 layout: 7x7/2 stem, 3x3/2 max pool, four stages of two BasicBlocks."""
    layers, inplanes = [tnn.Conv2d(3, widths[0], 7, 2, 3, bias=False), tnn.BatchNorm2d(widths[0]), tnn.ReLU(),
                        tnn.MaxPool2d(3, 2, 1)], widths[0]
    for i, planes in enumerate(widths):
        layers += [TorchBasicBlock(inplanes, planes, 2 if i else 1), TorchBasicBlock(planes, planes)]
        inplanes = planes
    return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(inplanes, num_classes))


def funcnet_resnet18(widths=(64, 128, 256, 512), num_classes=10):
    """The same network hand-written from funcnet.models.BasicBlock (state_dict keys match)."""
    from funcnet import nn
    from funcnet.models import BasicBlock

    layers, inplanes = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                        nn.MaxPool2d(3, 2, 1)], widths[0]
    for i, planes in enumerate(widths):
        layers += [BasicBlock(inplanes, planes, 2 if i else 1), BasicBlock(planes, planes)]
        inplanes = planes
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, num_classes))


class ConvNeXtBlock(tnn.Module):
    """ConvNeXt's block with its MLP as 1x1 convolutions and GroupNorm(1) for the channel LayerNorm."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = tnn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = tnn.GroupNorm(1, dim)
        self.pwconv1 = tnn.Conv2d(dim, 4 * dim, 1)
        self.act = tnn.GELU()
        self.pwconv2 = tnn.Conv2d(4 * dim, dim, 1)

    def forward(self, x):
        return x + self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x)))))


def torch_convnext(dims=(40, 80, 160, 320), depths=(2, 2, 2, 2), num_classes=10):
    """A convnext_atto-sized stack: 4x4/4 stem, stages of blocks, 2x2/2 downsampling between them."""
    layers = [tnn.Conv2d(3, dims[0], 4, 4), tnn.GroupNorm(1, dims[0])]
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i:
            layers += [tnn.GroupNorm(1, dims[i - 1]), tnn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [ConvNeXtBlock(dim) for _ in range(depth)]
    return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(dims[-1], num_classes))


class InvertedResidual(tnn.Module):
    """MobileNetV3's block: 1x1 expand, depthwise kxk, squeeze-excite, 1x1 project."""

    def __init__(self, cin, hidden, cout, kernel, stride, se, act):
        super().__init__()
        self.expand = tnn.Sequential(tnn.Conv2d(cin, hidden, 1, bias=False), tnn.BatchNorm2d(hidden), act())
        self.dw = tnn.Sequential(tnn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                                 tnn.BatchNorm2d(hidden), act())
        self.se = tnn.Sequential(tnn.AdaptiveAvgPool2d(1), tnn.Conv2d(hidden, hidden // 4, 1), tnn.ReLU(),
                                 tnn.Conv2d(hidden // 4, hidden, 1), tnn.Hardsigmoid()) if se else None
        self.project = tnn.Sequential(tnn.Conv2d(hidden, cout, 1, bias=False), tnn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = y * self.se(y)
        y = self.project(y)
        return x + y if self.residual else y


def torch_mobilenetv3(num_classes=10):
    """mobilenet_v3_small's stages (expand, out, kernel, stride, SE, activation)."""
    cfg = [(16, 16, 3, 2, True, tnn.ReLU), (72, 24, 3, 2, False, tnn.ReLU), (88, 24, 3, 1, False, tnn.ReLU),
           (96, 40, 5, 2, True, tnn.Hardswish), (240, 40, 5, 1, True, tnn.Hardswish),
           (120, 48, 5, 1, True, tnn.Hardswish), (288, 96, 5, 2, True, tnn.Hardswish),
           (576, 96, 5, 1, True, tnn.Hardswish)]
    layers, cin = [tnn.Conv2d(3, 16, 3, 2, 1, bias=False), tnn.BatchNorm2d(16), tnn.Hardswish()], 16
    for hidden, cout, k, s, se, act in cfg:
        layers.append(InvertedResidual(cin, hidden, cout, k, s, se, act))
        cin = cout
    return tnn.Sequential(*layers, tnn.Conv2d(cin, 576, 1, bias=False), tnn.BatchNorm2d(576), tnn.Hardswish(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(576, num_classes))


MODELS = {
    "resnet18": (torch_resnet18, funcnet_resnet18),
    "convnext": (torch_convnext, None),
    "mobilenetv3": (torch_mobilenetv3, None),
}
QUICK = {"resnet18": {"widths": (4, 8, 8, 8)}, "convnext": {"dims": (4, 8, 8, 8), "depths": (1, 1, 1, 1)}}


def _funcnet_runners(model, params, model_state, x, y):
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import nn, train

    forward = jax.jit(lambda p, s, x: nn.call(model, p, s, x, train=False)[0])
    step = train.make_step(model, optax.sgd(0.01, momentum=0.9), donate=False)
    state = [train.create_train_state(model, optax.sgd(0.01, momentum=0.9), jax.random.key(0), params=params,
                                      model_state=model_state)]
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    def train_step():
        state[0], metrics = step(state[0], (xj, yj))
        return metrics["loss"]

    return (lambda: forward(params, model_state, xj)), train_step


def _torch_runners(module, x, y, compiled):
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    run = torch.compile(module) if compiled else module

    def forward():
        module.eval()
        with torch.no_grad():
            return run(tx)

    def train_step():
        module.train()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(run(tx), ty)
        loss.backward()
        opt.step()
        return loss

    return forward, train_step


def run_models(args, rounds, console, interleaved):
    import copy

    import jax
    import numpy as np

    from funcnet import interop, load_state_dict, nn

    names = args.models or (list(QUICK) if args.quick else list(MODELS))
    sizes, batches = ([32], [2]) if args.quick else (args.sizes, args.batches)
    why_not = compile_unavailable() if args.compile and not args.quick else (
        "--quick" if args.quick else "pass --compile")
    console.print("torch.compile: " + ("timed (Inductor compiles each model and mode first)" if why_not is None
                                       else f"not timed ({why_not})"))
    rows = []
    console.print(f"{'model':<34} {'forward ms: funcnet':>20} {'torch':>8} {'compile':>8} {'torch/ours':>10} "
                  f"{'compile/ours':>12} | {'train ms: funcnet':>18} {'torch':>8} {'compile':>8} {'torch/ours':>10} "
                  f"{'compile/ours':>12}   (x/ours >= 1: funcnet as fast)")
    for name in names:
        make_torch, make_ours = MODELS[name]
        for size in sizes:
            for batch in batches:
                torch.manual_seed(0)
                module = make_torch(**(QUICK[name] if args.quick else {}))
                rng = np.random.default_rng(0)
                x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
                y = rng.integers(0, 10, batch)
                module.eval()
                with torch.no_grad():
                    ref = module(torch.from_numpy(x)).numpy()
                variants = []
                converted, params, model_state = interop.convert(copy.deepcopy(module), torch.from_numpy(x))
                variants.append(("converted", converted, params, model_state))
                if make_ours is not None:
                    ours = make_ours(**(QUICK[name] if args.quick else {}))
                    sd = {k: v.detach().clone() for k, v in module.state_dict().items()}
                    loaded = load_state_dict(ours.init(jax.random.key(0)), sd, state=nn.initial_state(ours))
                    variants.append(("hand-written", ours, *loaded))
                for how, model, p, s in variants:
                    fwd, step = _funcnet_runners(model, p, s, x, y)
                    out = np.asarray(fwd())
                    # eval logits: sums over up to ~10^4 products per layer through ~20 layers in float32
                    err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))
                    tf, ts = _torch_runners(copy.deepcopy(module), x, y, compiled=False)
                    runners_f = {"funcnet": fwd, "torch": tf}
                    runners_t = {"funcnet": step, "torch": ts}
                    if why_not is None:
                        cf, cs = _torch_runners(copy.deepcopy(module), x, y, compiled=True)
                        runners_f["torch.compile"], runners_t["torch.compile"] = cf, cs
                    f = interleaved(runners_f, rounds, 1)
                    t = interleaved(runners_t, rounds, 1)
                    row = {"model": name, "variant": how, "size": size, "batch": batch, "forward_ms": f,
                           "train_ms": t, "rel_err": err, "ok": err < 1e-3}
                    rows.append(row)
                    if why_not is not None:
                        row["torch_compile"] = f"not timed: {why_not}"
                    label = f"{name} {how} {size}px b{batch}" + ("" if row["ok"] else " WRONG")

                    def cols(d, width):
                        c = d.get("torch.compile")
                        return (f"{d['funcnet']:>{width}.1f} {d['torch']:>8.1f} "
                                + (f"{c:>8.1f}" if c else f"{'-':>8}") + f" {d['torch'] / d['funcnet']:>10.2f} "
                                + (f"{c / d['funcnet']:>12.2f}" if c else f"{'-':>12}"))
                    console.print(f"{label:<34} {cols(f, 20)} | {cols(t, 18)}")
    if why_not is not None:
        console.print(f"torch.compile columns '-': {why_not}")
    return rows


def compile_unavailable():
    """Why torch.compile cannot run here (None when it can): Inductor on the CPU builds C++."""
    import shutil

    from torch._inductor import config

    cxx = config.cpp.cxx[-1] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
    for name in ([cxx] if cxx else []) + ["g++", "c++", "clang++"]:
        if name and shutil.which(name):
            return None
    return ("no C++ compiler on PATH (Inductor's CPU backend compiles C++; e.g. apt-get install -y g++), "
            "torch.compile not run")
