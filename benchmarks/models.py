"""Train-step speed, start-up and memory of real models: funcnet against the JAX peers and torch.

- convnet: ``funcnet.models.ConvNet`` (conv3x3-BN-ReLU-pool twice, a Linear) on 8x8 images,
  SGD with momentum; its torch twin ``TorchConvNet`` from ``examples/port_cnn.py``.
- gpt: ``funcnet.gpt.GPT`` (nanoGPT-shaped) on character blocks of CPython's documentation
  (``funcnet.text``), nanoGPT's AdamW + ``clip_grad_norm_`` + warmup-cosine schedule; its
  torch twin ``TorchGPT`` from ``comparisons/gpt.py`` (skipped, with the reason, if absent).
- lstm: ``funcnet.models.LSTMLM`` (word_language_model's ``RNNModel``, 2-layer LSTM, tied
  weights; its LSTM one ``lax.scan`` over time) on the same character blocks, each from a zero
  state, the example's SGD with ``clip_grad_norm_``; its torch twin ``RNNModel`` from
  ``comparisons/recurrent.py`` (fused ``nn.LSTM``), and a third torch row: the same weights
  run as a Python loop over time of ``nn.LSTMCell``.

Rows: torch eager, torch.compile, (lstm only) torch's Python loop of LSTMCell, the same model by hand in JAX, in flax NNX and in
equinox (``benchmarks/peers.py``: flax's and equinox's own layers, each in its library's
idiom), funcnet's ``make_step`` (a Python loop of the compiled step) and ``run_epoch``
(one ``lax.scan`` per epoch, or the same loop for a step with convolutions on CPU). Every
row starts from the same weights (torch's ``state_dict``) and trains with the same
optimizer. Every JAX loop but run_epoch's scan is the loop of ``run_epoch(scan=False)``:
the shuffle's indices, one gather per batch, one dispatch per step, metrics
(loss and accuracy) stacked at the end.

Correctness: one untimed epoch over the same batch order (run_epoch's own shuffle, handed
to every row), then parameters compared with torch eager within each spec's tolerance
(BatchNorm's running statistics too where they are torch's); a row beyond it prints
MISMATCH and the script exits 1. Each tolerance is set where float32 does not amplify
summation-order differences, and sits above the measured spread of an independent pair
(torch.compile against torch eager) with the figures in the spec's reason: the GPT trains at
nanoGPT's shakespeare_char lr 1e-3, because at 3e-3 one epoch of float32 drifts chaotically
(every row 1.2e-3 to 2.6e-3 from torch eager, torch.compile's included, while float64 on both
sides agrees to 1.2e-12: the same math). Timing: every row shuffles each epoch
its own way, interleaved one epoch each per round; ratios are medians over rounds of
per-round ratios; the load average is printed per round.

Per row, beside the steady ms/step (wall clock, and the CPU time of this process, which a
busy machine's load disturbs far less):
- start-up: the first epoch's time minus the steady epoch time (tracing, lowering and
  compiling, or torch.compile's Dynamo + Inductor), and for the JAX rows the three stages
  of a separate ahead-of-time compile of the step (``jit(step).trace()``, ``.lower()``,
  ``.compile()``);
- memory: for the JAX rows XLA's memory analysis of the compiled step (arguments + outputs
  - donated aliases + temporaries: what is live while it runs); for torch the parameters,
  optimizer state and batch plus the peak of the allocations one step makes, read from
  torch.profiler's allocation events (``profile_memory=True``), torch's CPU allocator.

FLOPs per step: XLA's cost analysis of the compiled funcnet step, against the float32
matmul peak sampled between rounds (best sample kept).

    python benchmarks/models.py [--models convnet gpt lstm] [--repeat 5] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (benchmarks/peers.py)

import funcnet  # noqa: E402
from funcnet import data, epoch, losses, models, profile, train  # noqa: E402

PEERS = ("raw JAX", "flax nnx", "equinox")
LOOP = "torch LSTMCell loop"  # a torch row only the lstm spec has
CONVERTED = "interop.convert make_step"  # the torch model converted by tracing, trained by make_step
IMPLS = ("torch eager", "torch.compile", LOOP, *PEERS, "funcnet make_step", "funcnet run_epoch", CONVERTED)
ROOT = Path(__file__).resolve().parent.parent
SLACK = 0.97  # funcnet's goal against each JAX peer: >= 1.0x, 3% for noise


class Spec:
    """One model: the data, both models from the same weights, both optimizers, the loss."""

    def __init__(self, name, x, y, batch, ours, theirs, params, model_state, tx, torch_opt, torch_loss, tol, why,
                 ours_config=None, torch_rows=None, ours_loss=losses.cross_entropy):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def convnet_spec(quick):
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from port_cnn import TorchConvNet

    (x, y), _ = data.load("synthetic", n_train=1024 if quick else 8192, n_test=1, features=64, classes=10)
    torch.manual_seed(0)
    theirs, ours = TorchConvNet(), models.ConvNet()
    params, model_state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(),
                                                  state=ours.init_state())

    def torch_opt(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return opt, None, None

    return Spec("convnet", x, y, 128, ours, theirs, params, model_state, optax.sgd(0.05, momentum=0.9), torch_opt,
                torch.nn.functional.cross_entropy, 1e-4,
                "float32 over one epoch of SGD-momentum: summation order in convs and BatchNorm statistics")


def gpt_spec(quick):
    import torch

    try:
        from comparisons.gpt import TorchGPT, torch_optimizer
    except ImportError as e:
        return f"comparisons/gpt.py (TorchGPT) not importable: {e}"
    from funcnet import gpt, text

    config = gpt.GPTConfig(block_size=32, vocab_size=text.vocabulary().size, n_layer=2, n_head=4, n_embd=64)
    (x, y), _ = text.load_text(config.block_size)
    n = 512 if quick else 2048
    x, y = x[:n], y[:n]
    torch.manual_seed(0)
    theirs, ours = TorchGPT(config), gpt.GPT(config)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    # nanoGPT's shakespeare_char settings (lr 1e-3, min_lr 1e-4). At lr 3e-3 one epoch of float32 drifts chaotically:
    # every row ended 1.2e-3 (torch.compile) to 2.6e-3 (funcnet) from torch eager, while the same epoch in float64 on
    # both sides ended 1.2e-12 apart (the same math); at lr 1e-3 every row, torch.compile's too, ends within 1e-4.
    opt = dict(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=10, decay_steps=200,
               min_lr=1e-4)

    def torch_opt(m):
        optimizer, scheduler = torch_optimizer(m, **opt)
        return optimizer, scheduler, 1.0

    def torch_loss(logits, y):
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    return Spec("gpt", x, y, 16, ours, theirs, params, {}, gpt.configure_optimizers(**opt, grad_clip=1.0),
                torch_opt, torch_loss, 5e-4,
                "float32 over one epoch (128 steps) of AdamW at lr 1e-3: summation order; measured on the full data "
                "(two runs, one --single-thread): torch.compile 4.7e-5 to 6.0e-5 from torch eager, the JAX rows "
                "4.4e-5 to 1.3e-4 (float64 on both sides: 1.2e-12; at lr 3e-3 float32 drifts chaotically, 1.2e-3 "
                "to 2.6e-3, torch.compile's included)",
                ours_config=config)


def lstm_spec(quick):
    import torch

    try:
        from comparisons.recurrent import RNNModel, torch_cell_loop
    except ImportError as e:
        return f"comparisons/recurrent.py (RNNModel) not importable: {e}"
    from funcnet import gpt, text

    vocab, size, layers, block, lr, clip = text.vocabulary().size, 64, 2, 32, 1.0, 0.25
    # the example's clip, not its lr 20: at lr 20 the full epoch (128 steps) is chaotic, every row
    # (torch.compile's and the LSTMCell loop's included) ended 0.07-0.33 from torch eager
    (x, y), _ = text.load_text(block)
    n = 512 if quick else 2048
    x, y = x[:n], y[:n]

    class TorchLM(RNNModel):
        """RNNModel on (B, T) blocks from a zero state, log-probabilities (B, T, vocab)."""

        def __init__(self, config):
            super().__init__(*config)
            self.config = config

        def lstm(self, emb):
            return self.rnn(emb, self.init_hidden(emb.size(1)))[0]

        def forward(self, idx):
            out = self.lstm(self.encoder(idx.t()))
            return torch.nn.functional.log_softmax(self.decoder(out), dim=-1).transpose(0, 1)

    class TorchCellLoopLM(TorchLM):
        """The same weights (nn.LSTM's parameters shared with one nn.LSTMCell per layer, which are
        not registered: the state_dict is RNNModel's) run as a Python loop over time."""

        def __init__(self, config):
            super().__init__(config)
            cells = [torch.nn.LSTMCell(config[1] if k == 0 else config[2], config[2]) for k in range(config[3])]
            for k, cell in enumerate(cells):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    setattr(cell, name, getattr(self.rnn, f"{name}_l{k}"))
            self.__dict__["cells"] = cells

        def lstm(self, emb):
            return torch_cell_loop(self.cells, emb, self.init_hidden(emb.size(1)))[0]

    config = (vocab, size, size, layers)
    torch.manual_seed(0)
    theirs = TorchLM(config)
    ours = models.LSTMLM(vocab, size, size, layers, dropout=0.0, batch_first=True, return_hidden=False)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())

    def torch_opt(m):
        return torch.optim.SGD(m.parameters(), lr=lr), None, clip

    def torch_loss(logp, y):
        return torch.nn.functional.nll_loss(logp.reshape(-1, logp.size(-1)), y.reshape(-1))

    return Spec("lstm", x, y, 16, ours, theirs, params, {}, optax.chain(gpt.clip_grad_norm(clip), optax.sgd(lr)),
                torch_opt, torch_loss, 1e-3,
                f"float32 over one epoch of SGD at lr {lr:g} after torch's clip_grad_norm_ ({clip}; optax's "
                "clip_by_global_norm, without torch's 1e-6, is 4e-3 off): a 1e-7 relative difference of a "
                "gradient moves a weight by up to lr * 5e-7 a step, and the steps add up (4e-4 after 32 steps at lr 20 "
                "measured)",
                torch_rows={LOOP: lambda: TorchCellLoopLM(config)},
                ours_loss=losses.nll_loss)  # the model gives log-probabilities, as torch's: its loss is NLL


