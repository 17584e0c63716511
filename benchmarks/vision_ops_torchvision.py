"""funcnet.interop.ops.nms / batched_nms / roi_align against torchvision itself, and
torchvision's swin_v2_t converted and compared on inputs of another batch and image size.

Needs torchvision (the library zoo's venv, docs/design.md "Converting library models"):
``PYTHONPATH=. V/bin/python benchmarks/vision_ops_torchvision.py``. The figures are quoted in
docs/design.md ("torchvision's detection ops, and what stays refused")."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchvision

from funcnet import interop
from funcnet.interop import ops


def nms_cases(rng, trials=40):
    for trial in range(trials):
        n = int(rng.integers(1, 300))
        xy, wh = rng.uniform(0, 50, (n, 2)), rng.uniform(0.5, 20, (n, 2))
        boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
        scores = (rng.permutation(n) / n).astype(np.float32)
        thr, idxs = float(rng.uniform(0.1, 0.9)), rng.integers(0, 4, n)
        tb, ts = torch.from_numpy(boxes), torch.from_numpy(scores)
        for want, (keep, count) in ((torchvision.ops.nms(tb, ts, thr).numpy(), ops.nms(boxes, scores, thr)),
                                    (torchvision.ops.batched_nms(tb, ts, torch.from_numpy(idxs), thr).numpy(),
                                     ops.batched_nms(boxes, scores, idxs, thr))):
            assert int(count) == len(want) and (np.asarray(keep)[:len(want)] == want).all(), trial
            assert (np.asarray(keep)[len(want):] == -1).all(), trial
    print(f"nms, batched_nms: {trials} random sets of 1-300 boxes equal torchvision (indices, order, count)")


def roi_align_worst(rng, dtype, samplings, scales):
    worst = top = 0.0
    for aligned in (False, True):
        for sampling in samplings:
            for scale in scales:
                x = rng.normal(size=(2, 3, 13, 11)).astype(dtype)
                xy, wh = rng.uniform(-8, 50, (17, 2)), rng.uniform(0, 30, (17, 2))
                rois = np.concatenate([rng.integers(0, 2, (17, 1)), xy, xy + wh], 1).astype(dtype)
                rois[0, 1:] = 3.0  # an empty box
                want = torchvision.ops.roi_align(torch.from_numpy(x), torch.from_numpy(rois), (5, 4), scale,
                                                 sampling, aligned).numpy()
                got = jax.jit(lambda x, r: ops.roi_align(x, r, (5, 4), scale, sampling, aligned))(x, rois)
                worst, top = max(worst, float(np.abs(np.asarray(got) - want).max())), max(top, float(np.abs(want).max()))
    return worst, top


def roi_align_gradient(rng):
    x = rng.normal(size=(1, 2, 9, 9)).astype(np.float32)
    rois = np.array([[0, 1.2, 0.7, 6.3, 7.9], [0, -2, 3, 4, 12]], np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    torchvision.ops.roi_align(tx, torch.from_numpy(rois), 3, 1.0, 2, True).pow(2).sum().backward()
    g = jax.grad(lambda x: (ops.roi_align(x, rois, 3, 1.0, 2, True) ** 2).sum())(x)
    return float(np.abs(np.asarray(g) - tx.grad.numpy()).max())


def swin(dtype):
    torch.manual_seed(0)
    m = torchvision.models.swin_v2_t(weights=None).eval().to(dtype)
    model, params, state = interop.convert(m, torch.randn(1, 3, 64, 64, dtype=dtype), train=False)
    run = jax.jit(lambda p, s, x: model.apply(p, x, state=s, train=False)[0])
    for shape in ((2, 3, 64, 64), (1, 3, 96, 96)):
        x = torch.randn(*shape, dtype=dtype)
        with torch.no_grad():
            want = m(x).numpy()
        got = np.asarray(run(params, state, jnp.asarray(x.numpy())))
        print(f"swin_v2_t {str(dtype)[6:]} {shape}: max|diff| {np.abs(got - want).max():.2g} "
              f"(outputs up to {np.abs(want).max():.2g})")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    nms_cases(rng)
    worst, top = roi_align_worst(rng, np.float32, (-1, 0, 1, 2, 3), (1.0, 0.5, 0.25))
    print(f"roi_align float32: max|diff| {worst:.2g} over aligned x 5 sampling ratios x 3 scales (outputs up to "
          f"{top:.2g}); input gradient {roi_align_gradient(rng):.2g}")
    swin(torch.float32)
    jax.config.update("jax_enable_x64", True)
    worst, top = roi_align_worst(rng, np.float64, (-1, 0, 2), (1.0, 0.25))
    print(f"roi_align float64: max|diff| {worst:.2g} over aligned x 3 sampling ratios x 2 scales")
    swin(torch.float64)
