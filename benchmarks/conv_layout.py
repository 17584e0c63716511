"""Channels-last inside a jitted model, measured: the same torch model run as pure JAX with its
activations NCHW (torch's layout, what funcnet does) or NHWC (one transpose in; ``lax.conv`` with
NHWC/HWIO dimension numbers, BatchNorm and pooling over the right axes), forward and an
SGD-momentum train step, beside the model ``funcnet.interop.convert`` makes of it and torch eager.
Channels-last twice: with torch's OIHW weights (what funcnet's parameters are), and with the
weights stored HWIO (a library that kept its own weight layout and converted at ``state_dict``).

    python benchmarks/conv_layout.py [--models resnet18 mobilenetv3] [--size 64] [--batch 8]
                                     [--rounds 7] [--single-thread] [--cpu-time]

Both layouts compute each convolution the way funcnet's rule picks for its shape
(``conv_strategy.choose``: XLA's convolution, im2col or a depthwise tap sum whose input gradient
is a forward tap sum); NCHW calls funcnet's own ``conv_strategy.convolve``, NHWC the same
formulations written channels-last here, so the layout is the only difference between the two
prototypes. A prototype interprets the torch module tree (``_run``) with the module's weights; its
eval logits are checked against torch's and the two layouts' gradients against each other.
docs/design.md ("Layout") has the figures and the decision.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["conv_nhwc", "prototype", "main"]


def _plan(sizes, kernel, stride, pads, lhs_dilation=(1, 1)):
    from funcnet.nn.functional.conv_depthwise import live_taps

    out = tuple((s * ld - ld + 1 + lo + hi - (k - 1) - 1) // st + 1
                for s, ld, (lo, hi), k, st in zip(sizes, lhs_dilation, pads, kernel, stride))
    taps = tuple(live_taps(s, lo, ld, o, st, 1, k)
                 for s, (lo, _), ld, o, st, k in zip(sizes, pads, lhs_dilation, out, stride, kernel))
    return out, taps


def _shifted_nhwc(x, stride, pads, lhs_dilation, out, taps):
    """The padded NHWC input's strided slice under each kernel tap that meets data."""
    import jax
    import jax.numpy as jnp

    x = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] + [(lo, hi, ld - 1) for (lo, hi), ld in
                                                             zip(pads, lhs_dilation)] + [(0, 0, 0)])
    return [jax.lax.slice(x, (0, i, j, 0), (x.shape[0], i + stride[0] * (out[0] - 1) + 1,
                                            j + stride[1] * (out[1] - 1) + 1, x.shape[3]), (1, *stride, 1))
            for i in taps[0] for j in taps[1]]


def _tap_sum_nhwc(x, w, stride, pads, lhs_dilation, out, taps):
    """Depthwise: sum over taps of the shifted input times that tap's per-channel weight ``w[i, j]``
    (``w``: ``(kh, kw, C)``), channels the contiguous axis."""
    cols = _shifted_nhwc(x, stride, pads, lhs_dilation, out, taps)
    weights = [w[i, j] for i in taps[0] for j in taps[1]]
    return functools.reduce(lambda a, b: a + b, (c * t for c, t in zip(cols, weights)))


@functools.lru_cache(maxsize=None)
def _depthwise_nhwc():
    import jax
    import jax.numpy as jnp

    @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
    def depthwise(x, w, stride, pads):
        out, taps = _plan(x.shape[1:3], w.shape[:2], stride, pads)
        return _tap_sum_nhwc(x, w, stride, pads, (1, 1), out, taps)

    def fwd(x, w, stride, pads):
        return depthwise(x, w, stride, pads), (x, w)

    def bwd(stride, pads, residuals, g):
        # as funcnet's: the input gradient a forward tap sum of the stride-dilated output gradient
        # against the flipped kernel; the weight gradient autodiff's (one reduction per tap)
        x, w = residuals
        sizes, outs = x.shape[1:3], g.shape[1:3]
        back = tuple((k - 1 - lo, s + lo - (o - 1) * st - 1)
                     for k, (lo, _), s, o, st in zip(w.shape[:2], pads, sizes, outs, stride))
        taps = tuple(_plan_taps(o, lo, st, s, k) for o, (lo, _), st, s, k in zip(outs, back, stride, sizes, w.shape))
        dx = (jnp.zeros(x.shape, g.dtype) if any(not t for t in taps) else
              _tap_sum_nhwc(g, jnp.flip(w, (0, 1)), (1, 1), back, stride, sizes, taps))
        _, weight_vjp = jax.vjp(lambda w: depthwise.fun(x, w, stride, pads), w)
        return dx, weight_vjp(g)[0]

    depthwise.defvjp(fwd, bwd)
    return depthwise