# A new model is one spec function here and its peers in benchmarks/peers.py (optional: a model
# without peers has no peer rows).
SPECS = {"convnet": convnet_spec, "gpt": gpt_spec, "lstm": lstm_spec}


class Runner:
    """``epoch(order=None)`` runs one epoch (the given batch order, else its own shuffle);
    ``values()`` the parameters under torch's names; ``memory`` and ``stages`` as measured."""

    def __init__(self, epoch, values, memory=None, stages=None, flops=None):
        self.epoch, self.values, self.memory, self.stages, self.flops = epoch, values, memory, stages, flops


# ------------------------------------------------------------------------------------ torch
def torch_impl(spec, *, compiled, make=None):
    import torch

    make = make or (lambda: type(spec.theirs)(*([spec.theirs.config] if hasattr(spec.theirs, "config") else [])))
    model = make()
    model.load_state_dict(spec.theirs.state_dict())
    model.train()
    opt, scheduler, clip = spec.torch_opt(model)
    xs, ys = torch.from_numpy(spec.x), torch.from_numpy(spec.y.astype(np.int64))
    if not np.issubdtype(spec.x.dtype, np.floating):
        xs = xs.long()
    gen = torch.Generator().manual_seed(1)
    steps = len(xs) // spec.batch

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = spec.torch_loss(model(xb), yb)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss

    step = torch.compile(step) if compiled else step

    def epoch(order=None):
        perm = torch.randperm(len(xs), generator=gen)[: steps * spec.batch].view(steps, spec.batch) \
            if order is None else torch.from_numpy(np.asarray(order, np.int64))
        for idx in perm:
            step(xs[idx], ys[idx])
            if scheduler is not None:
                scheduler.step()

    def values():
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    def memory():
        idx = torch.arange(spec.batch)
        xb, yb = xs[idx], ys[idx]
        live = sum(t.nbytes for t in model.state_dict().values()) + xb.nbytes + yb.nbytes
        live += sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
        return {"peak": live + _torch_step_peak(lambda: step(xb, yb)), "kind": "torch allocator"}

    return Runner(epoch, values, memory)


