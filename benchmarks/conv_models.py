"""The whole models of benchmarks/conv.py: ResNet-18, a ConvNeXt-style stack and torchvision's
MobileNetV3-Small and a smaller ResNet-style net in torch.nn, converted by ``funcnet.interop.convert``; ResNet-18 also hand-written
in funcnet.nn. Forward (eval) and an SGD-momentum train step, funcnet against torch eager (and
torch.compile), all variants of a model taking turns in the same interleaved rounds."""

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


def torch_resnet_style(widths=(64, 128, 256, 512), num_classes=10):
    """A smaller ResNet-style net, not ResNet-18's layout: a 3x3/2 stem without a pool and one
    BasicBlock a stage, so a 32 px input runs its stages at 16, 8, 4 and 2 px (the small-input
    check: per-call costs and the 4x4 and 2x2 stages weigh most)."""
    layers, inplanes = [tnn.Conv2d(3, widths[0], 3, 2, 1, bias=False), tnn.BatchNorm2d(widths[0]), tnn.ReLU()], widths[0]
    for i, planes in enumerate(widths):
        layers.append(TorchBasicBlock(inplanes, planes, 2 if i else 1))
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


def funcnet_convnext(dims=(40, 80, 160, 320), depths=(2, 2, 2, 2), num_classes=10):
    """The same stack hand-written in funcnet.nn (state_dict keys match ``torch_convnext``)."""
    from funcnet import nn

    def block(dim):
        def forward(self, x):
            return x + self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x)))))

        return nn.Composite(forward, name=f"ConvNeXtBlock({dim})",
                            dwconv=nn.Conv2d(dim, dim, 7, padding=3, groups=dim), norm=nn.GroupNorm(1, dim),
                            pwconv1=nn.Conv2d(dim, 4 * dim, 1), act=nn.GELU(), pwconv2=nn.Conv2d(4 * dim, dim, 1))

    layers = [nn.Conv2d(3, dims[0], 4, 4), nn.GroupNorm(1, dims[0])]
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i:
            layers += [nn.GroupNorm(1, dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
        layers += [block(dim) for _ in range(depth)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(dims[-1], num_classes))


def _make_divisible(v, divisor=8):
    """torchvision's channel rounding: to a multiple of 8, never more than 10% below ``v``."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def _conv_bn(cin, cout, kernel, stride=1, groups=1, act=None):
    """torchvision's Conv2dNormActivation as MobileNetV3 builds it: no conv bias, BatchNorm2d(eps=1e-3,
    momentum=0.01), then the activation (none for the projection)."""
    layers = [tnn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              tnn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
    return tnn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcitation(tnn.Module):
    """torchvision's SqueezeExcitation with MobileNetV3's Hardsigmoid gate: 1x1 convs with bias."""

    def __init__(self, channels, squeeze):
        super().__init__()
        self.avgpool = tnn.AdaptiveAvgPool2d(1)
        self.fc1 = tnn.Conv2d(channels, squeeze, 1)
        self.activation = tnn.ReLU()
        self.fc2 = tnn.Conv2d(squeeze, channels, 1)
        self.scale_activation = tnn.Hardsigmoid()

    def forward(self, x):
        return x * self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))


class InvertedResidual(tnn.Module):
    """MobileNetV3's block as torchvision writes it: 1x1 expand (absent when the expansion equals the
    input width), depthwise kxk, squeeze-excite, 1x1 project; residual at stride 1, equal widths."""

    def __init__(self, cin, kernel, hidden, cout, se, act, stride):
        super().__init__()
        layers = [] if hidden == cin else [_conv_bn(cin, hidden, 1, act=act)]
        layers.append(_conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcitation(hidden, _make_divisible(hidden // 4)))
        layers.append(_conv_bn(hidden, cout, 1))
        self.block = tnn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res_connect else y


# torchvision's mobilenet_v3_small: (input, kernel, expanded, out, SE, activation, stride)
MOBILENET_V3_SMALL = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
                      (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
                      (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
                      (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
                      (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
                      (96, 5, 576, 96, True, "HS", 1)]


def torch_mobilenetv3(num_classes=10, width=1.0):
    """torchvision's ``mobilenet_v3_small`` (2.5M parameters at 1000 classes) in torch.nn, layer for
    layer (torchvision does not import beside this torch): 3x3/2 stem, the 11 inverted residual blocks
    of MOBILENET_V3_SMALL, a 1x1 conv to 576, global pooling and the 576-1024-classes head with
    Hardswish and Dropout(0.2); torchvision's initialisation. ``width`` scales every channel count
    (torchvision's ``width_mult``)."""
    acts = {"RE": tnn.ReLU, "HS": tnn.Hardswish}

    def ch(c):
        return _make_divisible(c * width)

    layers = [_conv_bn(3, ch(16), 3, 2, act=tnn.Hardswish)]
    for cin, k, hidden, cout, se, act, stride in MOBILENET_V3_SMALL:
        layers.append(InvertedResidual(ch(cin), k, ch(hidden), ch(cout), se, acts[act], stride))
    last = ch(96)
    model = tnn.Sequential(*layers, _conv_bn(last, 6 * last, 1, act=tnn.Hardswish), tnn.AdaptiveAvgPool2d(1),
                           tnn.Flatten(), tnn.Linear(6 * last, ch(1024)), tnn.Hardswish(), tnn.Dropout(0.2),
                           tnn.Linear(ch(1024), num_classes))
    for m in model.modules():
        if isinstance(m, tnn.Conv2d):
            tnn.init.kaiming_normal_(m.weight, mode="fan_out")
            if m.bias is not None:
                tnn.init.zeros_(m.bias)
        elif isinstance(m, tnn.Linear):
            tnn.init.normal_(m.weight, 0, 0.01)
            tnn.init.zeros_(m.bias)
    return model


MODELS = {
    "resnet18": (torch_resnet18, funcnet_resnet18),
    "convnext": (torch_convnext, funcnet_convnext),
    "mobilenetv3": (torch_mobilenetv3, None),
    "resnet_style": (torch_resnet_style, None),
}
QUICK = {"resnet18": {"widths": (4, 8, 8, 8)}, "convnext": {"dims": (4, 8, 8, 8), "depths": (1, 1, 1, 1)},
         "mobilenetv3": {"width": 0.25}, "resnet_style": {"widths": (4, 8, 8, 8)}}


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
    baseline = getattr(args, "baseline_context", None)  # conv.py --baseline: a context swapping convolve
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
                if baseline is not None:  # the same converted model traced through the --baseline convolve
                    variants.append(("converted baseline", converted, params, model_state))
                if make_ours is not None:
                    ours = make_ours(**(QUICK[name] if args.quick else {}))
                    sd = {k: v.detach().clone() for k, v in module.state_dict().items()}
                    loaded = load_state_dict(ours.init(jax.random.key(0)), sd, state=nn.initial_state(ours))
                    variants.append(("hand-written", ours, *loaded))
                # every variant, torch eager and torch.compile take turns in the same rounds
                runners_f, runners_t, errs = {}, {}, {}
                for how, model, p, s in variants:
                    runners_f[how], runners_t[how] = _funcnet_runners(model, p, s, x, y)
                    if how.endswith("baseline"):  # traced (on the first call) and run under the swap
                        runners_f[how], runners_t[how] = (_under(baseline, r) for r in (runners_f[how], runners_t[how]))
                    out = np.asarray(runners_f[how]())
                    # eval logits: sums over up to ~10^4 products per layer through ~20 layers in float32
                    errs[how] = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))
                runners_f["torch"], runners_t["torch"] = _torch_runners(copy.deepcopy(module), x, y, compiled=False)
                if why_not is None:
                    # a fresh Dynamo per cell: its caches are keyed by code object, shared by every model
                    # and size, so later cells would compile with dynamic shapes and, past Dynamo's
                    # recompile limit (8), silently run eager
                    torch._dynamo.reset()
                    runners_f["torch.compile"], runners_t["torch.compile"] = _torch_runners(
                        copy.deepcopy(module), x, y, compiled=True)
                f_all = interleaved(runners_f, rounds, 1)
                t_all = interleaved(runners_t, rounds, 1)
                for how, *_ in variants:
                    f, t = ({"funcnet": d[how], **{k: v for k, v in d.items() if k.startswith("torch")}}
                            for d in (f_all, t_all))
                    row = {"model": name, "variant": how, "size": size, "batch": batch, "forward_ms": f,
                           "train_ms": t, "rel_err": errs[how], "ok": errs[how] < 1e-3}
                    rows.append(row)
                    if why_not is not None:
                        row["torch_compile"] = f"not timed: {why_not}"
                    label = f"{name} {how} {size}px b{batch}" + ("" if row["ok"] else " WRONG")
                    console.print(f"{label:<34} {_cols(f, 20)} | {_cols(t, 18)}")
    if why_not is not None:
        console.print(f"torch.compile columns '-': {why_not}")
    return rows


def _under(context, run):
    """``run`` called inside ``context()`` each time (a jitted function traces on its first call)."""
    def wrapped():
        with context():
            return run()
    return wrapped


def _cols(d, width):
    c = d.get("torch.compile")
    return (f"{d['funcnet']:>{width}.1f} {d['torch']:>8.1f} " + (f"{c:>8.1f}" if c else f"{'-':>8}")
            + f" {d['torch'] / d['funcnet']:>10.2f} " + (f"{c / d['funcnet']:>12.2f}" if c else f"{'-':>12}"))


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
