"""interop.convert on transformers' DetrModel (a tiny ResNet backbone built locally, no download):
equal to torch on the input it was traced on and on one of another batch and image size. Its position
embedding is a child called with ``dtype=pixel_values.dtype, device=pixel_values.device``: those
constants must be recorded as the replay passes them, or the converted model refuses its own input."""

import inspect
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from funcnet import interop, nn  # noqa: E402


@pytest.fixture(scope="module")
def detr():
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                                         out_features=["stage2"])
    cfg = transformers.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                                  d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                  decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=5)
    torch.manual_seed(0)
    module = transformers.DetrModel(cfg).eval()
    traced = torch.randn(1, 3, 32, 32)
    # train=False: DETR's train path branches on torch.isfinite(h).all(), which is refused with its line
    model, params, state = interop.convert(module, traced, train=False)
    run = jax.jit(lambda p, s, x: nn.call(model, p, s, x, train=False)[0]["last_hidden_state"])
    return module, traced, run, params, state


def _check(detr, x):
    module, _, run, params, state = detr
    with torch.no_grad():
        want = module(pixel_values=x).last_hidden_state.numpy()
    got = np.asarray(run(params, state, x.numpy()))
    assert got.shape == want.shape
    # float32 rounding through ~40 ops (convs of 7*7*3 terms, LayerNorm over 16, attention over <= 30 keys):
    # a few hundred eps relative to the output's magnitude; a wrong op or a shape baked in is off by O(1)
    tol = 256 * np.finfo(np.float32).eps * (1 + np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def test_detr_matches_torch_on_the_input_it_was_traced_on(detr):
    _check(detr, detr[1])


def test_detr_matches_torch_on_another_batch_and_image_size(detr):
    _check(detr, torch.randn(2, 3, 48, 40, generator=torch.Generator().manual_seed(1)))


def test_detr_train_mode_is_refused_in_one_line_at_transformers_own_line(detr):
    from transformers.models.detr import modeling_detr

    module, traced = detr[0], detr[1]
    lines, start = inspect.getsourcelines(modeling_detr.DetrEncoderLayer.forward)
    line = start + next(i for i, text in enumerate(lines) if "torch.isfinite" in text)
    with pytest.raises(interop.ConversionError) as info:
        interop.convert(module, traced)  # train=True records the training branch on the data
    message = str(info.value)
    assert "\n" not in message, message
    assert f"{os.path.abspath(modeling_detr.__file__)}:{line}" in message, message
    assert "train=False" in message
    assert not module.training  # the module is left in the mode it was given
