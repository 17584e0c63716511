"""ConvTranspose's ``output_size=`` (torch's ``forward(x, output_size=...)``) against torch,
through tests/torch_oracle.check_layer (forward, input and weight gradients, one compile), in
train mode in float32 and eval mode in float64 (a convolution has no mode); the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from tests.torch_oracle import check_layer

MODES = [(True, "float32"), (False, "float64")]

# (id, class name, args, kwargs, input shape, output_size)
TABLE = [
    # stride 2: two sizes map to the same strided-conv output; output_size picks the larger
    ("T2d-stride2-larger", "ConvTranspose2d", (3, 2, 3), dict(stride=2, padding=1), (2, 3, 4, 5), (8, 10)),
    ("T2d-stride3-mixed-full-shape", "ConvTranspose2d", (2, 4, 3), dict(stride=(3, 2), padding=1, groups=2),
     (2, 2, 3, 4), (2, 4, 9, 7)),
    # output_size overrides the built output_padding, as torch
    ("T1d-overrides-output-padding", "ConvTranspose1d", (3, 2, 4), dict(stride=3, output_padding=1), (2, 3, 5), (16,)),
    ("T3d-unbatched-dilation", "ConvTranspose3d", (2, 2, 2), dict(stride=2, dilation=2), (2, 2, 3, 2), (2, 6, 8, 6)),
]
IDS = [row[0] for row in TABLE]


def _pair(row, dtype):
    _, cls, args, kwargs, _, output_size = row
    base = getattr(torch.nn, cls)
    # a subclass keeps torch's state_dict keys; its forward passes the fixed output_size
    theirs = type(cls, (base,), {"forward": lambda self, x: base.forward(self, x, output_size=list(output_size))})
    return getattr(nn, cls)(*args, **kwargs, dtype=jnp.dtype(dtype)), theirs(*args, **kwargs)


@pytest.mark.parametrize("train,dtype", MODES)
@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_output_size_equals_torch(row, train, dtype):
    x = np.random.default_rng(0).standard_normal(row[4])
    with jax.enable_x64(dtype == "float64"):
        torch.manual_seed(0)
        ours, theirs = _pair(row, dtype)
        out = check_layer(ours, theirs, [x], train=train, dtype=dtype, kwargs={"output_size": row[5]},
                          torch_kwargs={})
    n = int(row[1][-2])  # spatial axes
    assert out.shape[-n:] == tuple(row[5])[-n:]


def test_errors_are_named():
    layer = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    params = layer.init(jax.random.key(0))
    x = jnp.zeros((1, 3, 4, 5))
    with pytest.raises(ValueError, match=r"requested an output size of \(9, 10\), but valid sizes range from \(7, 9\) "
                                         r"to \(8, 10\)"):
        layer.apply(params, x, output_size=(9, 10))
    with pytest.raises(ValueError, match=r"for a 4D input, output_size must have 2 or 4 elements, got \(8,\)"):
        layer.apply(params, x, output_size=(8,))
    conv = nn.Conv2d(3, 2, 3)
    with pytest.raises(TypeError, match="output_size= is an argument of the transposed convolutions only"):
        conv.apply(conv.init(jax.random.key(0)), x, output_size=(2, 3))
