"""One check for every layer: funcnet against torch from the same weights.

``check_layer(ours, theirs, inputs)`` loads ``theirs.state_dict()`` (parameters and
buffers) into ``ours`` with no renaming and asserts, against torch as the oracle:

- the state_dict keys, shapes and dtypes are torch's (integer buffers stay integer);
- the forward output, in the given mode (``train``);
- the gradients of ``sum(output * cotangent)`` with respect to every floating input and
  every parameter (a fixed random cotangent, so every output element matters);
- the state after the forward (torch mutates its buffers in place; funcnet returns them);
- one compile: a second call with new values of the same shapes does not retrace.

Tolerances follow from the computation, not from one run or one CPU. Every floating element
must lie within ``C * eps * size`` of the value torch computes in float64 from the same
(float32-representable) weights, inputs and cotangent, ``eps`` being the dtype's machine
epsilon, for both frameworks in float32 (each against the reference, not only against each
other; in float64 torch is the reference). ``size`` is the size of the terms the element is
computed from, estimated by torch's float64 forward and backward (no layer knowledge):

- the element on ``|inputs|``, ``|weights|`` and ``|cotangent|``: for a sum of products
  (matmul, convolution, a conv weight gradient over batch x positions) exactly
  ``sum_i |a_i b_i|``, so the bound grows with the reduction length and the magnitudes, and a
  small value left after large terms cancel is held to their size;
- for gradients, the RMS of the gradient over ``SIGNS`` cotangents with random signs: the
  size of the terms that cancel inside an op's backward (softmax's ``p * (g - sum p g)``),
  which absolute values do not show;
- the element's own ``|value|``, and the mean of all the above over the tensor (a normwise
  part: a value that is zero in exact arithmetic by symmetry, as attention's
  ``in_proj_bias`` key gradient, is held to its neighbours' size, not to an absolute 1e-6);
- ``terms=``, a floor the caller derives where an op's backward subtracts terms that none of
  these see (a normalization over 2 values).

``C = 32``: rounding a sum of K terms one by one errs by about ``eps * sum |terms|`` (K
roundings of partial sums up to that size, random in sign), a few ops stack up, and blocked
or vectorised sums err less. The largest error measured on the CPU this was written on (log
the ratios with ``FUNCNET_TOL_LOG=path``) is 4.9 ``eps * size`` over the layer tables
(tests/test_nn*.py, tests/test_gpt.py: torch's own, an attention input gradient) and 9.4 over
the functional table (tests/test_nn_functional.py, which uses the same bound through
``assert_function_close``: gelu-tanh's derivative at x = 6 subtracts ``1 - tanh^2`` of a
saturated tanh times ``x (1 + 0.134 x^2) ~ 35``, terms no float64 magnitude sees). 32 leaves
3x for other kernels and libm, while a weight off by 1e-4 relative or a LayerNorm epsilon
off by 10x still fails by 7x (tests/test_torch_oracle.py).
Where both float32 results are equal to the bit, the reference may have taken the other side
of a discontinuity (Threshold at 0.1, which float32 rounds): those elements pass. Layers with
randomness (Dropout) are not checked here.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

import funcnet
from funcnet import nn

C = 32.0
SIGNS = 4
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


def _torch_dtype(dtype: str):
    return {"float32": torch.float32, "float64": torch.float64}[dtype]


def _log_ratio(what, *ratios):
    path = os.environ.get("FUNCNET_TOL_LOG")
    if path:
        with open(path, "a") as f:
            cells = "\t".join(f"{r:.4g}" for r in ratios)
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}\t{what}\t{cells}\n")


def _tree_close(ours, theirs, what, bound):
    """``ours`` equals ``theirs`` (torch, same dtype) within ``bound``: a tree like theirs of
    ``(reference, magnitude, eps)`` per floating array (None for integer ones, compared exactly)."""
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), f"{what}: {ours!r} vs {theirs!r}"
        for i, (a, b, c) in enumerate(zip(ours, theirs, bound)):
            _tree_close(a, b, f"{what}[{i}]", c)
        return
    if theirs is None:
        assert ours is None, f"{what}: torch returned None, funcnet {type(ours).__name__}"
        return
    b = theirs.detach().numpy()
    a = np.asarray(ours)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs torch {b.shape}"
    if not np.issubdtype(b.dtype, np.floating):
        np.testing.assert_array_equal(a, b, err_msg=what)
        return
    ref, mag, eps = bound
    size = np.abs(ref) + mag
    scale = size + size.mean()  # mean: the normwise part, for what cancels inside an op (see the docstring)
    limit = C * eps * scale
    both = [("funcnet", a)] if b.dtype == np.float64 else [("funcnet", a), ("torch", b)]
    for who, x in both:
        err = np.abs(x.astype(np.float64) - ref)
        # equal infinities (masked rows) have err nan; where funcnet and torch agree to the bit in float32 the
        # reference may have taken the other side of a discontinuity (Threshold at 0.1 rounded to float32)
        same = (err <= limit) | (x == ref) | (a == b)
        with np.errstate(divide="ignore", invalid="ignore"):
            held = same & (x != ref) & (a != b)
            _log_ratio(f"{what} {who}", np.nanmax(np.where(held, err / (eps * size), 0), initial=0),
                       np.nanmax(np.where(held, err / (eps * scale), 0), initial=0))
        if not same.all():
            i = np.unravel_index(np.argmax(np.where(same, -1.0, np.nan_to_num(err, nan=np.inf))), x.shape)
            raise AssertionError(
                f"{what}: {who} {x[i]!r} at {i} is {err[i]:.3g} from the float64 reference {ref[i]!r}; the bound "
                f"{C:g} * eps * (|ref| + sum of |terms| {mag[i]:.3g} + their mean {size.mean():.3g}) = {limit[i]:.3g} "
                f"({(~same).sum()} of {x.size} elements outside)")


def _reference(theirs, inputs, torch_kwargs, cot, train, *, absolute):
    """torch's float64 forward and backward of ``sum(out * cot)`` on a copy of ``theirs``
    (``absolute``: on |weights|, |floating inputs| and |cot|): (outputs, state, param grads, input grads)
    as float64 numpy trees."""
    net = theirs.to(torch.float64)  # in place, restored by the caller (a deepcopy of torch's
    net.train(train)  # TransformerDecoderLayer swaps a module activation for relu)
    if absolute:
        with torch.no_grad():
            for t in [*net.parameters(), *net.buffers()]:
                if t.is_floating_point():
                    t.abs_()
    xs = [torch.from_numpy(np.abs(x) if absolute else x).to(torch.float64).requires_grad_()
          if np.issubdtype(x.dtype, np.floating) else torch.from_numpy(x.copy()) for x in inputs]
    kw = {k: (_to_torch(v).to(torch.float64) if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)
              else _to_torch(v)) for k, v in torch_kwargs.items()}
    out = net(*xs, **kw)
    main = out[0] if isinstance(out, tuple) else out
    params = dict(net.named_parameters())
    state = {k: _np(v) for k, v in net.state_dict().items() if k not in params}
    leaves = [*params.values(), *[x for x in xs if x.is_floating_point()]]
    grads = [None] * len(leaves)
    c = torch.from_numpy(np.asarray(np.abs(cot) if absolute else cot)).to(torch.float64)
    if main.requires_grad:
        grads = list(torch.autograd.grad((main * c).sum(), leaves, retain_graph=True, allow_unused=True))
        if not absolute:  # the size of the terms that cancel inside an op: the RMS over random signs of cot
            rng = np.random.default_rng(0)
            spread = [None if g is None else torch.zeros_like(g) for g in grads]
            for _ in range(SIGNS):
                signs = torch.from_numpy(np.asarray(rng.choice([-1.0, 1.0], size=cot.shape)))
                for s, g in zip(spread, torch.autograd.grad((main * c * signs).sum(), leaves, retain_graph=True,
                                                            allow_unused=True)):
                    if s is not None and g is not None:
                        s += g * g / SIGNS
            grads = [None if g is None else (g, s.sqrt()) for g, s in zip(grads, spread)]
    pg, ig = dict(zip(params, grads[:len(params)])), iter(grads[len(params):])
    return _np(out), state, pg, [next(ig) if x.is_floating_point() else None for x in xs]


def assert_function_close(what, ours, theirs_out, theirs, args, diff, cot, dtype):
    """The functional tables' form of check_layer's bound: ``ours`` (a value, or ``(value,
    [gradients of args[i] for i in diff])``) and torch's same-dtype ``theirs_out`` (the same
    shape) against ``theirs(*args)`` in float64, with the magnitudes of the module docstring."""
    eps = EPS[dtype]

    def run(absolute):
        xs = [torch.from_numpy(np.abs(a) if absolute else np.asarray(a)).to(torch.float64).requires_grad_(i in diff)
              if np.asarray(a).dtype.kind == "f" else torch.from_numpy(np.asarray(a)) for i, a in enumerate(args)]
        out = theirs(*xs)
        out = out[0] if isinstance(out, tuple) else out
        c = torch.from_numpy(np.asarray(np.abs(cot) if absolute else cot)).to(torch.float64)
        leaves = [xs[i] for i in diff]
        if not leaves:
            return _np(out), []
        grads = torch.autograd.grad((out * c).sum(), leaves, retain_graph=True, allow_unused=True)
        if absolute:
            return _np(out), [_np(g) for g in grads]
        rng, spread = np.random.default_rng(0), [torch.zeros_like(x) for x in leaves]
        for _ in range(SIGNS):
            signs = torch.from_numpy(np.asarray(rng.choice([-1.0, 1.0], size=cot.shape)))
            for s, g in zip(spread, torch.autograd.grad((out * c * signs).sum(), leaves, retain_graph=True,
                                                        allow_unused=True)):
                if g is not None:
                    s += g * g / SIGNS
        return _np(out), [None if g is None else (g, s.sqrt()) for g, s in zip(grads, spread)]

    (ref, ref_grads), (mag, mag_grads) = run(False), run(True)
    value, grads = ours
    t_value, t_grads = theirs_out
    _tree_close(value, t_value, f"{what}: value", _bounds(ref, mag, eps))
    for i, g, t_g, r, m in zip(diff, grads, t_grads, ref_grads, mag_grads):
        if r is None:  # torch: no path from this argument to the output (a zero gradient)
            r = (torch.zeros_like(t_g, dtype=torch.float64), torch.zeros_like(t_g, dtype=torch.float64))
        _tree_close(g, t_g, f"{what}: gradient of arg {i}", _grad_bounds(r, m, eps, 0.0))


def _output_shape(theirs, inputs, torch_kwargs) -> tuple:
    """The shape of torch's (first) output, from a forward that leaves the module as it was."""
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        out = theirs(*[torch.from_numpy(x.copy()) for x in inputs],
                     **{k: _to_torch(v) for k, v in torch_kwargs.items()})
    theirs.load_state_dict(before)
    return tuple((out[0] if isinstance(out, tuple) else out).shape)


