"""One dtype rule for every layer: parameters and float buffers follow JAX's default float, as
``jnp.zeros`` does (float64 under x64, float32 otherwise), or the ``dtype=`` given. Run over
the layer tables of the families, so a new row is covered without a new test."""

import jax
import jax.numpy as jnp
import pytest

from funcnet import nn
from tests.test_nn_activation import TABLE as ACTIVATIONS
from tests.test_nn_conv import TABLE as CONVS
from tests.test_nn_embedding import CASES as EMBEDDINGS
from tests.test_nn_norm import TABLE as NORMS

LAYERS = (
    [(f"conv-{row[0]}", lambda row=row: getattr(nn, row[1])(*row[2], **row[3])) for row in CONVS]
    + [(f"norm-{row.id}", lambda row=row: row.values[0](None)) for row in NORMS]
    + [(f"activation-{row[0]}", row[1]) for row in ACTIVATIONS]
    + [(f"embedding-{row[0]}", lambda row=row: nn.Embedding(10, 4, **row[1])) for row in EMBEDDINGS]
    + [("linear", lambda: nn.Linear(3, 4)), ("linear-nobias", lambda: nn.Linear(3, 4, bias=False)),
       ("mha", lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True)),
       ("mha-kdim", lambda: nn.MultiheadAttention(8, 2, kdim=3, vdim=5)),
       ("sequential", lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 2))),
       ("encoder-layer", lambda: nn.TransformerEncoderLayer(8, 2, 16)),
       ("decoder-layer", lambda: nn.TransformerDecoderLayer(8, 2, 16)),
       ("transformer", lambda: nn.Transformer(8, 2, 1, 1, 16)),
       ("lstm-proj", lambda: nn.LSTM(3, 4, 2, proj_size=2, bidirectional=True)), ("gru", lambda: nn.GRU(3, 4)),
       ("rnn", lambda: nn.RNN(3, 4)), ("lstm-cell", lambda: nn.LSTMCell(3, 4)), ("gru-cell", lambda: nn.GRUCell(3, 4)),
       ("instance-norm", lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True)),
       ("batch-norm-3d", lambda: nn.BatchNorm3d(3))]
)


def _float_dtypes(tree):
    return {str(leaf.dtype) for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.floating)}


@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x32"])
@pytest.mark.parametrize("build", [b for _, b in LAYERS], ids=[i for i, _ in LAYERS])
def test_params_and_buffers_follow_jax_default_float(build, x64):
    want = "float64" if x64 else "float32"
    with jax.enable_x64(x64):
        layer = build()
        params = layer.init(jax.random.key(0))
        state = nn.initial_state(layer)
        assert _float_dtypes(params) <= {want}, f"{layer.name}: params {_float_dtypes(params)}, expected {want}"
        assert _float_dtypes(state) <= {want}, f"{layer.name}: state {_float_dtypes(state)}, expected {want}"


@pytest.mark.parametrize("build", [
    lambda: nn.Linear(3, 4, dtype=jnp.float32), lambda: nn.Conv2d(1, 2, 3, dtype=jnp.float32),
    lambda: nn.BatchNorm1d(3, dtype=jnp.float32), lambda: nn.LayerNorm(3, dtype=jnp.float32),
    lambda: nn.Embedding(5, 2, dtype=jnp.float32), lambda: nn.MultiheadAttention(4, 2, dtype=jnp.float32),
    lambda: nn.PReLU(dtype=jnp.float32), lambda: nn.GroupNorm(1, 2, dtype=jnp.bfloat16)])
def test_explicit_dtype_wins_under_x64(build):
    with jax.enable_x64(True):
        layer = build()
        dtypes = _float_dtypes((layer.init(jax.random.key(0)), nn.initial_state(layer)))
    assert len(dtypes) == 1 and dtypes.pop() in ("float32", "bfloat16")