def _plan_taps(size, lo, lhs_dilation, out, kernel):
    from funcnet.nn.functional.conv_depthwise import live_taps

    return live_taps(size, lo, lhs_dilation, out, 1, 1, kernel)


def conv_nhwc(x, w, stride, pads, groups, hwio=False):
    """``F.conv2d`` on NHWC activations (``w`` torch's ``(O, C/groups, kh, kw)``, or ``(kh, kw,
    C/groups, O)`` with ``hwio``), by the formulation funcnet's rule picks for the same shapes: XLA's
    (NHWC/HWIO), im2col (one contraction over channels and taps) or the depthwise tap sum."""
    import jax
    import jax.numpy as jnp

    from funcnet.nn.functional.conv_strategy import choose

    kernel, cg = (w.shape[:2], w.shape[2]) if hwio else (w.shape[2:], w.shape[1])
    out, taps = _plan(x.shape[1:3], kernel, stride, pads)
    depthwise = cg == 1 and groups > 1
    channels = x.shape[3] if hwio else x.shape[1]
    patch_bytes = x.shape[0] * channels * math.prod(len(t) for t in taps) * math.prod(out) * x.dtype.itemsize
    how = choose(x.shape[1:3], out, kernel, taps, (1, 1), depthwise, cg * math.prod(kernel), patch_bytes)
    if how == "taps" and not depthwise:
        how = "im2col"
    if how == "xla":
        return jax.lax.conv_general_dilated(x, w if hwio else jnp.transpose(w, (2, 3, 1, 0)), stride, list(pads),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
                                            precision=jax.lax.Precision.HIGHEST)
    if how == "taps":
        return _depthwise_nhwc()(x, w[:, :, 0] if hwio else jnp.transpose(w[:, 0], (1, 2, 0)), tuple(stride),
                                 tuple(pads))
    if groups != 1:
        raise NotImplementedError("grouped im2col is not prototyped channels-last")
    if hwio:  # (N, Ho, Wo, T, C) against (T, C, O): the weight already the (K, N) right operand
        for axis, (t, k) in enumerate(zip(taps, kernel)):
            if len(t) < k:
                w = jnp.take(w, jnp.asarray(t), axis=axis)
        patches = jnp.stack(_shifted_nhwc(x, stride, pads, (1, 1), out, taps), axis=3)
        return jnp.einsum("nhwtc,tco->nhwo", patches, w.reshape(-1, w.shape[2], w.shape[3]),
                          precision=jax.lax.Precision.HIGHEST)
    for axis, (t, k) in enumerate(zip(taps, w.shape[2:])):  # drop the taps that only meet padding
        if len(t) < k:
            w = jnp.take(w, jnp.asarray(t), axis=axis + 2)
    # (N, Ho, Wo, C, T): channels before taps, as the weight's (O, C, T), and the weight the dot's
    # left operand, the small output transposed after: written patches @ weight.T (the natural
    # channels-last product) XLA:CPU copied the whole transposed weight in every call and the
    # matrix multiply took 5x as long (ResNet-18's 512x512x3x3 at 2x2: 9.0 against 1.8 ms)
    patches = jnp.stack(_shifted_nhwc(x, stride, pads, (1, 1), out, taps), axis=4)
    w = w.reshape(w.shape[0], w.shape[1], -1)
    y = jnp.einsum("oct,nhwct->onhw", w, patches, precision=jax.lax.Precision.HIGHEST)
    return jnp.transpose(y, (1, 2, 3, 0))


