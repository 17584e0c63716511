"""Timing, the two host-device traps, and the articles' bottleneck table, measured.

- Timing: torch times a CUDA forward with ``torch.cuda.Event`` + ``synchronize()``;
  on a CPU torch runs each op before returning, so ``perf_counter`` is already
  right. JAX dispatches asynchronously on every backend: without
  ``block_until_ready`` the clock stops when the work is queued, not done.
- Trap 1, a host-to-device copy every step, vs one copy up front.
- Trap 2, ``loss.item()`` (``float(loss)``) every step, which waits for the device
  each time, vs keeping losses on the device and fetching them once.
- Bottlenecks (data loading, transfer, out of memory, compute, gradient sync): the
  JAX remedy of each row with a measured figure.

Every figure is one run on a shared machine: the checks assert that the numbers
agree and that blocking waits, never a speed.
"""

from __future__ import annotations

import time

import numpy as np

from comparisons._core import Options, Result, Side, close, equal, expect, source

TITLE = "Performance: timing with synchronisation, the transfer and .item() traps, the bottleneck table"

STEPS, BATCH, LR = 11, 128, 0.1


def torch_timing(model, x):
    import torch

    if torch.cuda.is_available():  # the articles' recipe: events on the stream, then wait for it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(x)
        end.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(end) / 1e3
    start = time.perf_counter()  # CPU tensors: each op has finished when it returns
    out = model(x)
    return out, time.perf_counter() - start


def jax_timing(forward, params, x):
    from funcnet import profile

    out, dispatched = profile.timed(forward, params, x, block=False)  # forgot to block
    ready_at_return = out.is_ready()
    out.block_until_ready()
    out, waited = profile.timed(forward, params, x)  # jax.block_until_ready inside
    return out, dispatched, waited, ready_at_return


def torch_loop(model, xs, ys, *, copy_each_step, item_each_step):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if not copy_each_step:
        xs_dev, ys_dev = torch.tensor(xs, device=device), torch.tensor(ys, device=device)  # one copy
    losses = []
    for i in range(len(xs)):
        if copy_each_step:
            x, y = torch.tensor(xs[i], device=device), torch.tensor(ys[i], device=device)  # a copy per step
        else:
            x, y = xs_dev[i], ys_dev[i]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item() if item_each_step else loss.detach())  # .item() waits for the device
    return np.asarray(losses) if item_each_step else torch.stack(losses).cpu().numpy()


def jax_loop(step, state, xs, ys, *, copy_each_step, item_each_step):
    import jax
    import jax.numpy as jnp

    if not copy_each_step:
        on_device = jax.device_put(list(zip(xs, ys)))  # every batch in one call, before the loop
    losses = []
    for i in range(len(xs)):
        batch = jax.device_put((xs[i], ys[i])) if copy_each_step else on_device[i]
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]) if item_each_step else metrics["loss"])  # float() waits
    return np.asarray(losses) if item_each_step else np.asarray(jnp.stack(losses))  # one fetch


def _flat(tree) -> np.ndarray:
    import jax

    return np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(tree)])


def _median_seconds(fn, repeat=3):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, float(np.median(times))


def _traps(xs, ys, torch_factory, jax_params):
    """Each trap both ways in both frameworks: (losses, seconds) per variant."""
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import nn, train

    model, tx = nn.MLP([xs.shape[-1], 128, 10]), optax.sgd(LR)
    step = train.make_step(model, tx)

    def fresh_state():  # the step donates its state: every run starts from a copy
        return train.create_train_state(model, tx, jax.random.key(0), params=jax.tree.map(jnp.copy, jax_params))

    variants = {"copy per step": (True, False), "copy once": (False, False), ".item() per step": (False, True)}
    # first calls (compile, torch's lazy initialisation) are not timed
    jax_loop(step, fresh_state(), xs, ys, copy_each_step=False, item_each_step=False)
    torch_loop(torch_factory(), xs, ys, copy_each_step=False, item_each_step=False)
    out = {}
    for name, (copy, item) in variants.items():
        out["torch", name] = _median_seconds(
            lambda: torch_loop(torch_factory(), xs, ys, copy_each_step=copy, item_each_step=item))
        out["jax", name] = _median_seconds(
            lambda: jax_loop(step, fresh_state(), xs, ys, copy_each_step=copy, item_each_step=item))
    return out, step, fresh_state