def _torch_step_peak(run) -> int:
    """The peak, over one call of ``run``, of the bytes allocated minus freed since it began
    (torch.profiler's allocation events, CPU allocator)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    sizes = []

    def walk(node):
        if node.tag == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    now = peak = 0
    for _, size in sorted(sizes):
        now += size
        peak = max(peak, now)
    return peak


# -------------------------------------------------------------------------------------- JAX
def aot_stages(fn, *args) -> dict:
    """Seconds in each stage of a fresh compile of ``fn`` (a ``jax.jit`` result) on ``args``,
    XLA's memory analysis of the result and its FLOPs. Nothing runs."""
    t0 = time.perf_counter()
    traced = fn.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2,
            "memory": {"peak": m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                       + m.temp_size_in_bytes, "temp": m.temp_size_in_bytes, "kind": "XLA memory analysis"},
            "flops": (cost or {}).get("flops")}


def _loop(step, holder, xs, ys, batch, seed=1):
    """run_epoch(scan=False)'s loop for any pure ``step(carry, (x, y)) -> (carry, metrics)``."""
    key = [jax.random.key(seed)]

    def epoch(order=None):
        if order is None:
            key[0], k = jax.random.split(key[0])
            order = data.epoch_indices(k, len(xs), batch)
        history = []
        carry = holder[0]
        for idx in jnp.asarray(order):
            carry, metrics = step(carry, (xs[idx], ys[idx]))
            history.append(metrics)
        holder[0] = carry
        jax.block_until_ready((carry, jax.tree.map(lambda *m: jnp.stack(m), *history)))

    return epoch


