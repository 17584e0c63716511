"""Recurrent layers, as torch.nn's RNN, LSTM, GRU and their one-step cells.

A cell is a pure function of (input projection, hidden) -> (new hidden, output); a layer runs
it over time with one ``lax.scan`` (both directions of a bidirectional layer in the same scan,
vmapped over the direction). The input projection ``x @ W_ih.T + b_ih`` of every time step is
one matmul before the scan, as cuDNN does; only ``h @ W_hh.T`` is inside the loop.

torch counterpart: ``nn.LSTM`` runs a fused C++ loop; a Python port that loops over time steps
(``for t in range(T): h, c = cell(x[t], (h, c))``) rebuilds the autograd graph at every step.
Here the loop is one compiled ``while`` whatever the length (see ``comparisons/recurrent.py``).

Names, layouts and gate order are torch's: ``weight_ih_l{k}[_reverse]`` ``(gates*hidden,
input)``, ``weight_hh_l{k}`` ``(gates*hidden, hidden or proj_size)``, ``bias_ih_l{k}``,
``bias_hh_l{k}``, ``weight_hr_l{k}`` ``(proj_size, hidden)``; LSTM gates i, f, g, o; GRU gates
r, z, n with ``b_hn`` inside the reset product: ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``.
Every parameter starts U(-1/sqrt(hidden), 1/sqrt(hidden)).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> lstm = nn.LSTM(4, 8, batch_first=True)
    >>> out, (h, c) = lstm.apply(lstm.init(jax.random.key(0)), jnp.ones((2, 5, 4)))
    >>> out.shape, h.shape, c.shape
    ((2, 5, 8), (1, 2, 8), (1, 2, 8))
"""

from __future__ import annotations

import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.nn.dropout import _need_key
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.misc import drop as _drop
from funcnet.nn.module import Module, check_params, describe