def _run(m, p, prefix, x, layout, train, key):
    """``m``'s forward on ``x`` in ``layout`` with the weights ``p`` (state_dict names)."""
    import jax
    import jax.numpy as jnp
    from torch import nn as tnn

    from funcnet.nn.functional.conv_strategy import convolve

    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    kind = type(m).__name__

    def bshape(v):
        return v.reshape((-1, 1, 1) if layout == "NCHW" else (-1,))

    def sub(name, x, k=0):
        return _run(getattr(m, name), p, f"{prefix}{name}.", x, layout, train, jax.random.fold_in(key, k))

    if isinstance(m, tnn.Sequential):
        for i, child in enumerate(m):
            x = _run(child, p, f"{prefix}{i}.", x, layout, train, jax.random.fold_in(key, i))
        return x
    if isinstance(m, tnn.Conv2d):
        pads, w, b = tuple((q, q) for q in m.padding), p[prefix + "weight"], p.get(prefix + "bias")
        y = (convolve(x, w, m.stride, pads, (1, 1), (1, 1), m.groups) if layout == "NCHW"
             else conv_nhwc(x, w, m.stride, pads, m.groups, hwio=layout == "NHWC-HWIO"))
        return y if b is None else y + bshape(b)
    if isinstance(m, tnn.BatchNorm2d):
        axes = (0, *spatial)
        if train:  # the batch's biased statistics (the running ones are not updated here)
            mean = jnp.mean(x, axis=axes, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
        else:
            mean, var = bshape(p[prefix + "running_mean"]), bshape(p[prefix + "running_var"])
        return (x - mean) * jax.lax.rsqrt(var + m.eps) * bshape(p[prefix + "weight"]) + bshape(p[prefix + "bias"])
    if isinstance(m, tnn.MaxPool2d):
        window, strides = [1] * 4, [1] * 4
        pad = [(0, 0)] * 4
        for a in spatial:
            window[a], strides[a], pad[a] = m.kernel_size, m.stride, (m.padding, m.padding)
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, strides, pad)
    if isinstance(m, tnn.AdaptiveAvgPool2d):
        assert m.output_size in (1, (1, 1))
        return jnp.mean(x, axis=spatial, keepdims=True)
    if isinstance(m, tnn.Flatten):
        assert all(x.shape[a] == 1 for a in spatial) or layout == "NCHW"
        return x.reshape(x.shape[0], -1)
    if isinstance(m, tnn.Linear):
        return x @ p[prefix + "weight"].T + p[prefix + "bias"]
    if isinstance(m, tnn.Dropout):
        if not train:
            return x
        return x * jax.random.bernoulli(key, 1 - m.p, x.shape) / (1 - m.p)
    acts = {"ReLU": jax.nn.relu, "Hardswish": jax.nn.hard_swish, "Hardsigmoid": jax.nn.hard_sigmoid}
    if kind in acts:
        return acts[kind](x)
    if kind == "TorchBasicBlock":
        out = sub("relu", sub("bn1", sub("conv1", x)))
        out = sub("bn2", sub("conv2", out))
        return jax.nn.relu(out + (x if m.downsample is None else sub("downsample", x)))
    if kind == "InvertedResidual":
        y = sub("block", x)
        return x + y if m.use_res_connect else y
    if kind == "SqueezeExcitation":
        s = sub("fc2", sub("activation", sub("fc1", jnp.mean(x, axis=spatial, keepdims=True))))
        return x * jax.nn.hard_sigmoid(s)
    raise NotImplementedError(f"the layout prototype has no rule for {kind}")


def prototype(module, layout):
    """``(forward(p, x), loss(p, x, y))`` of ``module`` run in ``layout``; ``x`` is NCHW at the
    interface (one transpose in for NHWC; logits need none)."""
    import jax
    import optax

    def forward(p, x, train=False):
        if layout != "NCHW":
            x = x.transpose(0, 2, 3, 1)
        return _run(module, p, "", x, layout, train, jax.random.key(0))

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(forward(p, x, True), y).mean()

    return forward, loss


# activations NCHW (funcnet's); NHWC with torch's OIHW weights; NHWC with the weights stored HWIO
LAYOUTS = ("NCHW", "NHWC", "NHWC-HWIO")


def _hwio(v, back=False):
    """A conv weight OIHW -> HWIO (``back``: HWIO -> OIHW); other parameters as they are."""
    return v if v.ndim != 4 else v.transpose((3, 2, 0, 1) if back else (2, 3, 1, 0))


