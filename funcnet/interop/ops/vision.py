"""torchvision's detection ops as JAX functions: ``nms``, ``batched_nms`` and ``roi_align``.

``roi_align`` is torchvision.ops.roi_align (``aligned``, ``sampling_ratio``, ``spatial_scale``
and ``output_size`` as there) and is the op rule of ``torch.ops.torchvision.roi_align``: its
output has one row per box, a shape the inputs' shapes fix.

``nms`` and ``batched_nms`` are torchvision's in the static-shape form JAX needs: torch returns
the kept indices, as many as the data keeps; here the result is ``(keep, count)``, ``keep`` a
fixed-size int array of the kept indices in decreasing score (torch's order), padded with -1
after the first ``count``. ``keep[:count]`` (outside jit, or with ``count`` read out) is torch's
answer; under jit use ``keep >= 0`` as the mask. A recorded ``torchvision::nms`` is refused by
``convert`` (``ops.REFUSED``): torch's code after it reads the kept boxes by their number, which a
recording of one image would fix for every other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from funcnet.interop.ops._core import long_dtype, register

__all__ = ["nms", "batched_nms", "box_iou_matrix", "roi_align", "torchvision_roi_align"]


def box_iou_matrix(boxes):
    """IoU of every pair of ``(x1, y1, x2, y2)`` boxes, computed as torchvision's nms kernel does
    (``inter / (area_i + area_j - inter)``, a width or height below 0 counting as 0)."""
    b = jnp.asarray(boxes)
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    w = jnp.maximum(jnp.minimum(x2[:, None], x2[None, :]) - jnp.maximum(x1[:, None], x1[None, :]), 0)
    h = jnp.maximum(jnp.minimum(y2[:, None], y2[None, :]) - jnp.maximum(y1[:, None], y1[None, :]), 0)
    inter = w * h
    return inter / (areas[:, None] + areas[None, :] - inter)


def nms(boxes, scores, iou_threshold: float, max_output_size: int | None = None):
    """torchvision.ops.nms as ``(keep, count)``: greedy non-maximum suppression of ``boxes``
    ``[N, 4]`` (``x1, y1, x2, y2``) by ``scores`` ``[N]``: the highest-scoring box is kept and every
    later box whose IoU with it is above ``iou_threshold`` dropped, and so on down the scores.

    ``keep``: int ``[max_output_size or N]``, the kept indices in decreasing score, then -1;
    ``count``: how many were kept (at most ``max_output_size``, torch's ``keep[:max_output_size]``).
    Boxes of equal score are taken in index order (torch's sort does not promise an order for
    ties). Jittable; the loop runs N steps over an ``[N, N]`` IoU matrix."""
    boxes, scores = jnp.asarray(boxes), jnp.asarray(scores)
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"nms: boxes must be [N, 4] and scores [N], got {boxes.shape} and {scores.shape}; pass "
                         f"one image's boxes (batched_nms keeps classes or images apart)")
    n = boxes.shape[0]
    size = n if max_output_size is None else int(max_output_size)
    if n == 0:
        return jnp.full((size,), -1, long_dtype()), jnp.zeros((), long_dtype())
    order = jnp.argsort(scores, descending=True, stable=True)
    iou = box_iou_matrix(boxes[order])
    later = jnp.arange(n)[None, :] > jnp.arange(n)[:, None]
    over = (iou > iou_threshold) & later  # NaN (two empty boxes) is not above: kept, as in torch

    def step(i, suppressed):
        return suppressed | (~suppressed[i] & over[i])

    kept = ~jax.lax.fori_loop(0, n, step, jnp.zeros((n,), bool))
    (where,) = jnp.nonzero(kept, size=size, fill_value=-1)
    keep = jnp.where(where >= 0, order[jnp.maximum(where, 0)], -1).astype(long_dtype())
    return keep, jnp.minimum(kept.sum(), size).astype(long_dtype())


def batched_nms(boxes, scores, idxs, iou_threshold: float, max_output_size: int | None = None):
    """torchvision.ops.batched_nms as ``(keep, count)`` (see ``nms``): boxes of different
    ``idxs`` (classes, or images) never suppress each other. torchvision's coordinate trick, with
    its arithmetic: every box is moved by ``idx * (boxes.max() + 1)``, so boxes of different
    indices do not overlap, and one ``nms`` runs on them all."""
    boxes = jnp.asarray(boxes)
    if boxes.shape[0] == 0:
        return nms(boxes, scores, iou_threshold, max_output_size)
    offsets = jnp.asarray(idxs).astype(boxes.dtype) * (boxes.max() + jnp.asarray(1, boxes.dtype))
    return nms(boxes + offsets[:, None], scores, iou_threshold, max_output_size)


def _bilinear(flat, height: int, width: int, index, y, x):
    """Bilinear samples of ``flat`` ``[N*H*W, C]`` at ``(y, x)`` of image ``index`` (arrays of one
    shape S): ``[*S, C]``, as torchvision's ``bilinear_interpolate`` (0 outside ``[-1, H] x [-1, W]``,
    clamped to the border inside it)."""
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = jnp.maximum(y, 0), jnp.maximum(x, 0)
    y_low, x_low = jnp.floor(y).astype(jnp.int32), jnp.floor(x).astype(jnp.int32)
    y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = jnp.where(y_edge, height - 1, y_low), jnp.where(x_edge, width - 1, x_low)
    y_high, x_high = jnp.where(y_edge, height - 1, y_low + 1), jnp.where(x_edge, width - 1, x_low + 1)
    y, x = jnp.where(y_edge, y_low.astype(y.dtype), y), jnp.where(x_edge, x_low.astype(x.dtype), x)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    base = index * (height * width)

    def at(yy, xx):
        return flat[base + yy * width + xx]

    out = ((hy * hx)[..., None] * at(y_low, x_low) + (hy * lx)[..., None] * at(y_low, x_high)
           + (ly * hx)[..., None] * at(y_high, x_low) + (ly * lx)[..., None] * at(y_high, x_high))
    return jnp.where(outside[..., None], 0, out)


def torchvision_roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int,
                          sampling_ratio: int, aligned: bool):
    """``torch.ops.torchvision.roi_align``: ``input`` ``[N, C, H, W]``, ``rois`` ``[K, 5]`` (image
    index, x1, y1, x2, y2) -> ``[K, C, pooled_height, pooled_width]``, each bin the mean of a
    ``sampling_ratio`` x ``sampling_ratio`` grid of bilinear samples (``sampling_ratio <= 0``:
    ``ceil(roi size / bins)`` per box, torchvision's adaptive grid, run as a loop over the largest
    grid: forward only, as its length is read from the boxes). ``aligned=True`` shifts the boxes by
    half a pixel (pixel centres at +0.5); ``aligned=False`` keeps torchvision's legacy form (no
    shift, a box at least 1 wide)."""
    x, rois = jnp.asarray(input), jnp.asarray(rois)
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[-1] != 5:
        raise ValueError(f"roi_align: input must be [N, C, H, W] and rois [K, 5] (image index, x1, y1, x2, y2), got "
                         f"{x.shape} and {rois.shape}; pass boxes as a list of [L, 4] arrays to ops.roi_align")
    n, c, height, width = x.shape
    ph, pw = int(pooled_height), int(pooled_width)
    dt = x.dtype
    rois = rois.astype(dt)
    flat = x.transpose(0, 2, 3, 1).reshape(n * height * width, c)
    index = rois[:, 0].astype(jnp.int32)
    offset = jnp.asarray(0.5 if aligned else 0.0, dt)
    scale = jnp.asarray(spatial_scale, dt)
    x1, y1 = rois[:, 1] * scale - offset, rois[:, 2] * scale - offset
    x2, y2 = rois[:, 3] * scale - offset, rois[:, 4] * scale - offset
    rw, rh = x2 - x1, y2 - y1
    if not aligned:
        rw, rh = jnp.maximum(rw, 1), jnp.maximum(rh, 1)
    bin_h, bin_w = rh / ph, rw / pw
    p_h, p_w = jnp.arange(ph, dtype=dt), jnp.arange(pw, dtype=dt)

    def samples(iy, ix, gh, gw):
        """[K, ph, pw, C] at grid point (iy, ix) of each bin (arrays broadcast against [K])."""
        ys = y1[:, None] + p_h * bin_h[:, None] + ((iy + 0.5) * bin_h / gh)[..., None]  # [K, ph]
        xs = x1[:, None] + p_w * bin_w[:, None] + ((ix + 0.5) * bin_w / gw)[..., None]  # [K, pw]
        shape = (rois.shape[0], ph, pw)
        return _bilinear(flat, height, width, jnp.broadcast_to(index[:, None, None], shape),
                         jnp.broadcast_to(ys[:, :, None], shape), jnp.broadcast_to(xs[:, None, :], shape))

    if sampling_ratio > 0:
        g = int(sampling_ratio)
        total = jnp.zeros((rois.shape[0], ph, pw, c), dt)
        for iy in range(g):
            for ix in range(g):
                total = total + samples(jnp.asarray(iy, dt), jnp.asarray(ix, dt), jnp.asarray(g, dt),
                                        jnp.asarray(g, dt))
        out = total / jnp.asarray(g * g, dt)
    else:
        gh, gw = jnp.ceil(rh / ph).astype(jnp.int32), jnp.ceil(rw / pw).astype(jnp.int32)  # per box
        top_w = jnp.maximum(jnp.max(gw, initial=0), 1)
        steps = jnp.max(gh, initial=0) * top_w

        def body(t, total):
            iy, ix = t // top_w, t % top_w
            active = ((iy < gh) & (ix < gw))[:, None, None, None]
            value = samples(iy.astype(dt), ix.astype(dt), gh.astype(dt), gw.astype(dt))
            return total + jnp.where(active, value, 0)

        total = jax.lax.fori_loop(0, steps, body, jnp.zeros((rois.shape[0], ph, pw, c), dt))
        out = total / jnp.maximum(gh * gw, 1).astype(dt)[:, None, None, None]
    return out.transpose(0, 3, 1, 2)


def roi_align(input, boxes, output_size, spatial_scale: float = 1.0, sampling_ratio: int = -1,
              aligned: bool = False):
    """torchvision.ops.roi_align: ``boxes`` a ``[K, 5]`` array (image index first) or a list of
    ``[L_i, 4]`` arrays, one per image; ``output_size`` an int or ``(h, w)``. See
    ``torchvision_roi_align``."""
    if isinstance(boxes, (list, tuple)):
        boxes = jnp.concatenate([jnp.concatenate([jnp.full((jnp.shape(b)[0], 1), i, jnp.asarray(b).dtype),
                                                  jnp.asarray(b)], axis=1) for i, b in enumerate(boxes)], axis=0)
    h, w = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    return torchvision_roi_align(input, boxes, spatial_scale, h, w, sampling_ratio, aligned)


register(["torch.ops.torchvision.roi_align"], torchvision_roi_align)
