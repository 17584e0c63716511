"""Padding layers and F.pad against torch, through tests/torch_oracle.check_layer (forward,
input gradient, one compile); torch's repr; the errors. No params, no state, no train/eval
difference: each row runs in train mode in float32 and eval mode in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from funcnet.nn import functional as F
from tests.torch_oracle import check_layer

MODES = [(True, "float32"), (False, "float64")]

# (id, class name, args, input shape)
TABLE = [
    ("zero2d", "ZeroPad2d", (1,), (2, 3, 4, 5)),
    ("zero2d-uneven-unbatched", "ZeroPad2d", ((1, 0, 2, 3),), (3, 4, 5)),
    ("zero1d", "ZeroPad1d", ((2, 1),), (2, 3, 4)),
    ("zero3d", "ZeroPad3d", ((1, 0, 0, 2, 1, 1),), (1, 2, 3, 2, 3)),
    ("constant2d-crop", "ConstantPad2d", ((-1, 2, 1, -2), 3.5), (2, 2, 4, 5)),
    ("constant1d", "ConstantPad1d", (2, -1.0), (2, 3, 4)),
    ("constant3d", "ConstantPad3d", (1, 2.0), (1, 2, 2, 3, 2)),
    ("reflection2d", "ReflectionPad2d", ((1, 3, 2, 0),), (2, 2, 4, 5)),
    ("reflection1d-unbatched", "ReflectionPad1d", (3,), (3, 5)),
    ("reflection3d", "ReflectionPad3d", (1,), (1, 2, 3, 3, 2)),
    ("replication2d", "ReplicationPad2d", ((2, 0, 1, 3),), (2, 2, 3, 4)),
    ("replication1d", "ReplicationPad1d", ((0, 4),), (2, 3, 3)),
    ("replication3d-unbatched", "ReplicationPad3d", (1,), (2, 2, 3, 2)),
    ("circular2d", "CircularPad2d", ((1, 2, 3, 0),), (2, 2, 3, 4)),
    ("circular1d", "CircularPad1d", (3,), (2, 3, 3)),
    ("circular3d", "CircularPad3d", (1,), (1, 2, 2, 3, 2)),
]
IDS = [row[0] for row in TABLE]


def _pair(row):
    _, cls, args, _ = row
    return getattr(nn, cls)(*args), getattr(torch.nn, cls)(*args)


@pytest.mark.parametrize("train,dtype", MODES)
@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_padding_equals_torch(row, train, dtype):
    x = np.random.default_rng(0).standard_normal(row[-1])
    with jax.enable_x64(dtype == "float64"):
        ours, theirs = _pair(row)
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_name_is_torch_repr(row):
    ours, theirs = _pair(row)
    assert ours.name == repr(theirs)


def test_functional_pad_equals_torch_on_any_rank():
    # constant mode pads (or crops) any number of trailing axes, whatever the rank
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 2, 3)).astype(np.float32)
    for pads, mode, value in [((1, 2, 0, 1, 2, 0, 1, 1), "constant", None), ((1, -1), "constant", 2.5),
                              ((1, 1, 1, 0), "reflect", None), ((2, 1, 1, 0, 0, 3), "replicate", None),
                              ((3, 0, 1, 2), "circular", None)]:
        v = x if mode == "constant" else x[0]
        want = torch.nn.functional.pad(torch.tensor(v), pads, mode=mode, value=value).numpy()
        np.testing.assert_array_equal(np.asarray(F.pad(jnp.asarray(v), pads, mode, value)), want)


def test_errors_are_named():
    with pytest.raises(ValueError, match=r"ZeroPad2d: padding must be an int or a tuple of 4 ints, got \(1, 2\)"):
        nn.ZeroPad2d((1, 2))
    with pytest.raises(ValueError, match="ConstantPad1d: value must be a number, got None"):
        nn.ConstantPad1d(1, None)
    with pytest.raises(ValueError, match=r"padding \(5, 5\) of an axis of size 4 .* must be in \[0, 3\] in mode "
                                         r"'reflect'"):
        nn.ReflectionPad1d(5).apply({}, jnp.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match=r"padding size 4 is not supported for a 2D input of shape \(3, 4\)"):
        nn.ReplicationPad2d(1).apply({}, jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="padding mode 'reflect' doesn't take in value argument"):
        F.pad(jnp.zeros((1, 3)), (1, 1), "reflect", 0.0)
    with pytest.raises(ValueError, match="pad must be a sequence of ints of even length"):
        F.pad(jnp.zeros((1, 3)), (1,))
    with pytest.raises(ValueError, match="padding length 6 and an input of shape \\(3, 4\\)"):
        F.pad(jnp.zeros((3, 4)), (1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="mode must be one of"):
        F.pad(jnp.zeros((1, 3)), (1, 1), "symmetric")