def _step(loss, tx):
    import jax
    import optax

    @jax.jit
    def step(p, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, value

    return step


def measure(name, size, batch, rounds, console, interleaved):
    import copy

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import torch

    from conv_models import MODELS, _funcnet_runners, _torch_runners
    from funcnet import interop

    torch.manual_seed(0)
    module = MODELS[name][0]().eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with torch.no_grad():
        ref = module(torch.from_numpy(x)).numpy()
    sd = {k: jnp.asarray(v.detach().numpy()) for k, v in module.state_dict().items()
          if v.dtype.is_floating_point}
    trainable = {k for k, _ in module.named_parameters()}
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    tx = optax.sgd(0.01, momentum=0.9)
    runners_f, runners_t, check = {}, {}, {}
    converted, params, model_state = interop.convert(copy.deepcopy(module), torch.from_numpy(x))
    runners_f["funcnet (NCHW)"], runners_t["funcnet (NCHW)"] = _funcnet_runners(converted, params, model_state, x, y)
    grads = {}
    for layout in LAYOUTS:
        fwd, loss = prototype(module, layout)
        buffers = {k: v for k, v in sd.items() if k not in trainable}
        p = {k: _hwio(v) if layout == "NHWC-HWIO" else v for k, v in sd.items() if k in trainable}
        fj = jax.jit(lambda p, x, fwd=fwd: fwd({**p, **buffers}, x))
        lossb = (lambda p, x, y, loss=loss: loss({**p, **buffers}, x, y))
        step = _step(lossb, tx)
        state = [p, tx.init(p)]
        out = np.asarray(fj(p, xj))
        check[layout] = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        grads[layout] = {k: _hwio(v, back=True) if layout == "NHWC-HWIO" else v
                         for k, v in jax.jit(jax.grad(lossb))(p, xj, yj).items()}

        def train_step(step=step, state=state):
            state[0], state[1], value = step(state[0], state[1], xj, yj)
            return value

        runners_f[f"proto {layout}"] = lambda fj=fj, p=p: fj(p, xj)
        runners_t[f"proto {layout}"] = train_step
    runners_f["torch"], runners_t["torch"] = _torch_runners(copy.deepcopy(module), x, y, compiled=False)
    # float32 gradients through ~20 layers, the two layouts summing in different orders: relative
    # difference of all gradients together (a parameter whose gradient is near zero would dominate
    # a per-tensor maximum)
    gdiff = max(float(optax.global_norm(jax.tree.map(jnp.subtract, grads[lay], grads["NCHW"]))
                      / optax.global_norm(grads["NCHW"])) for lay in LAYOUTS[1:])
    f, t = interleaved(runners_f, rounds, 1), interleaved(runners_t, rounds, 1)
    ok = max(check.values()) < 1e-4 and gdiff < 1e-3
    console.print(f"{name} {size}px b{batch}: eval logits vs torch, rel. err " + ", ".join(
        f"{k} {v:.1e}" for k, v in check.items()) + f"; gradients channels-last vs NCHW, rel. diff {gdiff:.1e}"
        + ("" if ok else " WRONG"))
    for label, d in (("forward", f), ("train step", t)):
        console.print(f"  {label:<10} ms " + "  ".join(f"{k} {v:.2f}" for k, v in d.items()) + "  | NCHW time / "
                      + ", ".join(f"{k}'s {d['proto NCHW'] / d['proto ' + k]:.2f}" for k in LAYOUTS[1:]))
    return {"model": name, "size": size, "batch": batch, "forward_ms": f, "train_ms": t, "rel_err": check,
            "grad_rel_diff": gdiff, "ok": ok}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv3"])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--single-thread", action="store_true")
    parser.add_argument("--cpu-time", action="store_true")
    args = parser.parse_args(argv)
    if args.single_thread:
        from funcnet import profile

        profile.one_core()  # JAX and torch on one core, before JAX starts
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    import conv
    import torch
    from rich.console import Console

    if args.cpu_time:
        conv.CLOCK[0] = time.process_time
    if args.single_thread:
        torch.set_num_threads(1)
    console = Console(width=200)
    console.print(f"single-thread {args.single_thread}, {'CPU' if args.cpu_time else 'wall'} time, "
                  f"medians of {args.rounds} interleaved rounds, load average {os.getloadavg()[0]:.1f}")
    rows = [measure(name, args.size, args.batch, args.rounds, console, conv.interleaved) for name in args.models]
    console.print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
