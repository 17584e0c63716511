"""nn.Module three ways: torch's object, funcnet's ``Module(init, apply)``, flax nnx.

The articles' ``SimpleModel`` (Linear 10->5 + ReLU) and ``MLP`` 784-128-10 (with the
Dropout(0.5) between its layers from the articles' dynamic-graph example) built as a
torch ``nn.Module``, as a funcnet Module (a pair of pure functions; the parameters are a
dict the caller holds) and as a flax ``nnx.Module`` (a mutable object on top of JAX).
Each of the module's jobs is shown in all three: parameter registration (names,
shapes, counts), forward with the same weights, train/eval with Dropout,
``.to(device)`` vs ``jax.device_put``, and ``state_dict`` save/load including the
strict-load error on a wrong architecture.
"""

from __future__ import annotations

import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from flax import nnx
from torch import nn as tnn

import funcnet
from funcnet import nn
from funcnet.interop import from_torch, to_torch
from comparisons._core import Options, Result, Side, close, equal, expect, raises, require_x64, source, timed

__all__ = ["TITLE", "run"]

TITLE = "nn.Module: parameter registration, forward, train/eval, .to(device), state_dict"

P_DROP = 0.5
N_DROP = 20_000  # elements pushed through a lone Dropout to measure its drop rate


# ----------------------------------------------------------------------------- torch
class SimpleModel(tnn.Module):
    def __init__(self):
        super().__init__()
        self.linear = tnn.Linear(10, 5)
        self.activation = tnn.ReLU()

    def forward(self, x):
        return self.activation(self.linear(x))


class MLP(tnn.Module):
    def __init__(self, hidden=128, p=P_DROP):
        super().__init__()
        self.fc1 = tnn.Linear(784, hidden)
        self.dropout = tnn.Dropout(p)
        self.fc2 = tnn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


def torch_modules(x_small, x):
    simple, mlp = SimpleModel().to(x.dtype), MLP().to(x.dtype)
    out = {"simple": simple, "mlp": mlp}
    for name, model in (("simple", simple), ("mlp", mlp)):
        out[name + "_names"] = {n: tuple(p.shape) for n, p in model.named_parameters()}
        out[name + "_count"] = sum(p.numel() for p in model.parameters())
    out["simple_out"] = simple(x_small)
    mlp.eval()
    out["eval"] = mlp(x)
    mlp.train()
    out["train_1"], out["train_2"] = mlp(x), mlp(x)  # a fresh mask per call
    out["dropped"] = tnn.Dropout(P_DROP)(torch.ones(N_DROP, dtype=x.dtype))
    out["to_is_self"] = mlp.to(torch.device("cpu")) is mlp  # moves in place
    out["devices"] = {str(p.device) for p in mlp.parameters()}
    buffer = io.BytesIO()
    torch.save(mlp.state_dict(), buffer)
    out["saved"] = buffer.getvalue()
    return out


# ------------------------------------------------------------------------------ funcnet
def simple_model(dtype=jnp.float32):
    linear = nn.Linear(10, 5, dtype=dtype)

    def init(key):
        return {"linear": linear.init(key)}  # the dict key is the registered name

    def apply(params, x, *, key=None, train=False):
        return jax.nn.relu(linear.apply(params["linear"], x))

    return nn.Module(init, apply)


def mlp_model(hidden=128, p=P_DROP, dtype=jnp.float32):
    fc1, dropout, fc2 = nn.Linear(784, hidden, dtype=dtype), nn.Dropout(p), nn.Linear(hidden, 10, dtype=dtype)

    def init(key):
        k1, k2 = jax.random.split(key)
        return {"fc1": fc1.init(k1), "fc2": fc2.init(k2)}

    def apply(params, x, *, key=None, train=False):
        h = jax.nn.relu(fc1.apply(params["fc1"], x))
        return fc2.apply(params["fc2"], dropout.apply({}, h, key=key, train=train))

    return nn.Module(init, apply)


# ---------------------------------------------------------------------------- flax nnx
class NnxSimpleModel(nnx.Module):
    def __init__(self, rngs, dtype=jnp.float32):
        self.linear = nnx.Linear(10, 5, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.linear(x))


