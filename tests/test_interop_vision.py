"""torchvision's detection ops as JAX functions (``interop.ops.nms``, ``batched_nms``,
``roi_align``) against the numpy oracle of tests/vision_oracle.py, written loop by loop from their
definitions (torchvision is not a dependency; the by-hand figures against torchvision itself are
in docs/design.md); and the op rule of ``torchvision::roi_align`` and the refusal of
``torchvision::nms`` through ``interop.convert``, with torchvision's ops where it is installed and
stand-ins registered under torchvision's names (computing with the oracle) where it is not."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from funcnet.interop import ConversionError, convert, ops  # noqa: E402
from tests import vision_oracle  # noqa: E402

N = 40  # one box count for every nms case: one compiled program per function


def _boxes(rng, n=N, spread=40.0):
    xy = rng.uniform(0, spread, (n, 2))
    wh = rng.uniform(0.5, 15, (n, 2))
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    boxes[3] = boxes[5]  # a duplicate: IoU 1
    boxes[7, 2:] = boxes[7, :2]  # an empty box: IoU 0 (0/0 with another empty one)
    return boxes, (rng.permutation(n) / n).astype(np.float32)  # distinct scores: one greedy order


@functools.cache
def _jitted():
    # the threshold is traced (one program for every threshold), the output size is not
    return jax.jit(ops.nms, static_argnums=3), jax.jit(ops.batched_nms, static_argnums=4)


def test_nms_is_the_greedy_definition():
    nms, _ = _jitted()
    rng = np.random.default_rng(0)
    sizes = []
    for thr in (0.0, 0.2, 0.5, 0.8):
        boxes, scores = _boxes(rng)
        want = vision_oracle.nms(boxes, scores, thr)
        keep, count = nms(boxes, scores, thr, None)
        assert keep.shape == (N,) and int(count) == len(want), thr
        np.testing.assert_array_equal(np.asarray(keep[:len(want)]), want)  # the same boxes, in the same order
        assert (np.asarray(keep[len(want):]) == -1).all()
        sizes.append(len(want))
        short, short_count = nms(boxes, scores, thr, 5)  # torch's keep[:5]
        assert short.shape == (5,) and int(short_count) == min(5, len(want))
        np.testing.assert_array_equal(np.asarray(short[:len(want)]), want[:5])
    assert len(set(sizes)) == 4 and 1 < min(sizes) < max(sizes) < N  # the threshold decides: not a fixed count
    keep, count = ops.nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), 0.5)
    assert keep.shape == (0,) and int(count) == 0


def test_batched_nms_keeps_classes_apart():
    _, batched = _jitted()
    rng = np.random.default_rng(1)
    boxes, scores = _boxes(rng, spread=10.0)  # crowded: most boxes overlap
    idxs = rng.integers(0, 3, N)
    want = vision_oracle.batched_nms(boxes, scores, idxs, 0.3)
    keep, count = batched(boxes, scores, idxs, 0.3, None)
    np.testing.assert_array_equal(np.asarray(keep[:int(count)]), want)
    assert len(want) > len(vision_oracle.nms(boxes, scores, 0.3))  # the classes did keep more boxes


def test_nms_refuses_a_batch_of_boxes():
    with pytest.raises(ValueError, match=r"boxes must be \[N, 4\].*\(2, 5, 4\)"):
        ops.nms(np.zeros((2, 5, 4)), np.zeros((2, 5)), 0.5)


# (image, x1, y1, x2, y2) on 9 x 11 maps: boxes past the left, right and bottom edges (samples in the
# one-pixel band outside that still counts), an empty box, a thin one
ROIS = np.array([[0, 0.5, 1.0, 6.0, 4.5], [1, -2.0, 3.0, 9.5, 7.0], [0, 2.0, 2.0, 2.0, 2.0],
                 [1, 10.0, 1.0, 30.0, 8.0], [0, 1.3, 0.2, 2.1, 5.9], [0, 1.0, 5.0, 8.0, 14.0]])


# (spatial_scale, sampling_ratio, output_size, aligned): the legacy and the aligned form, a fixed and the
# adaptive grid (sampling_ratio <= 0: ceil(box / bins) samples per side, per box)
CONFIGS = [(1.0, 2, (3, 2), False), (0.5, -1, (2, 3), False), (0.5, 1, (3, 3), True), (1.0, 0, (2, 3), True)]


def test_roi_align_is_the_bilinear_definition():
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):  # float64 on both sides: the difference is rounding alone
        x = rng.normal(size=(2, 3, 9, 11))
        boxes = [ROIS[ROIS[:, 0] == i, 1:] for i in range(2)]  # the list form: one array of boxes per image

        @jax.jit  # one program for every case
        def run(x, rois, boxes):
            out = [ops.roi_align(x, rois, size, scale, sampling, aligned) for scale, sampling, size, aligned in CONFIGS]
            return out, ops.roi_align(x, boxes, 3, 1.0, 2, True)

        got, listed = run(jnp.asarray(x), jnp.asarray(ROIS), [jnp.asarray(b) for b in boxes])
        for (scale, sampling, size, aligned), g in zip(CONFIGS, got):
            want = vision_oracle.roi_align(x, ROIS, scale, *size, sampling, aligned)
            # sums of at most 4 x 64 weighted samples of values of size ~3: 1e-12 is rounding
            np.testing.assert_allclose(np.asarray(g), want, rtol=0, atol=1e-12, err_msg=f"{scale} {sampling} {size}")
        order = np.concatenate([np.flatnonzero(ROIS[:, 0] == i) for i in range(2)])
        np.testing.assert_allclose(np.asarray(listed), vision_oracle.roi_align(x, ROIS[order], 1.0, 3, 3, 2, True),
                                   rtol=0, atol=1e-12)


def test_roi_align_gradient_is_its_transpose():
    # roi_align is linear in the input, so <d sum(w * f(x)) / dx, x> = sum(w * f(x)) exactly (a closed form)
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        x, w = jnp.asarray(rng.normal(size=(2, 3, 9, 11))), jnp.asarray(rng.normal(size=(6, 3, 3, 2)))
        f = lambda x: ops.roi_align(x, jnp.asarray(ROIS), (3, 2), 1.0, 2, True)  # noqa: E731
        g, value = jax.jit(lambda x: (jax.grad(lambda x: (w * f(x)).sum())(x), (w * f(x)).sum()))(x)
        assert abs(float((g * x).sum() - value)) < 1e-10
        assert float(jnp.abs(g).max()) > 0.1


# ---- through convert: the torchvision ops as a torch model calls them -------------------------

def _torchvision_ops():
    """torch.ops.torchvision.{roi_align, nms}: torchvision's, or stand-ins under its names."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if not hasattr(torch.ops.torchvision, "roi_align"):
            @torch.library.custom_op("torchvision::roi_align", mutates_args=())
            def _roi_align(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                           pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
                return torch.from_numpy(vision_oracle.roi_align(
                    input.numpy(), rois.numpy(), spatial_scale, pooled_height, pooled_width, sampling_ratio,
                    aligned)).to(input.dtype)

            @torch.library.custom_op("torchvision::nms", mutates_args=())
            def _nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
                return torch.from_numpy(vision_oracle.nms(dets.numpy(), scores.numpy(), iou_threshold))
    return torch.ops.torchvision


class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, rois):
        return _torchvision_ops().roi_align(self.conv(x), rois, 0.5, 3, 2, 2, True).flatten(1)


