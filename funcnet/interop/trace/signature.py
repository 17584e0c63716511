"""A converted model is specialised per input signature, as ``jax.jit`` is.

A recording is a program for the shapes it was traced at: a loop over ``range(x.shape[1])``
is unrolled, a table sliced to the traced length is a constant. So no recording is ever run
on inputs of another signature. The signature of a call is, per argument of the torch
forward, the shape and (canonical JAX) dtype of each array in it and the value of everything
else (flags, ``None``, Python numbers). ``Specialised`` keeps one converted model per
signature: the first is the traced one; a call with a new signature records the torch module
again on inputs of that signature (the example inputs resized, or the call's own values when
they are concrete) and keeps the result. Shapes come from the abstract values, so under
``jax.jit``, ``grad`` or ``vmap`` the new recording is made while JAX traces, once per
signature. Every recording has the same params and state trees (the torch module's names);
one that does not is refused.

``shape_guard`` is the other half of the rule, for a model with no torch module at hand
(a ``to_source`` port): it refuses a signature other than the traced one in one line.
``size_check`` is the same rule inside a port's code: where the torch code compared sizes
(``if window >= x.shape[1]``), the port keeps the branch taken and checks that its
condition still holds on every call.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from funcnet.nn.module import Module


def _dtype_name(dtype) -> str:
    """The canonical JAX dtype name of a torch, numpy or JAX dtype (int64 is int32 without x64)."""
    name = str(dtype).replace("torch.", "")
    try:
        return str(jax.dtypes.canonicalize_dtype(np.dtype(name) if name != "bfloat16" else jax.numpy.bfloat16))
    except TypeError:
        return name


def leaf_signature(value) -> Any:
    """``("array", shape, dtype)`` for an array (torch, numpy, JAX or a tracer); the value itself
    (or its repr, when unhashable) for anything else."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (type, np.dtype)):
        return ("array", tuple(int(s) for s in value.shape), _dtype_name(value.dtype))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *(leaf_signature(v) for v in value))
    if isinstance(value, Mapping):
        return ("dict", *((k, leaf_signature(v)) for k, v in value.items()))
    try:
        hash(value)
        return (type(value).__name__, value)
    except TypeError:
        return (type(value).__name__, repr(value))


def describe(signature: tuple) -> str:
    """``x: float32[2,5], causal: True``: a signature as one readable line."""
    def one(s):
        if isinstance(s, tuple) and s and s[0] == "array":
            return f"{s[2]}[{','.join('*' if d is None else str(d) for d in s[1])}]"
        if isinstance(s, tuple) and s and s[0] in ("tuple", "list"):
            inner = ", ".join(one(v) for v in s[1:])
            return f"({inner})" if s[0] == "tuple" else f"[{inner}]"
        if isinstance(s, tuple) and s and s[0] == "dict":
            return "{" + ", ".join(f"{k}: {one(v)}" for k, v in s[1:]) + "}"
        return repr(s[1]) if isinstance(s, tuple) and len(s) == 2 else repr(s)

    return ", ".join(f"{name}: {one(s)}" for name, s in signature)


def bind(forward_signature: inspect.Signature, args: tuple, kwargs: dict):
    """``inspect.BoundArguments`` of a call (None when it does not bind: the recording says why)."""
    try:
        return forward_signature.bind(*args, **kwargs)
    except TypeError:
        return None


def call_signature(bound) -> tuple:
    """The signature of a bound call: ``((argument, leaf_signature), ...)`` in the forward's order."""
    return tuple((name, leaf_signature(value)) for name, value in bound.arguments.items())