__all__ = ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _step(mode: str):
    """``step(p, gx, carry) -> (carry, h)``: one time step. ``gx`` is the input projection
    (with ``b_ih``; with ``b_hh`` too except for GRU, whose ``b_hn`` sits inside the reset
    product); ``p`` holds ``w_hh`` (and ``b_hh`` for GRU, ``w_hr`` for a projected LSTM)."""

    def rnn(p, gx, carry):
        (h,) = carry
        pre = gx + h @ p["w_hh"].T
        h = jnp.tanh(pre) if mode == "RNN_TANH" else jax.nn.relu(pre)
        return (h,), h

    def lstm(p, gx, carry):
        h, c = carry
        i, f, g, o = jnp.split(gx + h @ p["w_hh"].T, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if "w_hr" in p:
            h = h @ p["w_hr"].T
        return (h, c), h

    def gru(p, gx, carry):
        (h,) = carry
        gh = h @ p["w_hh"].T
        if "b_hh" in p:
            gh = gh + p["b_hh"]
        r_x, z_x, n_x = jnp.split(gx, 3, axis=-1)
        r_h, z_h, n_h = jnp.split(gh, 3, axis=-1)
        r = jax.nn.sigmoid(r_x + r_h)
        z = jax.nn.sigmoid(z_x + z_h)
        n = jnp.tanh(n_x + r * n_h)
        h = (1.0 - z) * n + z * h
        return (h,), h

    return {"LSTM": lstm, "GRU": gru}.get(mode, rnn)


def _project(mode, p, x):
    # the input projection of every step at once: (..., F) -> (..., gates*H)
    gx = x @ p["w_ih"].T
    if "b_ih" in p:
        gx = gx + p["b_ih"]
        if mode != "GRU":
            gx = gx + p["b_hh"]
    return gx


def _scan(mode, p, gx, carry, mask):
    """One direction: ``gx`` (T, B, G), ``carry`` tuple of (B, *), ``mask`` (T, B, 1) or None."""
    step = _step(mode)
    inner = {k: v for k, v in p.items() if k in ("w_hh", "w_hr") or (k == "b_hh" and mode == "GRU")}

    carry = _varying_as(carry, (inner, gx, mask))

    def body(carry, inputs):
        g, m = inputs
        new, h = step(inner, g, carry)
        if m is not None:  # past a sequence's length: keep its hidden state, output zeros (torch's padding)
            new = tuple(jnp.where(m, a, b) for a, b in zip(new, carry))
            h = jnp.where(m, h, jnp.zeros_like(h))
        return new, h

    return jax.lax.scan(body, carry, (gx, mask))


def _varying_axes(a) -> frozenset:
    """The shard_map mesh axes along which ``a`` differs between devices (empty outside shard_map)."""
    aval = jax.typeof(a)
    manual = getattr(aval, "manual_axis_type", None)  # JAX 0.10; earlier releases call it ``vma``
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def _varying_as(carry, inputs):
    """``carry`` marked as varying along every mesh axis ``inputs`` vary along. Under shard_map a
    scan's carry must keep its type, and the step's output varies wherever the batch or the
    weights do: zeros (or an ``hx`` shared by all devices) would start as invariant and the scan
    would be refused. Outside shard_map nothing varies and the carry is returned unchanged."""
    axes = frozenset().union(*(_varying_axes(a) for a in jax.tree.leaves(inputs)))
    return tuple(jax.lax.pcast(c, tuple(sorted(missing)), to="varying") if (missing := axes - _varying_axes(c))
                 else c for c in carry)


def _positive_int(value, arg, where, minimum=1):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{where}: {arg} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _uniform_init(shapes, hidden_size, dtype):
    bound = 1.0 / np.sqrt(hidden_size)

    def init(key):
        keys = jax.random.split(key, len(shapes))
        dt = float_dtype(dtype)  # JAX's default float unless dtype= is given (float64 under x64)
        return {name: jax.random.uniform(k, shape, dt, -bound, bound) for (name, shape), k in zip(shapes, keys)}

    return init


def _rnn_base(mode, where, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
              proj_size, dtype) -> Module:
    input_size = _positive_int(input_size, "input_size", where)
    hidden_size = _positive_int(hidden_size, "hidden_size", where)
    num_layers = _positive_int(num_layers, "num_layers", where)
    proj_size = _positive_int(proj_size, "proj_size", where, minimum=0)
    for arg, value in (("bias", bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {arg} should be of type bool, got: {type(value).__name__}")
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout <= 1:
        raise ValueError(f"{where}: dropout should be a number in range [0, 1] representing the probability of an "
                         f"element being zeroed, got {dropout!r}")
    if dropout > 0 and num_layers == 1:
        warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                      f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                      stacklevel=3)
    if proj_size and mode != "LSTM":
        raise ValueError(f"{where}: proj_size argument is only supported for LSTM, not RNN or GRU")
    if proj_size >= hidden_size:
        raise ValueError(f"{where}: proj_size={proj_size} has to be smaller than hidden_size={hidden_size}")

    D = 2 if bidirectional else 1
    real_hidden = proj_size or hidden_size
    G = _GATES[mode] * hidden_size
    suffixes = ("", "_reverse")[:D]
    shapes = []  # torch's _flat_weights_names order: per layer, per direction, w_ih, w_hh, b_ih, b_hh, w_hr
    for layer in range(num_layers):
        layer_in = input_size if layer == 0 else real_hidden * D
        for sfx in suffixes:
            shapes += [(f"weight_ih_l{layer}{sfx}", (G, layer_in)), (f"weight_hh_l{layer}{sfx}", (G, real_hidden))]
            if bias:
                shapes += [(f"bias_ih_l{layer}{sfx}", (G,)), (f"bias_hh_l{layer}{sfx}", (G,))]
            if proj_size:
                shapes += [(f"weight_hr_l{layer}{sfx}", (proj_size, hidden_size))]
    expected = [n for n, _ in shapes]
    opts = [f"{input_size}, {hidden_size}"] + [
        f"{n}={v}" for n, v, d in (("proj_size", proj_size, 0), ("num_layers", num_layers, 1), ("bias", bias, True),
                                   ("batch_first", batch_first, False), ("dropout", dropout, 0),
                                   ("bidirectional", bidirectional, False)) if v != d]
    name = f"{where}({', '.join(opts)})"
    kind = where.split("(")[0]

    def layer_params(params, layer, stack=True):
        per_dir = []
        for sfx in suffixes:
            p = {"w_ih": params[f"weight_ih_l{layer}{sfx}"], "w_hh": params[f"weight_hh_l{layer}{sfx}"]}
            if bias:
                p["b_ih"], p["b_hh"] = params[f"bias_ih_l{layer}{sfx}"], params[f"bias_hh_l{layer}{sfx}"]
            if proj_size:
                p["w_hr"] = params[f"weight_hr_l{layer}{sfx}"]
            per_dir.append(p)
        return jax.tree.map(lambda *a: jnp.stack(a), *per_dir) if stack else per_dir[0]

    def apply(params, input, hx=None, /, *, lengths=None, key=None, train=False):
        check_params(params, expected, name)
        x = jnp.asarray(input)
        if x.ndim not in (2, 3):
            raise ValueError(f"{name}: expected input to be 2-D (L, input_size) unbatched or 3-D "
                             f"{'(N, L, input_size)' if batch_first else '(L, N, input_size)'}, got input of shape "
                             f"{tuple(x.shape)}")
        batched = x.ndim == 3
        if x.shape[-1] != input_size:
            raise ValueError(f"{name}: input.size(-1) must be equal to input_size. Expected {input_size}, got "
                             f"{x.shape[-1]} (input of shape {tuple(x.shape)})")
        x = x[:, None] if not batched else (x.swapaxes(0, 1) if batch_first else x)
        T, B, _ = x.shape
        carry0 = _initial_carry(hx, mode, where, num_layers * D, B, batched, hidden_size, real_hidden, x.dtype)
        mask = rev = None
        if lengths is not None:
            lengths = _check_lengths(lengths, name, T, B, batched)
            t = jnp.arange(T)[:, None]
            valid = t < lengths[None, :]
            mask = valid[..., None]  # (T, B, 1)
            rev = jnp.where(valid, lengths[None, :] - 1 - t, t)  # reverses each sequence within its length
        if train and dropout > 0 and num_layers > 1:
            _need_key(key, f"{kind} (dropout between layers)", dropout)

        def reverse(a):
            if rev is None:
                return jnp.flip(a, 0)
            return jnp.take_along_axis(a, rev[..., None], axis=0)

        out, h_n = x, []
        for layer in range(num_layers):
            carry = tuple(c[layer * D:(layer + 1) * D] for c in carry0)
            if D == 1:  # one direction: no direction axis to stack and vmap over
                p = layer_params(params, layer, stack=False)
                last, out = _scan(mode, p, _project(mode, p, out), tuple(c[0] for c in carry), mask)
                last = tuple(c[None] for c in last)
            else:
                p = layer_params(params, layer)
                xs = jnp.stack([out, reverse(out)])  # (D, T, B, F)
                gx = jax.vmap(lambda p, x: _project(mode, p, x))(p, xs)
                last, ys = jax.vmap(lambda p, g, c: _scan(mode, p, g, c, mask))(p, gx, carry)
                out = jnp.concatenate([ys[0], reverse(ys[1])], axis=-1)
            h_n.append(last)
            if train and dropout > 0 and layer < num_layers - 1:
                key, sub = jax.random.split(key)
                out = _drop(out, sub, dropout, out.shape)
        h_n = tuple(jnp.concatenate([c[i] for c in h_n]) for i in range(len(carry0)))  # (L*D, B, *)
        if not batched:
            out, h_n = out[:, 0], tuple(h[:, 0] for h in h_n)
        elif batch_first:
            out = out.swapaxes(0, 1)
        return (out, h_n) if mode == "LSTM" else (out, h_n[0])

    init = _uniform_init(shapes, hidden_size, dtype)
    return Module(init, apply, name=name, batch_axis=0 if batch_first else 1)


def _initial_carry(hx, mode, where, layers_dirs, B, batched, hidden_size, real_hidden, dtype):
    lead = (layers_dirs, B) if batched else (layers_dirs,)
    want = [lead + (real_hidden,)] + ([lead + (hidden_size,)] if mode == "LSTM" else [])
    if hx is None:
        return tuple(jnp.zeros(s[:1] + (B,) + s[-1:], dtype) for s in want)
    if mode == "LSTM":
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{where}: hx must be a tuple (h_0, c_0) of shapes {want[0]} and {want[1]}, got "
                            f"{describe(hx)}")
        hs = tuple(jnp.asarray(h) for h in hx)
    else:
        hs = (jnp.asarray(hx),)
    for h, s, what in zip(hs, want, ("h_0", "c_0")):
        if h.shape != s:
            size = "hidden_size" if s[-1] == hidden_size else "proj_size"
            raise ValueError(f"{where}: {what} has shape {tuple(h.shape)}, expected {s} (num_layers * num_directions"
                             f"{', batch' if batched else ''}, {size})")
    return tuple(h if batched else h[:, None] for h in hs)


def _check_lengths(lengths, name, T, B, batched):
    if not batched:
        raise ValueError(f"{name}: lengths= needs a batched input (one length per sequence); give the input a "
                         f"batch axis")
    arr = jnp.asarray(lengths)
    if arr.shape != (B,) or not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name}: lengths must be {B} integers (one per sequence of the batch), got {describe(arr)}")
    if not isinstance(arr, jax.core.Tracer):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 1 or hi > T:
            raise ValueError(f"{name}: lengths range over [{lo}, {hi}], expected every length in [1, {T}] (the "
                             f"padded sequence has {T} steps; torch's pack_padded_sequence refuses the same)")
    return arr