class Suppress(torch.nn.Module):
    def forward(self, boxes, scores):
        keep = _torchvision_ops().nms(boxes, scores, 0.5)
        return boxes[keep]


def test_convert_maps_torchvision_roi_align():
    torch.manual_seed(0)
    module = Pool()
    rois = torch.tensor(ROIS * [1, 2, 2, 2, 2], dtype=torch.float32)  # boxes in pixels of the input
    model, params, _ = convert(module, torch.randn(2, 3, 8, 10), rois, train=False)
    x = torch.randn(2, 3, 9, 11)  # another image size, other values
    with torch.no_grad():
        want = module(x, rois).numpy()
    got = np.asarray(jax.jit(lambda p, x, r: model.apply(p, x, r, train=False))(params, jnp.asarray(x.numpy()),
                                                                                jnp.asarray(rois.numpy())))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # float32: a 27-tap conv, then 4-sample means


def test_convert_refuses_torchvision_nms_at_the_calling_line():
    boxes, scores = _boxes(np.random.default_rng(4))
    with pytest.raises(ConversionError) as info:
        convert(Suppress(), torch.from_numpy(boxes), torch.from_numpy(scores), train=False)
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "keep = _torchvision_ops().nms" in text)
    message = str(info.value)
    assert f"test_interop_vision.py:{line}" in message and "torch.ops.torchvision.nms" in message
    assert "funcnet.interop.ops.nms" in message and "depends on the data" in message