class Specialised(Module):
    """A converted model: one recording of the torch module per input signature (``jax.jit``'s
    rule). ``signatures`` lists the recorded ones (``len(model.signatures)`` counts them);
    ``repr`` shows them under the module tree."""

    __slots__ = ()

    @property
    def signatures(self) -> list[str]:
        """The input signatures recorded so far, the traced one first, as readable lines."""
        return [describe(s) for s in self.apply.recordings]

    def __repr__(self) -> str:
        lines = "\n".join(f"#   {s}" for s in self.signatures)
        n = len(self.signatures)
        return (f"{Module.__repr__(self)}\n# recorded for {n} input signature{'s' if n != 1 else ''} "
                f"(a new one is recorded when met, as jax.jit compiles):\n{lines}")


def specialise(module, model: Module, example_args: tuple, example_kwargs: dict, rebuild) -> Specialised:
    """``model`` (recorded on the example inputs) as a ``Specialised`` model that records
    ``module`` again, with ``rebuild(args, kwargs) -> Module``, for each new input signature."""
    forward_signature = inspect.signature(module.forward)
    example = bind(forward_signature, example_args, example_kwargs)
    recordings: dict = {call_signature(example): model}
    params_shape = _tree_shapes(model)

    def pick(inputs, kwargs) -> Module:
        bound = bind(forward_signature, inputs, kwargs)
        if bound is None:
            return model  # its own apply says how the call does not fit the forward
        signature = call_signature(bound)
        found = recordings.get(signature)
        if found is not None:
            return found
        args, kw = _torch_inputs(bound, example)
        new = rebuild(args, kw)
        if _tree_shapes(new) != params_shape:
            from funcnet.interop.trace.registry import ConversionError

            raise ConversionError(f"convert: {type(module).__name__} recorded at the input signature "
                                  f"({describe(signature)}) has other parameters or buffers than at the traced one "
                                  f"({describe(next(iter(recordings)))}); a converted model keeps one params tree, "
                                  f"so convert it with example inputs of that signature")
        recordings[signature] = new
        return new

    def apply(params, *inputs, **kwargs):
        options = {k: kwargs.pop(k) for k in ("state", "key", "train") if k in kwargs}
        return pick(inputs, kwargs).apply(params, *inputs, **options, **kwargs)

    apply.recordings = recordings
    return Specialised(model.init, apply, model.init_state, model.children, model.name, model.batch_axis)


def _tree_shapes(model: Module):
    init = jax.eval_shape(model.init, jax.random.key(0))
    state = None if model.init_state is None else jax.eval_shape(model.init_state)
    return jax.tree.structure((init, state)), [(a.shape, a.dtype) for a in jax.tree.leaves((init, state))]


def _torch_inputs(bound, example) -> tuple[tuple, dict]:
    """The call's arguments as torch values for a new recording: a concrete array as itself, a
    traced one as the example's value at that place resized to its shape (ids stay ids, a mask of
    ones stays ones), else zeros; in the example's torch dtype where it has the same JAX dtype."""
    examples = dict(example.arguments) if example is not None else {}

    def convert(value, like):
        import torch

        if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (type, np.dtype)):
            shape = tuple(int(s) for s in value.shape)
            same = isinstance(like, torch.Tensor) and _dtype_name(like.dtype) == _dtype_name(value.dtype)
            if isinstance(value, torch.Tensor):
                return value
            if not isinstance(value, jax.core.Tracer):
                tensor = _tensor(np.asarray(value))
                return tensor.to(like.dtype) if same else tensor
            if same:
                return _tensor(np.resize(like.detach().cpu().float().numpy() if like.dtype == torch.bfloat16
                                         else like.detach().cpu().numpy(), shape)).to(like.dtype)
            dtype = getattr(torch, _dtype_name(value.dtype))
            return torch.zeros(shape, dtype=dtype)
        if isinstance(value, (tuple, list)):
            likes = like if isinstance(like, (tuple, list)) and len(like) == len(value) else [None] * len(value)
            return type(value)(convert(v, lk) for v, lk in zip(value, likes))
        if isinstance(value, Mapping):
            likes = like if isinstance(like, Mapping) else {}
            return {k: convert(v, likes.get(k)) for k, v in value.items()}
        return value

    for name, value in list(bound.arguments.items()):
        bound.arguments[name] = convert(value, examples.get(name))
    return tuple(bound.args), dict(bound.kwargs)