def _bottlenecks(x, y, step, fresh_state):
    """The JAX remedy of each row of the articles' table, with a figure and what it must preserve."""
    import functools

    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import data, losses, memory, nn, profile, train

    rows = {}
    # data loading: a host-side loader (numpy gather + copy per batch) vs the epoch on device in one scan
    idx = data.epoch_indices(jax.random.key(1), len(x), BATCH)
    idx_np = np.asarray(idx)

    def host_loader():
        state = fresh_state()
        for b in idx_np:
            state, _ = step(state, (x[b], y[b]))
        return jax.block_until_ready(state.params)

    @functools.partial(jax.jit, donate_argnums=0)
    def device_epoch(state, x_dev, y_dev, idx):
        return jax.lax.scan(lambda s, b: step.raw(s, (x_dev[b], y_dev[b])), state, idx)[0]

    x_dev, y_dev = jax.device_put((x, y))
    device_epoch(fresh_state(), x_dev, y_dev, idx)  # compile
    host_params, t_host = _median_seconds(host_loader)
    dev_state, t_dev = _median_seconds(lambda: jax.block_until_ready(device_epoch(fresh_state(), x_dev, y_dev, idx)))
    rows["data loading"] = ("data on device, gathered by index inside one lax.scan (what run_epoch does)",
                            f"epoch {t_host * 1e3:.1f} ms host loader -> {t_dev * 1e3:.1f} ms ({t_host / t_dev:.1f}x)",
                            close("data loading: scanned epoch == host-loader epoch (params)", _flat(dev_state.params),
                                  _flat(host_params), rtol=1e-5, atol=1e-6, why="same batches, same order"))
    # data that does not fit on the device: streamed from record files by funcnet.loader (grain; worker
    # processes with workers=k, here 0: a background thread still prefetches batches to the device)
    import tempfile

    from funcnet import loader

    with tempfile.TemporaryDirectory() as tmp:
        stream = loader.Loader(loader.write_records(tmp, x, y), BATCH, seed=1)
        seen = [tuple(np.asarray(a) for a in b) for b in stream.batches(0, stream.steps_per_epoch)]

        def streamed(batches):
            state = fresh_state()
            for b in batches:
                state, _ = step(state, b)
            return jax.block_until_ready(state.params)

        stream_params, t_stream = _median_seconds(lambda: streamed(stream.batches(0, stream.steps_per_epoch)))
    rows["data loading"] = (rows["data loading"][0] + "; data too large for it: funcnet.loader streams record "
                            "files (grain workers, prefetch to the device)",
                            rows["data loading"][1] + f"; streamed from files {t_stream * 1e3:.1f} ms",
                            *rows["data loading"][2:],
                            equal("data loading: streamed epoch == its batches stepped from host arrays (params)",
                                  _flat(stream_params), _flat(streamed(seen))))

    # out of memory: gradient accumulation over 4 micro-batches instead of one large batch
    model, tx = nn.MLP([x.shape[1], 128, 10]), optax.sgd(LR)
    big = (x[:512], y[:512])
    full = train.make_step(model, tx).lower(fresh_state(), big).compile()
    accum = train.make_step(model, tx, accum_steps=4).lower(fresh_state(), big).compile()
    m_full, m_accum = memory.measure(full), memory.measure(accum)
    p_full, p_accum = full(fresh_state(), big)[0].params, accum(fresh_state(), big)[0].params
    rows["out of memory"] = ("make_step(accum_steps=4): same update, a quarter of the activations",
                             f"XLA temps {m_full.temps:,} -> {m_accum.temps:,} bytes at batch 512",
                             close("out of memory: accumulated update == full-batch update", _flat(p_accum),
                                   _flat(p_full), rtol=1e-5, atol=1e-6,
                                   why="mean of 4 micro-batch gradients, float32 sums"))
    rows["out of memory"] += (expect("out of memory: accumulation needs fewer temporary bytes",
                                     m_accum.temps < m_full.temps, rows["out of memory"][1]),)

    # compute efficiency: op-by-op (eager) dispatch vs one compiled XLA program
    batch = (jnp.asarray(x[:BATCH]), jnp.asarray(y[:BATCH]))
    params = fresh_state().params

    def forward_loss(p, xb, yb):
        return losses.cross_entropy(model.apply(p, xb), yb)

    eager = profile.benchmark(forward_loss, params, *batch, warmup=1, repeat=5)  # warm-up fills op caches
    fused = profile.benchmark(jax.jit(forward_loss), params, *batch, warmup=1, repeat=20)

    def seconds_per_step(n):  # each step takes the state the last one returned (donated, keys used once)
        state = fresh_state()
        with profile.Timer() as timer:
            for _ in range(n):
                state, _ = step(state, batch)
            timer.block(state)
        return timer.seconds / n

    t_step, flops = seconds_per_step(20), profile.flops(step, fresh_state(), batch, optimized=False)
    peak = profile.matmul_peak(512, repeat=3, number=2)
    rows["compute efficiency"] = (
        "jax.jit: one fused XLA program instead of one dispatch per op; XLA's cost analysis counts the FLOPs",
        f"forward+loss {eager.median * 1e3:.2f} ms op by op -> {fused.median * 1e3:.3f} ms jit "
        f"({eager.median / fused.median:.0f}x); train step {t_step * 1e3:.3f} ms = {flops / t_step / 1e9:.2f} "
        f"GFLOP/s, {flops / t_step / peak:.1%} of the {peak / 1e9:.0f} GFLOP/s matmul peak (small layers)",
        close("compute: jitted forward+loss == op-by-op forward+loss", jax.jit(forward_loss)(params, *batch),
              forward_loss(params, *batch), rtol=1e-6, atol=1e-6, why="same ops, fused"))

    # gradient sync: one pmean per update, however many micro-batches it accumulates
    n_dev = jax.local_device_count()
    shard = (x[: BATCH * n_dev].reshape(n_dev, BATCH, -1), y[: BATCH * n_dev].reshape(n_dev, BATCH))

    def synced(k):
        pstep = train.make_step(model, tx, axis_name="batch", accum_steps=k)
        state = fresh_state()  # one copy per device; a key of its own each (a key is used once)
        rep = jax.tree.map(lambda a: jnp.stack([a] * n_dev), state._replace(key=None))
        rep = rep._replace(key=jax.random.split(state.key, n_dev))
        return pstep, rep, pstep.lower(rep, shard).as_text().count("all_reduce")

    (p1, rep1, n1), (_, _, n4) = synced(1), synced(4)
    new = p1(rep1, shard)[0]
    single = step(fresh_state(), (x[: BATCH * n_dev], y[: BATCH * n_dev]))[0]
    rows["gradient sync"] = (
        f"lax.pmean of the gradients inside the step ({n_dev} device(s)); accumulation syncs once per update",
        f"all-reduce ops per update: {n1} with accum_steps=1, {n4} with accum_steps=4, so {n1} vs "
        f"{n4 / 4:.1f} per micro-batch",
        close("gradient sync: data-parallel update == one-device update on the whole batch",
              _flat(jax.tree.map(lambda a: a[0], new.params)), _flat(single.params), rtol=1e-5, atol=1e-6,
              why="mean of per-device gradients is the full-batch gradient"))
    rows["gradient sync"] += (equal("gradient sync: accumulation adds no all-reduce", n4, n1),)
    return rows