def _batch0(spec):
    return jnp.asarray(spec.x[: spec.batch]), jnp.asarray(spec.y[: spec.batch])


def peer_impl(spec, name):
    peer = peers.build(spec, name)
    step = jax.jit(peer.step, donate_argnums=0)
    holder = [peer.carry]
    epoch = _loop(step, holder, jnp.asarray(spec.x), jnp.asarray(spec.y), spec.batch)
    carry = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if isinstance(a, jax.Array) else a,
                         peer.carry)
    # the stages through a new function: jit's caches (trace, lowering, executable) are per function
    return Runner(epoch, lambda: peer.values(holder[0]),
                  stages=lambda: aot_stages(jax.jit(lambda c, b: peer.step(c, b), donate_argnums=0), carry,
                                            _batch0(spec)))


def _fresh_state(spec):
    # copies: each step donates its state, and every implementation starts from spec's weights
    return train.create_train_state(spec.ours, spec.tx, jax.random.key(0), params=jax.tree.map(jnp.copy, spec.params),
                                    model_state=jax.tree.map(jnp.copy, spec.model_state))


def funcnet_impl(spec, *, scan):
    step = train.make_step(spec.ours, spec.tx, spec.ours_loss)
    holder = [_fresh_state(spec)]
    xs, ys = jnp.asarray(spec.x), jnp.asarray(spec.y)
    batch = _batch0(spec)
    def stages():  # after the first epoch: run_epoch's own check for convolutions is part of its start-up
        # through new functions: jit's caches (trace, lowering, executable) are per function
        if scan and not epoch._slow_in_loops(step.raw, _fresh_state(spec), *batch):  # one program per epoch
            scan_epoch = epoch._scan_epoch.__wrapped__
            fn = jax.jit(lambda st, x, y: scan_epoch(step.raw, st, x, y, spec.batch), donate_argnums=0)
            return dict(aot_stages(fn, _fresh_state(spec), xs, ys), whole_epoch=True)
        return aot_stages(jax.jit(lambda st, b: step.raw(st, b), donate_argnums=0), _fresh_state(spec), batch)

    def run(order=None):  # its own order always; the checked epoch's order is what the others get
        state, _ = train.run_epoch(step, holder[0], xs, ys, batch_size=spec.batch, scan=scan)
        holder[0] = jax.block_until_ready(state)

    def values():
        return {k: np.asarray(v) for k, v in funcnet.state_dict(holder[0].params, holder[0].model_state).items()}

    return Runner(run, values, stages=stages)


