"""One check for every layer: funcnet against torch from the same weights.

``check_layer(ours, theirs, inputs)`` loads ``theirs.state_dict()`` (parameters and
buffers) into ``ours`` with no renaming and asserts, against torch as the oracle:

- the state_dict keys, shapes and dtypes are torch's (integer buffers stay integer);
- the forward output, in the given mode (``train``);
- the gradients of ``sum(output * cotangent)`` with respect to every floating input and
  every parameter (a fixed random cotangent, so every output element matters);
- the state after the forward (torch mutates its buffers in place; funcnet returns them);
- one compile: a second call with new values of the same shapes does not retrace.

Tolerances: ``rtol``/``atol`` default to 1e-5/1e-6 in float32 (one op's rounding differs
between two BLAS/oneDNN and XLA kernels by ~1e-7 relative, a few ops stack up) and
1e-10/1e-12 in float64. Layers with randomness (Dropout) are not checked here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

import funcnet
from funcnet import nn

TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def _torch_dtype(dtype: str):
    return {"float32": torch.float32, "float64": torch.float64}[dtype]


def _tree_close(ours, theirs, what, tol):
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), f"{what}: {ours!r} vs {theirs!r}"
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _tree_close(a, b, f"{what}[{i}]", tol)
        return
    if theirs is None:
        assert ours is None, f"{what}: torch returned None, funcnet {type(ours).__name__}"
        return
    b = theirs.detach().numpy()
    a = np.asarray(ours)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs torch {b.shape}"
    if np.issubdtype(b.dtype, np.floating):
        np.testing.assert_allclose(a, b, err_msg=what, **tol)
    else:
        np.testing.assert_array_equal(a, b, err_msg=what)


def _same_dtype(ours, theirs) -> bool:
    ours, theirs = np.dtype(ours), np.dtype(str(theirs).replace("torch.", ""))
    if ours == theirs:
        return True
    # with 64-bit types off JAX stores an int64 buffer (num_batches_tracked) as int32: same kind
    return not jax.config.jax_enable_x64 and ours.kind == theirs.kind and ours.itemsize == 4 and theirs.itemsize == 8


def check_layer(ours: nn.Module, theirs: torch.nn.Module, inputs, *, train: bool = True, dtype: str = "float32",
                kwargs: dict | None = None, torch_kwargs: dict | None = None, seed: int = 0,
                rtol: float | None = None, atol: float | None = None, grads: bool = True):
    """Assert ``ours`` equals ``theirs`` (see the module docstring). ``inputs``: numpy arrays
    (floating ones are cast to ``dtype``); ``kwargs``/``torch_kwargs``: keyword inputs of the
    two forwards (masks), torch's default to ours. Returns the funcnet outputs."""
    tol = dict(TOL[dtype])
    if rtol is not None:
        tol["rtol"] = rtol
    if atol is not None:
        tol["atol"] = atol
    kwargs = kwargs or {}
    torch_kwargs = kwargs if torch_kwargs is None else torch_kwargs
    theirs = theirs.to(_torch_dtype(dtype))
    theirs.train(train)
    theirs.zero_grad(set_to_none=True)  # a module checked twice must not accumulate gradients
    inputs = [np.asarray(x, dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x)
              for x in inputs]

    # state_dict: keys (in order), shapes, dtypes
    key = jax.random.key(seed)
    template_state = nn.initial_state(ours) if ours.has_state else None
    sd_before = {k: v.clone() for k, v in theirs.state_dict().items()}
    loaded = funcnet.load_state_dict(ours.init(key), sd_before, state=template_state)
    params, state = loaded if ours.has_state else (loaded, None)
    sd = funcnet.state_dict(params, state, model=ours)
    assert list(sd) == list(sd_before), f"state_dict keys {list(sd)} vs torch {list(sd_before)}"
    for k, v in sd.items():
        assert tuple(v.shape) == tuple(sd_before[k].shape), f"{k}: shape {v.shape} vs torch {sd_before[k].shape}"
        assert _same_dtype(v.dtype, sd_before[k].dtype), f"{k}: dtype {v.dtype} vs torch {sd_before[k].dtype}"

    # torch: forward, backward of sum(out * cotangent)
    t_inputs = [torch.from_numpy(x.copy()).requires_grad_(grads and np.issubdtype(x.dtype, np.floating))
                for x in inputs]
    t_out = theirs(*t_inputs, **{k: _to_torch(v) for k, v in torch_kwargs.items()})
    t_main = t_out[0] if isinstance(t_out, tuple) else t_out
    rng = np.random.default_rng(seed + 1)
    cot = rng.standard_normal(tuple(t_main.shape)).astype(dtype)
    t_state = {k: v.detach().clone() for k, v in theirs.state_dict().items() if k not in dict(theirs.named_parameters())}

    def f(params, state, *xs):
        out, new_state = nn.call(ours, params, state, *xs, train=train, **kwargs)
        main = out[0] if isinstance(out, tuple) else out
        return jnp.sum(main * cot), (out, new_state)

    float_idx = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)] if grads else []
    fn = jax.jit(jax.value_and_grad(f, argnums=(0, *[2 + i for i in float_idx]), has_aux=True))
    j_inputs = [jnp.asarray(x) for x in inputs]
    (_, (out, new_state)), j_grads = fn(params, state, *j_inputs)
    _tree_close(out, t_out, "forward output", tol)
    if new_state is not None:
        for k, v in funcnet.state_dict({}, new_state).items():
            _tree_close(v, t_state[k], f"state {k} after forward", tol)
    if grads and any(p.requires_grad for p in theirs.parameters()) or float_idx:
        (t_main * torch.from_numpy(cot)).sum().backward()
        g_params = funcnet.state_dict(j_grads[0])
        for k, p in theirs.named_parameters():
            if p.grad is None:
                continue
            assert k in g_params, f"no gradient for parameter {k}"
            _tree_close(g_params[k], p.grad, f"gradient of {k}", tol)
        for n, i in enumerate(float_idx):
            _tree_close(j_grads[1 + n], t_inputs[i].grad, f"gradient of input {i}", tol)

    # one compile: new values of the same shapes reuse the executable
    fn(params, state, *[x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x for x in j_inputs])
    assert fn._cache_size() == 1, f"{ours.name} compiled {fn._cache_size()} times for one configuration"
    return out


def _to_torch(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return torch.from_numpy(np.asarray(value).copy())