class NnxMLP(nnx.Module):
    def __init__(self, rngs, p=P_DROP, dtype=jnp.float32):
        self.fc1 = nnx.Linear(784, 128, param_dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(p)
        self.fc2 = nnx.Linear(128, 10, param_dtype=dtype, rngs=rngs)

    def __call__(self, x, *, rngs=None):
        return self.fc2(self.dropout(nnx.relu(self.fc1(x)), rngs=rngs))


def nnx_from_torch_layout(make_model, params):
    """An nnx model holding torch-layout ``params``: nnx's kernel is (in, out) = weight.T.
    Built abstractly (nnx.eval_shape), so nnx's own random init is never computed."""
    graphdef, state = nnx.split(nnx.eval_shape(make_model))
    nnx.replace_by_pure_dict(state, {name: {"kernel": layer["weight"].T, "bias": layer["bias"]}
                                     for name, layer in params.items()})
    return nnx.merge(graphdef, state)


def jax_modules(x_small, x, simple_params, mlp_params, saved, dtype, key):
    k_init, k_train1, k_train2, k_drop, k_wrong = jax.random.split(key, 5)
    simple, mlp = simple_model(dtype), mlp_model(dtype=dtype)
    out = {}
    for name, params in (("simple", simple_params), ("mlp", mlp_params)):
        out[name + "_names"] = {n: tuple(a.shape) for n, a in funcnet.state_dict(params).items()}
        out[name + "_count"] = sum(a.size for a in jax.tree.leaves(params))
    out["simple_out"] = simple.apply(simple_params, x_small)
    apply = jax.jit(mlp.apply, static_argnames="train")  # one compile per mode
    out["eval"] = apply(mlp_params, x)  # train=False is eval()
    out["train_1"] = apply(mlp_params, x, key=k_train1, train=True)
    # the mask is a function of the key: the same key (a clone) gives the same output
    out["train_1_again"] = apply(mlp_params, x, key=jax.random.clone(k_train1), train=True)
    out["train_2"] = apply(mlp_params, x, key=k_train2, train=True)
    out["dropped"] = nn.Dropout(P_DROP).apply({}, jnp.ones(N_DROP, dtype), key=k_drop, train=True)

    def make_simple():
        return NnxSimpleModel(nnx.Rngs(0), dtype)

    def make_mlp():
        return NnxMLP(nnx.Rngs(0), dtype=dtype)

    for name, make in (("simple", make_simple), ("mlp", make_mlp)):
        state = nnx.to_flat_state(nnx.state(nnx.eval_shape(make), nnx.Param))
        out["nnx_" + name + "_names"] = {".".join(path): tuple(v.get_value().shape) for path, v in state}
        out["nnx_" + name + "_count"] = sum(math.prod(v.get_value().shape) for _, v in state)
    nnx_simple, nnx_mlp = nnx_from_torch_layout(make_simple, simple_params), nnx_from_torch_layout(make_mlp, mlp_params)
    out["nnx_fc1_kernel"] = nnx_mlp.fc1.kernel[...]
    out["nnx_simple_out"] = nnx_simple(x_small)
    forward = nnx.jit(lambda model, x, rngs=None: model(x, rngs=rngs))  # retraces when the mode flips
    nnx_mlp.eval()
    out["nnx_eval"] = forward(nnx_mlp, x)
    nnx_mlp.train()
    rngs = nnx.Rngs(dropout=1)  # a stateful stream: each call draws the next mask, as torch does
    out["nnx_train_1"], out["nnx_train_2"] = forward(nnx_mlp, x, rngs), forward(nnx_mlp, x, rngs)

    target = jax.devices()[-1]
    placed = jax.device_put(mlp_params, target)  # a new pytree; mlp_params stays where it was
    out["placed_is_new"] = placed is not mlp_params
    out["placed_devices"] = {str(d) for leaf in jax.tree.leaves(placed) for d in leaf.devices()}
    out["original_devices"] = {str(d) for leaf in jax.tree.leaves(mlp_params) for d in leaf.devices()}
    placed_out = apply(placed, jax.device_put(x, target))  # computation follows the data
    out["placed_out"], out["placed_out_devices"] = placed_out, {str(d) for d in placed_out.devices()}
    out["target"] = str(target)

    # a template fixes structure, shapes and dtypes only, so it need not be computed
    template = jax.eval_shape(mlp.init, k_init)
    loaded = funcnet.load_state_dict(template, torch.load(io.BytesIO(saved)), strict=True)
    out["round_trip"] = to_torch(loaded)
    out["wrong_template"] = jax.eval_shape(mlp_model(hidden=64, dtype=dtype).init, k_wrong)
    return out


# ------------------------------------------------------------------------------ checks
def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(torch.int64 if t.element_size() == 8 else torch.int32).numpy()


def _names(names: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in names.items())


def _drop_checks(label, dropped, p, n):
    values = np.asarray(dropped.detach() if hasattr(dropped, "detach") else dropped, dtype=np.float64)
    frac = float(np.mean(values == 0.0))
    sigma = (p * (1 - p) / n) ** 0.5
    kept = values[values != 0.0]
    return frac, [
        expect(f"{label}: train-mode Dropout({p}) zeroes about p of the inputs", abs(frac - p) < 5 * sigma,
               f"{frac:.4f} zeroed of {n}; |frac - p| < 5 sigma = {5 * sigma:.4f} (binomial sampling)"),
        equal(f"{label}: survivors are scaled by 1/(1-p)", np.unique(kept), np.array([1.0 / (1.0 - p)])),
    ]


def _error_text(fn) -> str:
    try:
        fn()
    except Exception as e:  # shown as each framework words it
        return f"{type(e).__name__}: {e}"
    return "(no error)"


def run(opts: Options = Options()) -> Result:
    require_x64(opts)
    tdtype, jdtype, tol = getattr(torch, opts.dtype), jnp.dtype(opts.dtype), opts.tol
    torch.manual_seed(0)
    x_small, x = torch.randn(4, 10, dtype=tdtype), torch.randn(8, 784, dtype=tdtype)
    t, t_sec = timed(torch_modules, x_small, x)

    simple_params, mlp_params = from_torch(t["simple"]), from_torch(t["mlp"])
    # the one JAX-side weight that perturb shifts (nnx gets it too); every output row depends on it
    mlp_params["fc2"]["bias"] = mlp_params["fc2"]["bias"].at[0].add(opts.perturb)
    jx_small, jx = jnp.asarray(x_small.numpy()), jnp.asarray(x.numpy())
    j, j_sec = timed(jax_modules, jx_small, jx, simple_params, mlp_params, t["saved"], jdtype,
                     jax.random.key(0))

    checks = []
    for name, sizes in (("simple", (10, 5)), ("mlp", (784, 128, 10))):
        closed_form = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
        checks += [
            equal(f"{name}: funcnet state_dict names/shapes == torch named_parameters()",
                  j[name + "_names"], t[name + "_names"]),
            equal(f"{name}: nnx names are torch's with weight->kernel, shapes transposed",
                  {k.replace("kernel", "weight"): v[::-1] for k, v in j["nnx_" + name + "_names"].items()},
                  t[name + "_names"], why="nnx.Linear kernel is (in, out), torch weight is (out, in)"),
            equal(f"{name}: parameter count torch == funcnet == nnx == sum(in*out + out)",
                  (t[name + "_count"], j[name + "_count"], j["nnx_" + name + "_count"]),
                  (closed_form,) * 3),
        ]
    mlp_seq = funcnet.state_dict(jax.eval_shape(nn.MLP([784, 128, 10]).init, jax.random.key(1)))
    torch_seq = tnn.Sequential(tnn.Linear(784, 128), tnn.ReLU(), tnn.Linear(128, 10)).state_dict()
    checks.append(equal("nn.Sequential children are named by position in both (0, 2)",
                        {k: tuple(v.shape) for k, v in mlp_seq.items()},
                        {k: tuple(v.shape) for k, v in torch_seq.items()}))
    checks.append(equal("nnx fc1.kernel == torch fc1.weight.T after conversion", j["nnx_fc1_kernel"],
                        t["mlp"].fc1.weight.detach().T.contiguous()))

    why = "same weights; the two frameworks order the matmul sums differently"
    checks += [
        close("SimpleModel forward: funcnet == torch", j["simple_out"], t["simple_out"], **tol, why=why),
        close("SimpleModel forward: nnx == torch", j["nnx_simple_out"], t["simple_out"], **tol, why=why),
        close("MLP eval: funcnet apply(train=False) == torch eval()", j["eval"], t["eval"], **tol, why=why),
        close("MLP eval: nnx eval() == torch eval()", j["nnx_eval"], t["eval"], **tol, why=why),
        expect("train mode differs from eval in all three",
               not torch.equal(t["train_1"], t["eval"]) and not np.array_equal(j["train_1"], j["eval"])
               and not np.array_equal(j["nnx_train_1"], j["nnx_eval"]),
               "torch train(), funcnet train=True, nnx train(): dropout is active"),
        expect("torch and nnx draw a new mask per call (hidden RNG state)",
               not torch.equal(t["train_1"], t["train_2"]) and not np.array_equal(j["nnx_train_1"], j["nnx_train_2"]),
               "two train-mode calls on the same input differ"),
        equal("funcnet: the mask is a function of the key (same key, same output)",
              j["train_1_again"], j["train_1"]),
        expect("funcnet: another key, another mask", not np.array_equal(j["train_2"], j["train_1"]),
               "train=True with a different key differs"),
        raises("funcnet: train=True without a key is refused",
               lambda: mlp_model(dtype=jdtype).apply(mlp_params, jx, train=True), ValueError, "needs a PRNG key"),
    ]
    drop_stats = {}
    for label, dropped in (("torch", t["dropped"]), ("funcnet", j["dropped"])):
        drop_stats[label], more = _drop_checks(label, dropped, P_DROP, N_DROP)
        checks += more

    checks += [
        expect("torch .to(device) moves the module in place", t["to_is_self"] and t["devices"] == {"cpu"},
               f"returns the same object: {t['to_is_self']}; parameter devices {t['devices']}"),
        expect("jax.device_put returns a new pytree on the requested device",
               j["placed_is_new"] and j["placed_devices"] == {j["target"]} == j["placed_out_devices"],
               f"placed on {j['placed_devices']}, output on {j['placed_out_devices']}, "
               f"the original stays on {j['original_devices']}"),
        equal("forward on the placed params == forward before placing", j["placed_out"], j["eval"]),
    ]
    back = MLP().to(tdtype)
    back.load_state_dict(j["round_trip"], strict=True)
    checks.append(expect(
        "state_dict: torch.save -> funcnet.load_state_dict -> to_torch -> torch load is bit-exact",
        all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(back.state_dict().values(),
                                                              t["mlp"].state_dict().values())),
        "every tensor compared as raw bits"))
    sd = t["mlp"].state_dict()
    checks += [
        raises("torch strict load, wrong hidden size", lambda: MLP(hidden=64).load_state_dict(sd), RuntimeError,
               "size mismatch for fc1.weight"),
        raises("funcnet strict load, wrong hidden size", lambda: funcnet.load_state_dict(j["wrong_template"], sd),
               funcnet.StateDictError, "fc1.weight: expected shape (64, 784), got (128, 784)"),
        raises("torch strict load, another model's keys", lambda: MLP().load_state_dict(t["simple"].state_dict()),
               RuntimeError, "Unexpected key(s) in state_dict: \"linear.weight\""),
        raises("funcnet strict load, another model's keys",
               lambda: funcnet.load_state_dict(mlp_params, t["simple"].state_dict()), funcnet.StateDictError,
               "unexpected keys: linear.weight, linear.bias"),
    ]

    torch_err = _error_text(lambda: MLP(hidden=64).load_state_dict(sd)).replace("\t", "  ")
    funcnet_err = _error_text(lambda: funcnet.load_state_dict(j["wrong_template"], sd))
    t_out = "\n".join([
        f"SimpleModel.named_parameters(): {_names(t['simple_names'])} -> {t['simple_count']} params",
        f"MLP.named_parameters(): {_names(t['mlp_names'])} -> {t['mlp_count']:,} params",
        f"eval() logits[0, :3] = {t['eval'][0, :3].detach().numpy()}",
        f"train(): two calls differ: {not torch.equal(t['train_1'], t['train_2'])}; "
        f"Dropout({P_DROP}) zeroes {drop_stats['torch']:.1%}, survivors x{1 / (1 - P_DROP):g}",
        f".to('cpu') returns the same module: {t['to_is_self']}; devices {sorted(t['devices'])}",
        f"torch.save(state_dict): {len(t['saved']):,} bytes",
        f"load into MLP(hidden=64): {torch_err}",
    ])
    j_out = "\n".join([
        f"state_dict(simple params): {_names(j['simple_names'])} -> {j['simple_count']} params",
        f"state_dict(mlp params): {_names(j['mlp_names'])} -> {j['mlp_count']:,} params",
        f"nnx.state(model, nnx.Param): {_names(j['nnx_mlp_names'])} (kernel = weight.T)",
        f"apply(train=False) logits[0, :3] = {np.asarray(j['eval'][0, :3])}",
        f"apply(train=True, key=k): same key same output: {bool(np.array_equal(j['train_1_again'], j['train_1']))}; "
        f"Dropout({P_DROP}) zeroes {drop_stats['funcnet']:.1%}",
        f"nnx: eval() logits[0, :3] = {np.asarray(j['nnx_eval'][0, :3])}; train(): two calls on one nnx.Rngs "
        f"differ: {not np.array_equal(j['nnx_train_1'], j['nnx_train_2'])}",
        f"jax.device_put(params, {j['target']}): leaves on {sorted(j['placed_devices'])}, "
        f"original on {sorted(j['original_devices'])}",
        "torch.save -> load_state_dict(template, sd) -> to_torch -> torch: bit-exact",
        f"load into mlp_model(hidden=64): {funcnet_err}",
    ])
    notes = ("torch registers a parameter by assigning a submodule to an attribute; funcnet registers it by "
             "returning it under a key from init (the key is the name, so state_dict keys match torch's); nnx "
             "registers by attribute again but stores Linear's kernel as (in, out). The mode is object state in "
             "torch and nnx (model.train()/eval(), a hidden RNG draws each mask) and an argument in funcnet "
             "(train=, key=: the mask is a function of the key). .to(device) moves a module in place; "
             "jax.device_put returns a new pytree. Strict loading names every offending key in both.")
    return Result(
        name="modules", title=TITLE,
        torch=Side(source(SimpleModel, MLP, torch_modules), t_out, t_sec),
        jax=Side(source(simple_model, mlp_model, NnxSimpleModel, NnxMLP, nnx_from_torch_layout, jax_modules),
                 j_out, j_sec),
        checks=checks, notes=notes,
    )