def converted_spec(spec):
    """``spec`` with the torch model converted by ``interop.convert`` (traced on one batch) in
    place of the hand-written funcnet model: the same weights, optimizer and data."""
    import copy

    import torch

    from funcnet import interop

    example = torch.from_numpy(np.asarray(spec.x[: spec.batch]))
    example = example.long() if not np.issubdtype(spec.x.dtype, np.floating) else example
    model, params, state = interop.convert(spec.theirs, example)
    out = copy.copy(spec)
    out.ours, out.params, out.model_state = model, params, state
    return out


def first_order(spec):
    state = _fresh_state(spec)
    return np.asarray(data.epoch_indices(jax.random.split(state.key)[1], len(spec.x), spec.batch))


def unavailable(spec, name):
    """Why ``spec`` has no ``name`` row (None when it has one)."""
    if name == LOOP and LOOP not in (spec.torch_rows or {}):
        return f"no {name!r} row: a torch row of the lstm spec alone"
    if name in PEERS and name not in peers.PEERS.get(spec.name, {}):
        return f"no {name!r} peer in benchmarks/peers.py (PEERS[{spec.name!r}])"
    return None


def build(spec, name) -> Runner:
    if name in (spec.torch_rows or {}):
        return torch_impl(spec, compiled=False, make=spec.torch_rows[name])
    if name.startswith("torch"):
        return torch_impl(spec, compiled=name == "torch.compile")
    if name in PEERS:
        return peer_impl(spec, name)
    if name == CONVERTED:
        return funcnet_impl(converted_spec(spec), scan=False)
    return funcnet_impl(spec, scan=name == "funcnet run_epoch")


# ---------------------------------------------------------------------------------- harness
def _error(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:120] if text else ''}"


def bench_model(spec, impls, repeat, peaks, loads, log):
    order = first_order(spec)
    runners, errors, first = {}, {}, {}
    for name in impls:
        try:
            runner = build(spec, name)  # new functions: nothing of it is in jit's caches yet
            t0 = time.perf_counter()
            runner.epoch(order)  # the checked epoch; traces and compiles
            first[name] = time.perf_counter() - t0
            log(f"{spec.name}: {name} first epoch {first[name]:.2f}s")
            runner.checked = runner.values()
            if name.startswith("torch"):
                runner.memory = runner.memory()
            else:
                runner.stages = runner.stages()
                runner.memory, runner.flops = runner.stages["memory"], runner.stages["flops"]
                if runner.stages.get("whole_epoch"):
                    runner.flops = None  # an epoch's; the per-step figure is make_step's
            runners[name] = runner
        except Exception as e:  # reported in the table
            errors[name] = _error(e)
            log(f"{spec.name}: {name} failed: {errors[name]}")
    for runner in runners.values():
        runner.epoch()  # warm
    times, cpu = {name: [] for name in runners}, {name: [] for name in runners}
    for r in range(repeat):
        for name, runner in runners.items():
            t0, c0 = time.perf_counter(), time.process_time()
            runner.epoch()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        peaks.append(profile.matmul_peak(1024, repeat=3, number=2))
        loads.append(os.getloadavg()[0])
        log(f"{spec.name}: round {r + 1}/{repeat}, load {loads[-1]:.2f}")
    flops = next((r.flops for r in runners.values() if r.flops), None)
    ref = runners["torch eager"].checked if "torch eager" in runners else None
    steps = len(spec.x) // spec.batch
    rows = []
    for name in impls:
        row = {"model": spec.name, "impl": name, "batch": spec.batch, "steps": steps, "error": errors.get(name)}
        if name in runners:
            runner = runners[name]
            sec = statistics.median(times[name])
            got = runner.checked
            shared = [k for k in ref if k in got] if ref is not None else []
            diff = max((float(np.max(np.abs(got[k].astype(np.float64) - ref[k]))) for k in shared), default=None)
            # what one example is made of: a GPT example is a block of tokens, a conv net's an image
            per_example, unit = (spec.x.shape[1], "tokens") if spec.name in ("gpt", "lstm") else (1, "images")
            row.update(seconds_per_epoch=sec, seconds_all=times[name], ms_per_step=sec / steps * 1e3,
                       cpu_seconds_all=cpu[name], cpu_ms_per_step=statistics.median(cpu[name]) / steps * 1e3,
                       flops_per_step=flops, max_diff_vs_torch_eager=diff, compared=len(shared), unit=unit,
                       per_second=spec.batch * per_example * steps / sec, first_epoch_s=first[name],
                       startup_s=first[name] - sec, memory=runner.memory)
            if runner.stages:
                row["stages_s"] = {k: runner.stages[k] for k in ("trace", "lower", "compile")}
                row["stages_whole_epoch"] = bool(runner.stages.get("whole_epoch"))
            if flops:
                row["gflops"] = flops * steps / sec / 1e9
            row["vs"] = {other: statistics.median(a / b for a, b in zip(times[other], times[name]))
                         for other in runners if other != name}  # > 1: this row is faster
            row["vs_cpu"] = {other: statistics.median(a / b for a, b in zip(cpu[other], cpu[name]))
                             for other in runners if other != name}
        rows.append(row)
    if "funcnet run_epoch" in runners and "funcnet make_step" in runners:
        a, b = runners["funcnet run_epoch"].checked, runners["funcnet make_step"].checked
        next(r for r in rows if r["impl"] == "funcnet run_epoch")["bitwise_equal_make_step"] = \
            all(np.array_equal(a[k], b[k]) for k in a)
    return rows