def RNN(input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh", bias: bool = True,
        batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, *, dtype=None) -> Module:
    """An Elman RNN, ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu), as torch.nn.RNN.

    ``apply(params, input, hx=None, /, *, lengths=None, key=None, train=False) -> (output, h_n)``:
    input ``(L, N, input_size)`` (``(N, L, input_size)`` with ``batch_first``; ``(L, input_size)``
    unbatched), hx / h_n ``(num_layers * num_directions, N, hidden_size)``, output ``(L, N,
    num_directions * hidden_size)``. ``lengths`` (N,) ints: each sequence's true length, as torch's
    ``pack_padded_sequence(input, lengths, enforce_sorted=False)`` followed by ``pad_packed_sequence(
    ..., total_length=L)``: padded steps output zeros and h_n is taken at each sequence's last step
    (the reverse direction starts there). ``dropout`` between layers in train mode needs ``key``.
    """
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"RNN: Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
    return _rnn_base("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", "RNN", input_size, hidden_size,
                     num_layers, bias, batch_first, dropout, bidirectional, 0, dtype)


def LSTM(input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, batch_first: bool = False,
         dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0, *, dtype=None) -> Module:
    """A long short-term memory RNN, as torch.nn.LSTM (gates i, f, g, o).

    ``apply(params, input, hx=None, /, *, lengths=None, key=None, train=False) -> (output, (h_n, c_n))``;
    hx is ``(h_0, c_0)`` or None (zeros). With ``proj_size > 0`` the hidden state is projected by
    ``weight_hr_l{k}`` to ``proj_size`` (h_0, h_n, output use proj_size; c_0, c_n hidden_size).
    Shapes, ``lengths`` and ``dropout`` as :func:`RNN`.
    """
    return _rnn_base("LSTM", "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                     proj_size, dtype)


def GRU(input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True, batch_first: bool = False,
        dropout: float = 0.0, bidirectional: bool = False, *, dtype=None) -> Module:
    """A gated recurrent unit RNN, as torch.nn.GRU (gates r, z, n; ``b_hn`` inside the reset product).

    ``apply(params, input, hx=None, /, *, lengths=None, key=None, train=False) -> (output, h_n)``,
    shapes, ``lengths`` and ``dropout`` as :func:`RNN`.
    """
    return _rnn_base("GRU", "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0,
                     dtype)


def _cell(mode, where, input_size, hidden_size, bias, dtype, extra="") -> Module:
    input_size = _positive_int(input_size, "input_size", where)
    hidden_size = _positive_int(hidden_size, "hidden_size", where)
    if not isinstance(bias, bool):
        raise TypeError(f"{where}: bias should be of type bool, got: {type(bias).__name__}")
    G = _GATES[mode] * hidden_size
    shapes = [("weight_ih", (G, input_size)), ("weight_hh", (G, hidden_size))]
    if bias:
        shapes += [("bias_ih", (G,)), ("bias_hh", (G,))]
    expected = [n for n, _ in shapes]
    name = f"{where}({input_size}, {hidden_size}{'' if bias else ', bias=False'}{extra})"
    step = _step(mode)
    lstm = mode == "LSTM"

    def apply(params, input, hx=None, /, *, key=None, train=False):
        del key, train
        check_params(params, expected, name)
        x = jnp.asarray(input)
        if x.ndim not in (1, 2) or x.shape[-1] != input_size:
            raise ValueError(f"{name}: expected input of shape (N, {input_size}) or ({input_size},), got "
                             f"{tuple(x.shape)}")
        batched = x.ndim == 2
        x = x if batched else x[None]
        want = (x.shape[0], hidden_size) if batched else (hidden_size,)
        if hx is None:
            carry = tuple(jnp.zeros((x.shape[0], hidden_size), x.dtype) for _ in range(2 if lstm else 1))
        else:
            if lstm and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
                raise TypeError(f"{name}: hx must be a tuple (h, c), each of shape {want}, got {describe(hx)}")
            carry = tuple(jnp.asarray(h) for h in (hx if lstm else (hx,)))
            for h in carry:
                if h.shape != want:
                    raise ValueError(f"{name}: hidden state of shape {tuple(h.shape)}, expected {want} (as the "
                                     f"input's batch)")
            carry = carry if batched else tuple(h[None] for h in carry)
        p = {"w_ih": params["weight_ih"], "w_hh": params["weight_hh"]}
        if bias:
            p["b_ih"], p["b_hh"] = params["bias_ih"], params["bias_hh"]
        carry, _ = step({k: v for k, v in p.items() if k == "w_hh" or (k == "b_hh" and mode == "GRU")},
                        _project(mode, p, x), carry)
        carry = carry if batched else tuple(h[0] for h in carry)
        return carry if lstm else carry[0]

    return Module(_uniform_init(shapes, hidden_size, dtype), apply, name=name)


def RNNCell(input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", *,
            dtype=None) -> Module:
    """One step of :func:`RNN`, as torch.nn.RNNCell: ``apply(params, input, hx=None) -> h'``; input
    ``(N, input_size)`` or ``(input_size,)``, hx ``(N, hidden_size)`` (zeros when None)."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"RNNCell: Unknown nonlinearity: {nonlinearity}. Select from 'tanh' or 'relu'.")
    return _cell("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", "RNNCell", input_size, hidden_size, bias,
                 dtype, "" if nonlinearity == "tanh" else f", nonlinearity={nonlinearity}")


def LSTMCell(input_size: int, hidden_size: int, bias: bool = True, *, dtype=None) -> Module:
    """One step of :func:`LSTM`, as torch.nn.LSTMCell: ``apply(params, input, hx=None) -> (h', c')``;
    hx is ``(h, c)`` or None (zeros)."""
    return _cell("LSTM", "LSTMCell", input_size, hidden_size, bias, dtype)


def GRUCell(input_size: int, hidden_size: int, bias: bool = True, *, dtype=None) -> Module:
    """One step of :func:`GRU`, as torch.nn.GRUCell: ``apply(params, input, hx=None) -> h'``."""
    return _cell("GRU", "GRUCell", input_size, hidden_size, bias, dtype)