def _tensor(array: np.ndarray):
    import torch

    if array.dtype == jax.numpy.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.array(array))  # a writable copy


def named_arguments(names: tuple, args: tuple, kwargs: dict) -> tuple:
    """``((name, value), ...)``: positional arguments named by ``names`` (the forward's), then the
    keyword ones, in ``names``' order and the rest sorted (a call's arguments however passed)."""
    given = dict(zip(names, args))
    extra = [(f"*{i}", a) for i, a in enumerate(args[len(names):])]
    given.update(kwargs)
    order = {n: i for i, n in enumerate(names)}
    return tuple(sorted(given.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))) + tuple(extra)


def shape_guard(signature: str, names: tuple = ()):
    """A decorator for the root function of a ``to_source`` port written at fixed shapes: the
    model it builds refuses, in one line and before computing anything, a call whose input
    signature is not ``signature`` (``describe``'s text; ``*`` for a size the port reads from its
    input, shown shape-generic when it was written). ``names``: the forward's positional
    argument names.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from funcnet import nn
        >>> from funcnet.interop import shape_guard
        >>> @shape_guard("x: float32[*,5]", names=("x",))
        ... def Net():
        ...     return nn.Linear(5, 2)
        >>> model = Net()
        >>> model.apply(model.init(jax.random.key(0)), jnp.ones((3, 5))).shape
        (3, 2)
        >>> model.apply(model.init(jax.random.key(0)), jnp.ones((3, 6)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Net: this port was written at input signature (x: float32[*,5]) ...
    """
    pattern = re.compile(re.escape(signature).replace(r"\*", r"\d+"))

    def decorate(build):
        def guarded(*args, **kwargs):
            model = build(*args, **kwargs)
            name = build.__name__

            def apply(params, *inputs, **kw):
                options = {k: kw.pop(k) for k in ("state", "key", "train") if k in kw}
                got = describe(tuple((n, leaf_signature(v)) for n, v in named_arguments(names, inputs, kw)))
                if not pattern.fullmatch(got):
                    raise ValueError(f"{name}: this port was written at input signature ({signature}) and its code "
                                     f"holds there alone (a size was read as a constant), called with ({got}); write "
                                     f"it again from the torch module at this signature (interop.to_source(module, "
                                     f"x) or funcnet port), or use interop.convert(module, x), which records each new "
                                     f"signature")
                return model.apply(params, *inputs, **options, **kw)

            return model._replace(apply=apply)

        guarded.__name__ = guarded.__qualname__ = build.__name__
        guarded.__doc__ = build.__doc__
        return guarded

    return decorate


def size_check(holds: bool, condition: str, where: str) -> None:
    """The line a ``to_source`` port writes where the torch code compared sizes and branched:
    the port holds where ``condition`` (its text, ``"x.shape[1] <= 4"``) holds, the branch
    the torch code took at ``where`` (``file.py:line``) when the port was written; a call where
    it does not is refused in one line. Sizes are static under ``jax.jit``, so ``holds`` is a
    Python bool there too.

    Examples:
        >>> from funcnet.interop import size_check
        >>> size_check(3 <= 4, "x.shape[1] <= 4", "model.py:12")
        >>> size_check(5 <= 4, "x.shape[1] <= 4", "model.py:12")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: this port was written where x.shape[1] <= 4, the branch the torch code at model.py:12 took ...
    """
    if not holds:
        raise ValueError(f"this port was written where {condition}, the branch the torch code at {where} took when "
                         f"it was written; at this call it does not hold: write it again from the torch module at "
                         f"these shapes (interop.to_source(module, x) or funcnet port), or use "
                         f"interop.convert(module, x), which records each new input signature")