def goals(rows):
    """funcnet (its faster row) >= each JAX peer, 3% slack; and the torch goals of issue 14."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        ours = [r for r in rows if r["model"] == model and r["impl"].startswith("funcnet") and r.get("seconds_per_epoch")]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["seconds_per_epoch"])
        for peer in PEERS:
            if peer in best["vs"]:
                x = best["vs"][peer]
                out.append((f"{model}: {best['impl']} >= {peer} (3% slack)", x >= SLACK, f"{x:.2f}x"))
        if "torch eager" in best["vs"]:
            x = best["vs"]["torch eager"]
            out.append((f"{model}: {best['impl']} >= 1.5x torch eager", x >= 1.5, f"{x:.2f}x"))
        if "torch.compile" in best["vs"]:
            x = best["vs"]["torch.compile"]
            out.append((f"{model}: {best['impl']} ahead of torch.compile", x > 1, f"{x:.2f}x"))
        converted = next((r for r in rows if r["model"] == model and r["impl"] == CONVERTED and r.get("vs")), None)
        if converted is not None and "funcnet make_step" in converted["vs"]:
            x = converted["vs"]["funcnet make_step"]
            out.append((f"{model}: the converted torch model's step within 5% of the hand-written funcnet model's",
                        x >= 0.95, f"{x:.3f}x"))
    return out


def _mb(n):
    return f"{n / 2**20:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, metavar="IMPL")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small data, one round, no torch.compile")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool): "
                             "fair on a busy machine, where torch's OpenMP threads spin-wait for each other")
    args = parser.parse_args(argv)
    quick_skips = {}
    if args.quick:
        args.repeat = 1
        if "torch.compile" in args.impls:
            quick_skips["torch.compile"] = "--quick: Dynamo + Inductor take minutes on a busy machine (the lstm step ~100 s)"
        args.impls = [i for i in args.impls if i != "torch.compile"]
    import torch

    if args.single_thread:
        profile.one_core()  # before XLA's CPU client starts, at the first computation below
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
        torch.set_num_threads(1)
    console = Console(width=max(Console().width, 230))
    load_before = os.getloadavg()
    peaks, loads = [profile.matmul_peak(1024, repeat=5)], []
    rows, skipped = [], dict(quick_skips)
    for name in args.models:
        spec = SPECS[name](args.quick)
        if isinstance(spec, str):
            skipped[name] = spec
            continue
        impls = []
        for impl in args.impls:
            why = unavailable(spec, impl)
            if why:
                skipped[f"{name} {impl}"] = why
            else:
                impls.append(impl)
        new = bench_model(spec, impls, args.repeat, peaks, loads, console.log)
        for r in new:
            r["tolerance"], r["tolerance_why"] = spec.tol, spec.why
        rows += new
    peak, load_after = max(peaks), os.getloadavg()
    checked = goals(rows)

    table = Table(title=f"train step, median of {args.repeat} interleaved epochs; float32 matmul peak "
                        f"{peak / 1e9:.1f} GFLOP/s (best of {len(peaks)}, median {statistics.median(peaks) / 1e9:.1f}); "
                        f"torch {torch.__version__}, {torch.get_num_threads()} threads; jax {jax.__version__}; "
                        f"{os.cpu_count()} CPUs; load average {load_before[0]:.2f} -> "
                        f"{', '.join(f'{x:.2f}' for x in loads)} (per round) -> {load_after[0]:.2f}")
    for col in ("model", "impl", "ms/step", "CPU ms/step", "per second", "x torch eager", "x torch.compile", "% of peak",
                "start-up s", "trace/lower/compile s", "peak MB", "max |diff| vs torch", "error"):
        table.add_column(col, justify="left" if col in ("model", "impl", "error") else "right", overflow="fold")
    bad = []
    for r in rows:
        if r.get("seconds_per_epoch") is None:
            table.add_row(r["model"], r["impl"], *["-"] * 10, r["error"] or "")
            continue
        d = r["max_diff_vs_torch_eager"]
        diff = "-" if d is None else f"{d:.1e}"
        if d is not None and d > r["tolerance"]:
            bad.append(r)
        if "bitwise_equal_make_step" in r:
            diff += " (bitwise = make_step)" if r["bitwise_equal_make_step"] else " (differs from make_step)"
        g, vs = r.get("gflops"), r["vs"]
        st = r.get("stages_s")
        stages = "-" if not st else "/".join(f"{st[k]:.2f}" for k in ("trace", "lower", "compile")) + \
            (" (epoch)" if r.get("stages_whole_epoch") else "")
        mem = r["memory"]
        table.add_row(r["model"], r["impl"], f"{r['ms_per_step']:.2f}", f"{r['cpu_ms_per_step']:.2f}",
                      f"{r['per_second']:,.0f} {r['unit']}",
                      f"{vs['torch eager']:.2f}" if "torch eager" in vs else "-",
                      f"{vs['torch.compile']:.2f}" if "torch.compile" in vs else "-",
                      f"{g * 1e9 / peak:.1%}" if g else "-", f"{r['startup_s']:.2f}", stages,
                      _mb(mem["peak"]) if mem else "-", diff, "")
    console.print(table)

    ours = Table(title="funcnet against the JAX peers: x = the peer's time / funcnet's, median of per-round "
                       "ratios (> 1: funcnet faster); wall time, and CPU time of this process (steadier on a "
                       "busy machine)")
    for col in ("model", "funcnet row", *PEERS):
        ours.add_column(col, justify="left" if col in ("model", "funcnet row") else "right")
    for r in rows:
        if r["impl"].startswith("funcnet") and r.get("vs"):
            ours.add_row(r["model"], r["impl"], *[f"{r['vs'][p]:.3f} wall, {r['vs_cpu'][p]:.3f} CPU"
                                                  if p in r["vs"] else "-" for p in PEERS])
    console.print(ours)
    console.print("memory: JAX rows XLA's memory analysis of the compiled step (args + outputs - donated + temps; "
                  "run_epoch's scan: the whole epoch's program); torch rows live tensors + the peak of one step's "
                  "allocations (torch.profiler, CPU allocator). start-up: first epoch - steady epoch. "
                  "trace/lower/compile: a separate ahead-of-time compile of the step.")
    for r in rows:
        if r["impl"] == "funcnet make_step" and r.get("flops_per_step"):
            console.print(f"{r['model']}: {r['flops_per_step'] / 1e6:.1f} MFLOP per step (XLA cost analysis); "
                          f"tolerance {r['tolerance']:g}: {r['tolerance_why']}")
    for name, why in skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {why}")
    for r in bad:
        console.print(f"[red]MISMATCH[/] {r['model']} {r['impl']}: {r['max_diff_vs_torch_eager']:.1e} > {r['tolerance']}")
    for name, ok, figure in checked:
        console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "cpus": os.cpu_count(), "peak_flops": peak,
                       "peak_samples": peaks, "load_average": [load_before, load_after], "load_per_round": loads,
                       "single_thread": args.single_thread, "torch": torch.__version__, "jax": jax.__version__,
                       "rows": rows, "skipped": skipped,
                       "goals": [{"goal": n, "met": ok, "figure": fig} for n, ok, fig in checked]}, f, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