def _np(tree):
    if isinstance(tree, (tuple, list)):
        return type(tree)(_np(t) for t in tree)
    if tree is None or isinstance(tree, np.ndarray):
        return tree
    return tree.detach().numpy() if tree.is_floating_point() else None


def _grad_bounds(ref, mag, eps, terms):
    """``ref``: (gradient, its spread over random cotangent signs) from ``_reference``; ``mag``: the
    gradient on absolute values. The spread joins the magnitude."""
    if ref is None:
        return None
    grad, spread = _np(ref[0]), _np(ref[1])
    mag = 0.0 if mag is None else np.abs(np.nan_to_num(_np(mag), nan=0.0, posinf=0.0))
    return grad, mag + spread + terms, eps


def _bounds(ref, mag, eps):
    """Zip a reference tree and a magnitude tree into the ``bound`` tree ``_tree_close`` takes."""
    if isinstance(ref, (tuple, list)):
        return [_bounds(r, m, eps) for r, m in zip(ref, mag)]
    return None if ref is None else (ref, np.abs(np.nan_to_num(mag, nan=0.0, posinf=0.0)), eps)


def _same_dtype(ours, theirs) -> bool:
    ours, theirs = np.dtype(ours), np.dtype(str(theirs).replace("torch.", ""))
    if ours == theirs:
        return True
    # with 64-bit types off JAX stores an int64 buffer (num_batches_tracked) as int32: same kind
    return not jax.config.jax_enable_x64 and ours.kind == theirs.kind and ours.itemsize == 4 and theirs.itemsize == 8


