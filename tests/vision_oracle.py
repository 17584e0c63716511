"""torchvision's nms and roi_align written plainly in numpy, loop by loop from their definitions:
the oracle of funcnet.interop.ops.nms / roi_align where torchvision is not installed (CI).
Checked by hand against torchvision 0.29.1 (docs/design.md, "Converting by tracing")."""

from __future__ import annotations

import math

import numpy as np


def nms(boxes, scores, iou_threshold):
    """The kept indices, highest score first: take the best remaining box, drop every box whose
    IoU with it is above the threshold, repeat."""
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # Python's sort is stable
    dropped, keep = set(), []
    for a, i in enumerate(order):
        if i in dropped:
            continue
        keep.append(i)
        for j in order[a + 1:]:
            w = min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0])
            h = min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1])
            inter = max(w, 0) * max(h, 0)
            area = lambda b: (b[2] - b[0]) * (b[3] - b[1])  # noqa: E731
            union = area(boxes[i]) + area(boxes[j]) - inter
            if union > 0 and inter / union > iou_threshold:
                dropped.add(j)
    return np.asarray(keep, np.int64)


def batched_nms(boxes, scores, idxs, iou_threshold):
    """nms per index value (class), merged in decreasing score."""
    boxes, scores, idxs = np.asarray(boxes), np.asarray(scores), np.asarray(idxs)
    keep = []
    for c in np.unique(idxs):
        members = np.flatnonzero(idxs == c)
        keep += list(members[nms(boxes[members], scores[members], iou_threshold)])
    return np.asarray(sorted(keep, key=lambda i: -scores[i]), np.int64)


def _bilinear(image, y, x):
    """image [C, H, W] at (y, x): 0 outside [-1, H] x [-1, W], the border value past the edge."""
    _, height, width = image.shape
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return np.zeros(image.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = min(int(y), height - 1), min(int(x), width - 1)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    ly, lx = (y - y0 if y0 < height - 1 else 0.0), (x - x0 if x0 < width - 1 else 0.0)
    return ((1 - ly) * (1 - lx) * image[:, y0, x0] + (1 - ly) * lx * image[:, y0, x1]
            + ly * (1 - lx) * image[:, y1, x0] + ly * lx * image[:, y1, x1])


def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """torchvision::roi_align's arguments: each box's bins, each the mean of a grid of bilinear
    samples at the grid cells' centres (``sampling_ratio`` per side, or ceil(box / bins))."""
    input, rois = np.asarray(input, np.float64), np.asarray(rois, np.float64)
    out = np.zeros((len(rois), input.shape[1], pooled_height, pooled_width))
    shift = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois):
        x1, y1, x2, y2 = (v * spatial_scale - shift for v in (x1, y1, x2, y2))
        height, width = y2 - y1, x2 - x1
        if not aligned:
            height, width = max(height, 1.0), max(width, 1.0)
        bin_h, bin_w = height / pooled_height, width / pooled_width
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(height / pooled_height)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(width / pooled_width)
        for p in range(pooled_height):
            for q in range(pooled_width):
                total = np.zeros(input.shape[1])
                for i in range(gh):
                    for j in range(gw):
                        total += _bilinear(input[int(b)], y1 + p * bin_h + (i + 0.5) * bin_h / gh,
                                           x1 + q * bin_w + (j + 0.5) * bin_w / gw)
                out[k, :, p, q] = total / max(gh * gw, 1)
    return out