def run(opts: Options = Options(), *, table: bool = True) -> Result:
    """table=False leaves out the remedies' rows (each checks JAX against JAX, and costs most of the
    run): the tests' perturbed run, which needs only the torch-vs-JAX checks and the traps."""
    import jax
    import torch

    from funcnet import data, nn
    from funcnet.interop import from_torch

    torch.manual_seed(0)
    big_torch = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    big_params = from_torch(big_torch)
    big_params["0"]["weight"] = big_params["0"]["weight"].at[0, 0].add(opts.perturb)
    x_big = np.random.default_rng(0).normal(size=(1024, 784)).astype(np.float32)
    forward = jax.jit(nn.MLP([784, 1024, 1024, 10]).apply)
    forward(big_params, x_big).block_until_ready()  # compile outside the timing
    with torch.no_grad():
        t_out, t_seconds = torch_timing(big_torch, torch.from_numpy(x_big))
    j_out, dispatched, waited, ready = jax_timing(forward, big_params, x_big)

    (x, y), _ = data.load("digits")
    xs, ys = x[: STEPS * BATCH].reshape(STEPS, BATCH, -1), y[: STEPS * BATCH].reshape(STEPS, BATCH)
    torch.manual_seed(1)
    small = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    init = {k: v.clone() for k, v in small.state_dict().items()}

    def torch_factory():
        small.load_state_dict(init)
        return small

    jax_params = from_torch(small)
    jax_params["2"]["bias"] = jax_params["2"]["bias"].at[0].add(opts.perturb)  # digits' pixel 0 is always 0
    traps, step, fresh_state = _traps(xs, ys.astype(np.int64), torch_factory, jax_params)
    rows = _bottlenecks(x, y, step, fresh_state) if table else {}
    copy_each, copy_once = traps["jax", "copy per step"][1], traps["jax", "copy once"][1]
    rows = {**({"data loading": rows.pop("data loading")} if table else {}),
            "host-device copy": ("one jax.device_put of all batches up front (asynchronous; no pin_memory step)",
                                 f"{STEPS} steps {copy_each * 1e3:.2f} ms copying each batch -> "
                                 f"{copy_once * 1e3:.2f} ms copied once ({copy_each / copy_once:.2f}x)"),
            **rows}

    (t_ref, _), (j_ref, _) = traps["torch", "copy once"], traps["jax", "copy once"]
    checks = [
        close("timing: same forward output (1024 x 784 MLP)", j_out, t_out, rtol=1e-4, atol=1e-5,
              why="float32, 784- and 1024-term dot products summed in different orders"),
        expect("timing: JAX result not ready when the call returns (async dispatch)", not ready,
               f"is_ready() right after the call: {ready}"),
        expect("timing: the blocking time >= the dispatch time", waited >= dispatched,
               f"blocked {waited * 1e3:.2f} ms vs dispatch {dispatched * 1e3:.3f} ms"),
    ]
    for name in ("copy per step", ".item() per step"):
        checks.append(equal(f"torch: {name} gives the same losses", traps["torch", name][0], t_ref))
        checks.append(equal(f"jax: {name} gives the same losses", traps["jax", name][0], j_ref))
    checks.append(close(f"same {STEPS} SGD losses in torch and JAX", j_ref, t_ref, rtol=1e-5, atol=1e-6,
                        why="same initial weights (interop) and batches; float32 rounding over the steps"))
    checks += [c for row in rows.values() for c in row[2:]]

    def ms(key):
        return f"{traps[key][1] * 1e3:.2f} ms"

    trap_lines = "\n".join(f"{name:18s} torch {ms(('torch', name)):>10s}   jax {ms(('jax', name)):>10s}"
                           for name in ("copy per step", "copy once", ".item() per step"))
    table = "\n".join(f"{row:18s} {remedy}\n{'':18s} measured: {figure}" for row, (remedy, figure, *_) in rows.items())
    device = "cuda" if torch.cuda.is_available() else "cpu (synchronous: perf_counter is exact, no Event needed)"
    return Result(
        name="performance", title=TITLE,
        torch=Side(source(torch_timing, torch_loop),
                   f"forward 1024 x 784: {t_seconds * 1e3:.2f} ms on {device}\n{STEPS}-step SGD loop "
                   f"(digits, batch {BATCH}): copy per step {ms(('torch', 'copy per step'))}, "
                   f".item() per step {ms(('torch', '.item() per step'))}, fixed {ms(('torch', 'copy once'))}",
                   steady_seconds=t_seconds),  # both timings are of warm calls (compiled outside them)
        jax=Side(source(jax_timing, jax_loop),
                 f"forward 1024 x 784: dispatch {dispatched * 1e3:.3f} ms (not blocked, result ready: {ready}), "
                 f"blocked {waited * 1e3:.2f} ms\n{STEPS}-step SGD loop: copy per step "
                 f"{ms(('jax', 'copy per step'))}, float() per step {ms(('jax', '.item() per step'))}, "
                 f"fixed {ms(('jax', 'copy once'))}",
                 steady_seconds=waited),
        checks=checks,
        notes=f"loop variants, median of 3 ({STEPS} steps, batch {BATCH}):\n{trap_lines}\n\n"
              f"bottleneck table (JAX remedy, measured here):\n{table}\n"
              "on a CPU the 'device' is host memory: a copy is a memcpy and .item() waits for a CPU "
              "thread, so the traps cost far less than over PCIe; the ratios, not the times, carry over.",
    )