def check_layer(ours: nn.Module, theirs: torch.nn.Module, inputs, *, train: bool = True, dtype: str = "float32",
                kwargs: dict | None = None, torch_kwargs: dict | None = None, seed: int = 0,
                grads: bool = True, terms: float = 0.0):
    """Assert ``ours`` equals ``theirs`` (see the module docstring). ``inputs``: numpy arrays
    (floating ones are cast to ``dtype``); ``kwargs``/``torch_kwargs``: keyword inputs of the
    two forwards (masks), torch's default to ours. ``terms``: a floor on the size of the terms behind
    each gradient element, for a backward that subtracts terms the magnitudes above cannot see (a
    normalization over 2 values: the input gradient is a tiny difference of ``|cot| / sigma`` terms);
    the caller derives it from its inputs. Returns the funcnet outputs."""
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

    # the float64 reference and the magnitudes, before torch's forward updates its buffers
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    rng = np.random.default_rng(seed + 1)
    t_shape = _output_shape(theirs, inputs, torch_kwargs)
    cot = rng.standard_normal(t_shape).astype(dtype)
    references = []
    for absolute in (False, True):
        references.append(_reference(theirs, inputs, torch_kwargs, cot, train, absolute=absolute))
        theirs.to(_torch_dtype(dtype))
        theirs.load_state_dict(before)
    ref, mag = references
    # torch: forward, backward of sum(out * cotangent)
    t_inputs = [torch.from_numpy(x.copy()).requires_grad_(grads and np.issubdtype(x.dtype, np.floating))
                for x in inputs]
    t_out = theirs(*t_inputs, **{k: _to_torch(v) for k, v in torch_kwargs.items()})
    t_main = t_out[0] if isinstance(t_out, tuple) else t_out
    t_state = {k: v.detach().clone() for k, v in theirs.state_dict().items() if k not in dict(theirs.named_parameters())}
    eps = EPS[dtype]

    def f(params, state, *xs):
        out, new_state = nn.call(ours, params, state, *xs, train=train, **kwargs)
        main = out[0] if isinstance(out, tuple) else out
        return jnp.sum(main * cot), (out, new_state)

    float_idx = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)] if grads else []
    fn = jax.jit(jax.value_and_grad(f, argnums=(0, *[2 + i for i in float_idx]), has_aux=True))
    j_inputs = [jnp.asarray(x) for x in inputs]
    (_, (out, new_state)), j_grads = fn(params, state, *j_inputs)
    _tree_close(out, t_out, "forward output", _bounds(ref[0], mag[0], eps))
    if new_state is not None:
        for k, v in funcnet.state_dict({}, new_state).items():
            _tree_close(v, t_state[k], f"state {k} after forward", _bounds(ref[1][k], mag[1][k], eps))
    if grads and any(p.requires_grad for p in theirs.parameters()) or float_idx:
        (t_main * torch.from_numpy(cot)).sum().backward()
        g_params = funcnet.state_dict(j_grads[0])
        for k, p in theirs.named_parameters():
            if p.grad is None:
                continue
            assert k in g_params, f"no gradient for parameter {k}"
            _tree_close(g_params[k], p.grad, f"gradient of {k}", _grad_bounds(ref[2][k], mag[2][k], eps, terms))
        for n, i in enumerate(float_idx):
            _tree_close(j_grads[1 + n], t_inputs[i].grad, f"gradient of input {i}",
                        _grad_bounds(ref[3][i], mag[3][i], eps, terms))

    # one compile: new values of the same shapes reuse the executable
    fn(params, state, *[x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x for x in j_inputs])
    assert fn._cache_size() == 1, f"{ours.name} compiled {fn._cache_size()} times for one configuration"
    return out


def _to_torch(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return torch.from_numpy(np.asarray(value).copy())
