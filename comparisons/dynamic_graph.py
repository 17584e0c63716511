"""Dynamic graphs: torch rebuilds the graph on every call; JAX traces once per shape and static value.

torch (define-by-run): Python ``if``/``for`` choose what runs, on any value, every
call, and each call records a fresh autograd graph. JAX: ``jax.jit`` traces the
Python function once per input shape/dtype and static argument and replays the
compiled program; Python control flow may depend on static values only, and a
branch on a traced value is ``lax.cond`` or ``jnp.where``.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import torch

from comparisons._core import Options, Result, Side, TOL, close, dtypes, equal, expect, raises, run_sections, source
from funcnet import interop, nn

__all__ = ["TITLE", "run"]

TITLE = "Dynamic graph: model_a/model_b loop, use_dropout flag, if on a traced value, retrace counts"

N_CALLS = 6
N_ROWS = 4000  # rows of the dropout batch: one independent mask per row
MODEL_A = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
MODEL_B = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
FC1, FC2, DROPOUT = nn.Linear(4, 16), nn.Linear(16, 3), nn.Dropout(0.5)


# ---------------------------------------------------------------- PyTorch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x, use_dropout=True):
        x = torch.relu(self.fc1(x))
        if use_dropout:  # Python control flow, decided on every call
            x = torch.dropout(x, p=0.5, train=self.training)
        return self.fc2(x)


def torch_alternating(model_a, model_b, x):
    outputs = []
    for i in range(5):
        if i % 2 == 0:
            output = model_a(x)
        else:
            output = model_b(x)
        outputs.append(output)
    print(f"5 iterations, graphs recorded: {len({id(o.grad_fn) for o in outputs})}, compiles: 0")
    return outputs


def torch_dropout_flag(net, xs):
    net.train()
    off = net(xs, use_dropout=False)
    on = net(xs, use_dropout=True)  # a fresh mask for every row
    mask = torch.dropout(torch.ones(100_000), p=0.5, train=True)
    print(f"use_dropout=False row 0: {[round(v, 5) for v in off[0].tolist()]}")
    print(f"use_dropout=True mean of {len(xs)} rows: {[round(v, 5) for v in on.mean(0).tolist()]}")
    print(f"mask: kept {(mask != 0).float().mean():.4f}, kept values scaled to {mask[mask != 0].unique().tolist()}")
    return off, on, mask


def torch_branch(x):
    if x.sum() > 0:  # reads the value: fine in eager torch
        return x * 2
    return -x


def torch_control_flow(inputs):
    outs = [torch_branch(x) for x in inputs]
    print("Python if on x.sum(): " + ", ".join(str(o.tolist()) for o in outs))
    return outs


def torch_graph_counts(n):
    outs, recorded = [], []
    for i in range(n):
        x = torch.full((8,), float(i), requires_grad=True)
        outs.append(torch.tanh(x).sum())  # records a new graph on every call
        recorded.append(len({id(o.grad_fn) for o in outs}))
    print(f"{n} calls: {recorded[-1]} graphs recorded, 0 compiles")
    return recorded, outs


# ---------------------------------------------------------------- JAX


def jax_alternating(params_a, params_b, x):
    traces = []

    @jax.jit
    def model_a(params, x):
        traces.append("model_a")  # a Python side effect runs only while tracing
        return MODEL_A.apply(params, x)

    @jax.jit
    def model_b(params, x):
        traces.append("model_b")
        return MODEL_B.apply(params, x)

    outputs = []
    for i in range(5):
        if i % 2 == 0:  # Python control flow outside jit: free
            output = model_a(params_a, x)
        else:
            output = model_b(params_b, x)
        outputs.append(output)

    @functools.partial(jax.jit, static_argnames="which")
    def model(params, x, which):  # one function, the choice as a static argument
        traces.append(f"model[{which}]")
        return (MODEL_A if which == "a" else MODEL_B).apply(params[which], x)

    both = {"a": params_a, "b": params_b}
    static = [model(both, x, which="a" if i % 2 == 0 else "b") for i in range(5)]
    print(f"5 + 5 iterations, traces: {traces}")
    return outputs, static, traces


def jax_dropout_flag(params, xs, key):
    traces = []

    def forward(params, x, key, use_dropout=True):
        traces.append(f"use_dropout={use_dropout}")
        x = jax.nn.relu(FC1.apply(params["fc1"], x))
        if use_dropout:  # a Python bool, static under jit: one compile per value
            x = DROPOUT.apply({}, x, key=key, train=True)
        return FC2.apply(params["fc2"], x)

    def forward_cond(params, x, key, use_dropout):
        traces.append("cond")
        x = jax.nn.relu(FC1.apply(params["fc1"], x))
        x = jax.lax.cond(use_dropout, lambda x: DROPOUT.apply({}, x, key=key, train=True), lambda x: x, x)
        return FC2.apply(params["fc2"], x)

    static, cond = jax.jit(forward, static_argnames="use_dropout"), jax.jit(forward_cond)
    k_on, k_off, k_off2, k_cond_off, k_mask = jax.random.split(key, 5)
    k_on_again = jax.random.clone(k_on)  # the same mask on purpose, for lax.cond
    off, on = static(params, xs, k_off, use_dropout=False), static(params, xs, k_on, use_dropout=True)
    static(params, xs, k_off2, use_dropout=False)  # a value seen before: no new trace
    cond_off, cond_on = cond(params, xs, k_cond_off, False), cond(params, xs, k_on_again, True)
    draw_mask = jax.jit(lambda key: DROPOUT.apply({}, jnp.ones(100_000), key=key, train=True))
    mask = np.asarray(draw_mask(k_mask))  # to the host for printing
    print(f"use_dropout=False row 0: {np.round(np.asarray(off)[0], 5).tolist()}")
    print(f"use_dropout=True mean of {len(xs)} rows: {np.round(np.asarray(on).mean(0), 5).tolist()}")
    print(f"mask: kept {(mask != 0).mean():.4f}, kept values scaled to {np.unique(mask[mask != 0]).tolist()}")
    print(f"3 calls with a static flag, 2 through lax.cond: traces {traces}")
    return off, on, cond_off, cond_on, mask, traces


def branch(x):  # the torch code, unchanged
    if x.sum() > 0:
        return x * 2
    return -x


@functools.partial(jax.jit, static_argnames="positive")
def branch_static(x, positive):  # decided on the host; one compile per value
    return x * 2 if positive else -x


@jax.jit
def branch_cond(x):
    return jax.lax.cond(x.sum() > 0, lambda x: x * 2, lambda x: -x, x)


@jax.jit
def branch_where(x):  # computes both sides, selects one
    return jnp.where(x.sum() > 0, x * 2, -x)


def jax_control_flow(inputs):
    try:
        jax.jit(branch)(inputs[0])
    except jax.errors.TracerBoolConversionError as e:
        print(f"jit(branch): {type(e).__name__}")
    outs = []
    for x in inputs:
        outs.append([branch(x), branch_static(x, positive=bool(x.sum() > 0)), branch_cond(x), branch_where(x)])
        print("eager / static_argnames / lax.cond / jnp.where: " + ", ".join(str(o.tolist()) for o in outs[-1]))
    return outs


def jax_trace_counts(n):
    traces = []

    @jax.jit
    def step(x):
        traces.append(x.shape)  # runs once per trace
        return jnp.tanh(x).sum()

    @functools.partial(jax.jit, static_argnames="power")
    def powered(x, power):
        traces.append(power)
        return (x ** power).sum()

    same, new_shape, new_static, outs = [], [], [], []
    for i in range(n):
        outs.append(step(np.full(8, i, np.float32)))  # same shape and dtype: traced once
        same.append(len(traces))
    for i in range(n):
        step(np.ones(16 + i, np.float32))  # a new shape: a new trace and compile
        new_shape.append(len(traces) - same[-1])
    for i in range(n):
        powered(np.ones(8, np.float32), power=i % 3)  # a new static value: a new trace
        new_static.append(len(traces) - same[-1] - new_shape[-1])
    print(f"{n} calls each: same shape {same[-1]} trace, new shapes {new_shape[-1]}, "
          f"static power in (0, 1, 2) {new_static[-1]}")
    return same, new_shape, new_static, outs


# ---------------------------------------------------------------- checks


class _CompileLog(logging.Handler):
    """Counts XLA compilations of jitted functions by name (from jax.log_compiles)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Compiling jit("):
            self.names.append(msg[len("Compiling jit("):].split(")")[0])


def _mean_within(name, on, off, k=5.0):
    """mean over rows of ``on`` is within k standard errors of ``off`` (inverted dropout is unbiased)."""
    on, off = np.asarray(on, np.float64), np.asarray(off, np.float64)[0]
    se = on.std(0, ddof=1) / np.sqrt(len(on))
    z = np.abs(on.mean(0) - off) / se
    return expect(name, bool(np.all(z < k)), "|mean - no-dropout output| / standard error = "
                  + ", ".join(f"{v:.2f}" for v in z) + f" (< {k:g})")


def run(opts: Options = Options()) -> Result:
    tdt, _ = dtypes(opts)  # the JAX side takes its dtype from the arrays it is given
    tol, p = opts.tol, opts.perturb
    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(tdt)
    model_b = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                  torch.nn.Linear(8, 3)).to(tdt)
    net = Net().to(tdt)
    x = torch.randn(2, 4, dtype=tdt)
    xs = x[:1].repeat(N_ROWS, 1)
    pa, pb, pn = interop.from_torch(model_a), interop.from_torch(model_b), interop.from_torch(net)
    pa["2"]["bias"] = pa["2"]["bias"].at[0].add(p)  # an output bias: no ReLU can hide the change
    pn["fc2"]["bias"] = pn["fc2"]["bias"].at[0].add(p)
    jx, jxs = jnp.asarray(x.numpy()), jnp.asarray(xs.numpy())
    x_pos = torch.tensor([1.0, -0.5, 2.0], dtype=tdt)
    x_neg = -x_pos

    torch_fns = (torch_alternating, torch_dropout_flag, torch_control_flow, torch_graph_counts)
    jax_fns = (jax_alternating, jax_dropout_flag, jax_control_flow, jax_trace_counts)
    (t_alt, t_drop, (t_pos, t_neg), t_counts), t_text, t_sec = run_sections(
        torch_fns, [(model_a, model_b, x), (net, xs), ([x_pos, x_neg],), (N_CALLS,)])
    log, logger = _CompileLog(), logging.getLogger("jax")
    logger.addHandler(log)
    try:
        # float32 matmuls in full precision, as torch's CPU kernels (GPUs would otherwise use TF32)
        with jax.log_compiles(True), jax.default_matmul_precision("highest"):
            (j_alt, j_drop, (j_pos, j_neg), j_counts), j_text, j_sec = run_sections(
                jax_fns, [(pa, pb, jx), (pn, jxs, jax.random.key(0)),
                          ([jnp.asarray(x_pos.numpy()), jnp.asarray(x_neg.numpy())],), (N_CALLS,)],
                steady=False)  # a repeat call would add compilations to the counts checked below
    finally:
        logger.removeHandler(log)

    j_outputs, j_static, j_traces = j_alt
    t_off, t_on, t_mask = t_drop
    j_off, j_on, j_cond_off, j_cond_on, j_mask, j_drop_traces = j_drop
    same, new_shape, new_static, j_steps = j_counts
    keep = [float((t_mask != 0).double().mean()), float(np.mean(j_mask != 0))]
    fixes = "fixes (eager, static_argnames, lax.cond, jnp.where) vs torch's Python if"
    checks = [
        close("model_a/model_b loop: 5 outputs, two jitted functions vs torch", jnp.stack(j_outputs),
              torch.stack(t_alt), **tol, why="same weights; matmul sums may be ordered differently"),
        close("model_a/model_b loop: one function with a static argument vs torch", jnp.stack(j_static),
              torch.stack(t_alt), **tol),
        equal("JAX traces for 5 + 5 iterations", j_traces, ["model_a", "model_b", "model[a]", "model[b]"],
              why="one per model; Python chooses outside the compiled code"),
        expect("torch records a new graph on every iteration", len({id(o.grad_fn) for o in t_alt}) == 5,
               "5 distinct grad_fn roots"),
        close("use_dropout=False: torch vs JAX static flag", j_off, t_off, **tol),
        close("use_dropout=False: lax.cond vs static flag", j_cond_off, j_off, **tol),
        equal("use_dropout=True: lax.cond vs static flag with the same key", j_cond_on, j_on,
              why="the same mask, the same arithmetic"),
        equal("traces: static flag compiles once per value, lax.cond once",
              j_drop_traces, ["use_dropout=False", "use_dropout=True", "cond"]),
        expect("dropout masks keep half the units (both RNGs)", all(abs(k - 0.5) < 0.0079 for k in keep),
               f"kept fraction torch {keep[0]:.4f}, JAX {keep[1]:.4f}; bound 0.0079 is 5 standard errors "
               f"of a fraction over 100000 draws"),
        equal("dropout scales kept units by 1 / (1 - p) = 2", (sorted(set(t_mask[t_mask != 0].tolist())),
              np.unique(j_mask[j_mask != 0]).tolist()), ([2.0], [2.0])),
        _mean_within("use_dropout=True: torch's mean over masks is the no-dropout output", t_on.detach(),
                     t_off.detach()),
        _mean_within("use_dropout=True: JAX's mean over masks is the no-dropout output", j_on, j_off),
        raises("jit of `if x.sum() > 0` on a traced value", lambda: jax.jit(branch)(jnp.asarray(x_pos.numpy())),
               jax.errors.TracerBoolConversionError, "boolean conversion"),
        equal(f"{fixes}, sum > 0", [o.tolist() for o in j_pos], [t_pos.tolist()] * 4, why="x * 2 and -x are exact"),
        equal(f"{fixes}, sum < 0", [o.tolist() for o in j_neg], [t_neg.tolist()] * 4),
        equal(f"{N_CALLS} calls with one shape: traces after each call", same, [1] * N_CALLS),
        equal(f"{N_CALLS} calls with a new shape each: traces", new_shape, list(range(1, N_CALLS + 1))),
        equal(f"{N_CALLS} calls cycling a static value through 3: traces", new_static,
              [min(i + 1, 3) for i in range(N_CALLS)]),
        equal("XLA compiles (jax.log_compiles) match the traces counted",
              [log.names.count(n) for n in ("model_a", "model_b", "model", "forward", "forward_cond", "step",
                                            "powered")], [1, 1, 2, 2, 1, 1 + N_CALLS, 3]),
        equal(f"torch: {N_CALLS} calls record a graph each", t_counts[0], list(range(1, N_CALLS + 1)),
              why="distinct grad_fn roots after each call"),
        close("the traced step computes torch's numbers", jnp.stack(j_steps), torch.stack(t_counts[1]).detach(),
              **TOL["float32"], why="this section runs in float32 on both sides; tanh may differ by an ulp"),
    ]
    return Result(
        name="dynamic_graph", title=TITLE,
        torch=Side(source(Net, torch_alternating, torch_dropout_flag, torch_branch, torch_control_flow,
                          torch_graph_counts), t_text, t_sec),
        jax=Side(source(jax_alternating, jax_dropout_flag, branch, branch_static, branch_cond, branch_where,
                        jax_control_flow, jax_trace_counts), j_text, j_sec),
        checks=checks,
        notes="Weights are torch's (seed 0), moved with funcnet.interop.from_torch; perturb is added to the JAX "
              "copies of model_a's 2.bias[0] and Net's fc2.bias[0]. The RNGs differ, so dropout is "
              "compared by statistics: kept fraction, scale, and the mean over masks (inverted dropout is "
              "unbiased, so it equals the no-dropout output). The jitted functions are defined inside each run, "
              "so every run counts its own traces; the JAX time is mostly their compiles.",
        series={"graphs recorded (torch) / traces (JAX) after each call": {
            "torch graphs recorded, same shape": t_counts[0],
            "JAX traces, same shape": same,
            "JAX traces, new shape each call": new_shape,
            "JAX traces, static value in (0, 1, 2)": new_static,
        }},
    )
