"""RNN / LSTM / GRU and their cells against torch, through tests/torch_oracle.check_layer.

Rows with an initial state or ``lengths=`` go through a thin adapter on both sides: torch's
module packs the padded batch with ``pack_padded_sequence(enforce_sorted=False)`` and pads the
output back (``total_length=L``); both sides return the flattened ``(output, h_n[, c_n])`` as
the main output, so the gradient check covers the final states too, then the structured outputs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_oracle import check_layer

from funcnet import nn

I, H, T, N = 3, 4, 5, 3
KINDS = {"RNN": (nn.RNN, torch.nn.RNN), "LSTM": (nn.LSTM, torch.nn.LSTM), "GRU": (nn.GRU, torch.nn.GRU),
         "RNNCell": (nn.RNNCell, torch.nn.RNNCell), "LSTMCell": (nn.LSTMCell, torch.nn.LSTMCell),
         "GRUCell": (nn.GRUCell, torch.nn.GRUCell)}


def _torch_adapter(cls, batch_first):
    class Adapted(cls):
        def forward(self, x, *hs, lengths=None):
            hx = None if not hs else hs[0] if len(hs) == 1 else tuple(hs)
            if isinstance(self, torch.nn.RNNCellBase):
                outs = super().forward(x, hx)
                outs = outs if isinstance(outs, tuple) else (outs,)
                return torch.cat([o.reshape(-1) for o in outs]), outs
            if lengths is not None:
                x = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first, enforce_sorted=False)
            out, h = super().forward(x, hx)
            if lengths is not None:
                out = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first, total_length=T)[0]
            flat = (out,) + (h if isinstance(h, tuple) else (h,))
            return torch.cat([o.reshape(-1) for o in flat]), (out, h)

    return Adapted


def _ours_adapter(model):
    def apply(params, x, *hs, lengths=None, key=None, train=False):
        hx = None if not hs else hs[0] if len(hs) == 1 else tuple(hs)
        kw = {} if lengths is None else dict(lengths=lengths)
        out = model.apply(params, x, hx, key=key, train=train, **kw)
        if isinstance(out, tuple) and len(out) == 2 and not hasattr(out[1], "shape") and "Cell" not in model.name:
            flat = (out[0],) + tuple(out[1])  # LSTM: (output, (h_n, c_n))
        else:
            flat = out if isinstance(out, tuple) else (out,)
        cells = "Cell" in model.name
        return jnp.concatenate([o.reshape(-1) for o in flat]), (tuple(flat) if cells else out)

    return model._replace(apply=apply)


# name: (kind, constructor kwargs, input layout, initial states, lengths, train)
CASES = {
    "rnn_tanh": ("RNN", {}, "LNF", 0, False, True),
    "rnn_relu_2layers_bidir_h0": ("RNN", dict(nonlinearity="relu", num_layers=2, bidirectional=True), "LNF", 1,
                                  False, True),
    "rnn_unbatched_no_bias_h0": ("RNN", dict(bias=False), "LF", 1, False, True),
    "lstm_2layers_eval_dropout": ("LSTM", dict(num_layers=2, dropout=0.5), "LNF", 0, False, False),
    "lstm_2layers_bidir_batch_first_hc_lengths": (
        "LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), "NLF", 2, True, True),
    "lstm_proj_bidir_hc_lengths": ("LSTM", dict(proj_size=2, bidirectional=True), "LNF", 2, True, True),
    "lstm_unbatched_proj_no_bias_hc": ("LSTM", dict(proj_size=3, bias=False), "LF", 2, False, True),
    "gru_2layers_bidir_batch_first_h0_lengths": (
        "GRU", dict(num_layers=2, bidirectional=True, batch_first=True), "NLF", 1, True, True),
    "gru_no_bias_lengths_no_h0": ("GRU", dict(bias=False), "LNF", 0, True, True),
    "rnn_cell_tanh_h": ("RNNCell", {}, "NF", 1, False, True),
    "rnn_cell_relu_no_bias": ("RNNCell", dict(nonlinearity="relu", bias=False), "NF", 0, False, True),
    "lstm_cell_hc": ("LSTMCell", {}, "NF", 2, False, True),
    "lstm_cell_unbatched": ("LSTMCell", dict(bias=False), "F", 0, False, True),
    "gru_cell_h": ("GRUCell", {}, "NF", 1, False, True),
    "gru_cell_unbatched_h": ("GRUCell", {}, "F", 1, False, True),
}


def _inputs(rng, kind, ctor, layout, states, dtype):
    shape = {"LNF": (T, N, I), "NLF": (N, T, I), "LF": (T, I), "NF": (N, I), "F": (I,)}[layout]
    xs = [rng.standard_normal(shape)]
    batch = () if layout in ("LF", "F") else (N,)
    if "Cell" in kind:
        xs += [rng.standard_normal(batch + (H,)) for _ in range(states)]
    else:
        lead = (ctor.get("num_layers", 1) * (2 if ctor.get("bidirectional") else 1),) + batch
        xs += [rng.standard_normal(lead + ((ctor.get("proj_size") or H) if i == 0 else H,)) for i in range(states)]
    return [x.astype(dtype) for x in xs]


# every row in float32; in float64 the rows that cover both directions, several layers and lengths
RUNS = [(c, "float32") for c in CASES] + [(c, "float64") for c in (
    "rnn_relu_2layers_bidir_h0", "lstm_2layers_bidir_batch_first_hc_lengths",
    "gru_2layers_bidir_batch_first_h0_lengths",
    "lstm_cell_hc", "gru_cell_h")]


@pytest.mark.parametrize("case, dtype", RUNS)
def test_recurrent_equals_torch(case, dtype):
    kind, ctor, layout, states, with_lengths, train = CASES[case]
    ours_cls, torch_cls = KINDS[kind]
    rng = np.random.default_rng(len(case))
    with jax.enable_x64(dtype == "float64"):
        torch.manual_seed(0)
        adapted = states > 0 or with_lengths
        theirs = (_torch_adapter(torch_cls, ctor.get("batch_first", False)) if adapted else torch_cls)(I, H, **ctor)
        ours = ours_cls(I, H, **ctor, dtype=jnp.dtype(dtype))
        ours = _ours_adapter(ours) if adapted else ours
        kwargs = {}
        if with_lengths:
            kwargs["lengths"] = np.array([T, 2, 4])  # unsorted, one full-length, one short
        check_layer(ours, theirs, _inputs(rng, kind, ctor, layout, states, dtype), train=train, dtype=dtype,
                    kwargs=kwargs)


def test_dropout_one_between_layers_feeds_zeros_to_the_next_layer_as_torch():
    # p=1 makes torch's dropout deterministic (all zeros): the second layer sees zeros, the last
    # layer's output is not dropped. Exact placement of the dropout, checked against torch.
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(I, H, num_layers=3, dropout=1.0)
    ours = nn.LSTM(I, H, num_layers=3, dropout=1.0)
    key = jax.random.PRNGKey(0)  # a raw key: the oracle calls the step twice with it
    check_layer(ours, theirs, [rng.standard_normal((T, N, I))], train=True, kwargs=dict(key=key), torch_kwargs={})


def test_dropout_between_layers_needs_a_key_and_draws_masks():
    model = nn.GRU(I, H, num_layers=2, dropout=0.5)
    params = model.init(jax.random.key(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((T, N, I)), jnp.float32)
    with pytest.raises(ValueError, match="PRNG key"):
        model.apply(params, x, train=True)
    apply = jax.jit(model.apply, static_argnames="train")
    k1, k2 = jax.random.split(jax.random.key(1))
    a, b = apply(params, x, key=jax.random.clone(k1), train=True)[0], apply(params, x, key=k2, train=True)[0]
    np.testing.assert_array_equal(a, apply(params, x, key=k1, train=True)[0])
    assert not np.allclose(a, b) and not np.allclose(a, apply(params, x, train=False)[0])


@pytest.mark.parametrize("kind, ctor", [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=2)),
                                        ("GRU", dict(bias=False)), ("LSTMCell", {}), ("RNNCell", {})])
def test_init_is_torchs_uniform(kind, ctor):
    ours_cls, torch_cls = KINDS[kind]
    params = ours_cls(I, 64, **ctor).init(jax.random.key(0))
    theirs = torch_cls(I, 64, **ctor)
    assert {k: v.shape for k, v in params.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    bound = 1 / np.sqrt(64)
    for k, v in params.items():
        v = np.asarray(v)
        assert v.min() >= -bound and v.max() <= bound, k
        assert abs(v.std() - bound / np.sqrt(3)) < 0.15 * bound, k  # U(-b, b) has std b / sqrt(3)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="Unknown nonlinearity 'sigmoid'"):
        nn.RNN(I, H, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="proj_size=4 has to be smaller than hidden_size=4"):
        nn.LSTM(I, H, proj_size=4)
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(I, H, dropout=0.2)
    model = nn.LSTM(I, H, num_layers=2)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"input_size. Expected 3, got 5"):
        model.apply(params, jnp.zeros((T, N, 5)))
    with pytest.raises(ValueError, match=r"h_0 has shape \(1, 3, 4\), expected \(2, 3, 4\)"):
        model.apply(params, jnp.zeros((T, N, I)), (jnp.zeros((1, N, H)), jnp.zeros((2, N, H))))
    with pytest.raises(TypeError, match=r"hx must be a tuple \(h_0, c_0\)"):
        model.apply(params, jnp.zeros((T, N, I)), jnp.zeros((2, N, H)))
    with pytest.raises(ValueError, match=r"lengths range over \[0, 5\], expected every length in \[1, 5\]"):
        model.apply(params, jnp.zeros((T, N, I)), lengths=np.array([5, 0, 2]))
    with pytest.raises(ValueError, match="lengths must be 3 integers"):
        model.apply(params, jnp.zeros((T, N, I)), lengths=np.array([5, 2]))
