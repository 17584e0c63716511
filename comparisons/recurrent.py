"""An LSTM language model trained with truncated BPTT, in torch and in funcnet, step by step.

torch: pytorch/examples' word_language_model shape (``RNNModel`` with an LSTM and the decoder
tied to the embedding; ``batchify``, ``get_batch``, ``repackage_hidden``, plain SGD after
``clip_grad_norm_``), written here in torch.nn alone. funcnet: ``funcnet.models.LSTMLM``, the
same children under the same names, so torch's state_dict loads as is; the whole run is one
``lax.scan`` of a step whose carry holds the hidden state under ``stop_gradient``, as
``hidden.detach()`` cuts torch's graph between batches. The batches are characters of CPython's
bundled documentation (``funcnet.text``).

It is also the dynamic-graph lesson measured: torch's Python loop over time steps records a
graph node per step and op on every call; JAX compiles the loop once, and how it is written
decides the compile time: a Python loop under ``jit`` is unrolled into the program (its
compile grows with the sequence), ``lax.scan`` compiles one step (flat).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from torch import nn as tnn

import funcnet
from funcnet import compile_cache, gpt, losses, models, nn, text
from comparisons._core import (
    Options, Result, Side, close, dtypes, equal, expect, one_torch_thread, raises, source, timed,
)

__all__ = ["TITLE", "run", "RNNModel"]

TITLE = "An LSTM language model (word_language_model) with truncated BPTT: torch vs funcnet, loop vs lax.scan"

NTOKEN = text.vocabulary().size
EMSIZE = NHID = 32
NLAYERS, BPTT, BSZ, STEPS = 2, 16, 8, 40
LR, CLIP = 20.0, 0.25  # the example's defaults
COMPILE_LENGTHS = (4, 16, 64)  # sequence lengths whose compile is timed (the unrolled loop at 128: minutes)
TIMING_REPEATS = 10


# ----------------------------------------------------------------------------- torch (pytorch/examples)
class RNNModel(tnn.Module):
    """Container module with an encoder, a recurrent module, and a decoder (LSTM, tied)."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0):
        super().__init__()
        self.ntoken = ntoken
        self.drop = tnn.Dropout(dropout)
        self.encoder = tnn.Embedding(ntoken, ninp)
        self.rnn = tnn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = tnn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight  # tie_weights
        self.nlayers, self.nhid = nlayers, nhid
        initrange = 0.1
        tnn.init.uniform_(self.encoder.weight, -initrange, initrange)
        tnn.init.zeros_(self.decoder.bias)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        return F.log_softmax(decoded.view(-1, self.ntoken), dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()  # (nbatch, bsz) columns


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def torch_train(model, train_data, steps):
    model.train()
    hidden = model.init_hidden(BSZ)
    losses_ = []
    for batch, i in enumerate(range(0, steps * BPTT, BPTT)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)  # truncated BPTT: the graph stops at this batch
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = F.nll_loss(output, targets)
        loss.backward()
        tnn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        losses_.append(loss.item())
    return np.asarray(losses_)


def torch_no_detach(model, train_data):
    hidden = model.init_hidden(BSZ)
    for i in (0, BPTT):  # without repackage_hidden the second backward reaches the first graph
        data, targets = get_batch(train_data, i)
        output, hidden = model(data, hidden)
        F.nll_loss(output, targets).backward()


def torch_cell_loop(cells, emb, hidden):
    """The LSTM as a Python loop over time steps: a graph node per step and op, rebuilt each call."""
    h, c = list(hidden[0]), list(hidden[1])
    outputs = []
    for x in emb:  # (T, B, ninp): one step at a time
        for layer, cell in enumerate(cells):
            h[layer], c[layer] = cell(x, (h[layer], c[layer]))
            x = h[layer]
        outputs.append(x)
    return torch.stack(outputs), (torch.stack(h), torch.stack(c))


# ------------------------------------------------------------------------------ funcnet
def funcnet_trainer(model, tx):
    def step(carry, xy):
        params, opt_state, hidden = carry
        x, y = xy
        hidden = jax.lax.stop_gradient(hidden)  # torch: repackage_hidden (hidden.detach())

        def loss_fn(params):
            output, hidden_out = model.apply(params, x, hidden, train=True)
            return losses.nll_loss(output, y), hidden_out

        (loss, hidden), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, hidden), loss

    @jax.jit
    def train(params, hidden, xs, ys):  # every batch in one lax.scan
        (params, _, hidden), losses_ = jax.lax.scan(step, (params, tx.init(params), hidden), (xs, ys))
        return params, hidden, losses_

    return train


def funcnet_chunks_grads(model, params, hidden, chunks):
    """Gradients of two consecutive chunks' losses in one differentiated function: with
    ``stop_gradient`` between them (truncated BPTT) and without (backprop through both); and the
    first chunk's log-probabilities and final hidden state."""

    def loss_fn(params, truncate):
        h, total, first = hidden, 0.0, None
        for x, y in chunks:
            h = jax.lax.stop_gradient(h) if truncate else h
            output, h = model.apply(params, x, h)
            first = (output, h) if first is None else first
            total = total + losses.nll_loss(output, y)
        return total, first

    truncated, first = jax.grad(loss_fn, has_aux=True)(params, True)
    full, _ = jax.grad(loss_fn, has_aux=True)(params, False)
    return truncated, full, first


def funcnet_cell_loop(cells, params, emb, hidden):
    """The same Python loop over time with nn.LSTMCell: under jit it is unrolled, T copies of the step."""
    h, c = list(hidden[0]), list(hidden[1])
    outputs = []
    for x in emb:
        for layer, cell in enumerate(cells):
            h[layer], c[layer] = cell.apply(params[layer], x, (h[layer], c[layer]))
            x = h[layer]
        outputs.append(x)
    return jnp.stack(outputs), (jnp.stack(h), jnp.stack(c))


def _cell_params(params):
    # nn.LSTM's weight_ih_l{k} ... are nn.LSTMCell's weight_ih ... for layer k
    return [{n: params[f"{n}_l{k}"] for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")} for k in range(NLAYERS)]


# ------------------------------------------------------------------------------ measurements
def compile_loop_and_scan(params, length):
    """One LSTM layer's forward over ``length`` steps, compiled two ways: a Python loop of
    nn.LSTMCell under jit (unrolled: ``length`` copies of the step) and nn.LSTM (one lax.scan).
    Returns the two executables and the wall seconds each took to trace and compile."""
    lstm, cell = nn.LSTM(EMSIZE, NHID, dtype=params["weight_ih_l0"].dtype), nn.LSTMCell(EMSIZE, NHID)
    cell_params = _cell_params(params)[0]
    params = {k: v for k, v in params.items() if k.endswith("_l0")}

    def loop(emb, hidden):
        out, _ = funcnet_cell_loop([cell], [cell_params], emb, hidden)
        return out

    def scan(emb, hidden):
        return lstm.apply(params, emb, hidden)[0]

    emb = jax.ShapeDtypeStruct((length, BSZ, EMSIZE), params["weight_ih_l0"].dtype)
    hidden = jax.eval_shape(lambda: tuple(h[:1] for h in models.init_hidden(NLAYERS, BSZ, NHID, emb.dtype)))
    compiled, seconds = [], []
    # a warm persistent cache (a user's second run) would answer in milliseconds: compile for real
    with compile_cache.paused():
        for fn in (loop, scan):
            t0 = time.perf_counter()
            compiled.append(jax.jit(fn).lower(emb, hidden).compile())
            seconds.append(time.perf_counter() - t0)
    return compiled, seconds


def _per_step(fn, repeats=TIMING_REPEATS):
    fn()  # warm: compile, torch's lazy initialisation
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


# ------------------------------------------------------------------------------ checks
def run(opts: Options = Options(), *, steps: int = STEPS, compile_lengths=COMPILE_LENGTHS) -> Result:
    """``steps`` TBPTT steps (40 by default); ``compile_lengths``: three sequence lengths whose
    compile is timed (shorter ones keep a test short; the growth check needs the default)."""
    with one_torch_thread():  # tiny ops: extra OpenMP threads only wait on each other
        return _run(opts, steps, tuple(compile_lengths))


def _run(opts: Options, steps: int, compile_lengths: tuple) -> Result:
    tdtype, jdtype = dtypes(opts)
    ids = text.tokens("train")[: (steps * BPTT + 1) * BSZ + BSZ]
    train_data = batchify(torch.from_numpy(ids.astype(np.int64)), BSZ)  # (len / BSZ, BSZ)
    data = train_data.numpy()
    xs = np.stack([data[i:i + BPTT] for i in range(0, steps * BPTT, BPTT)])
    ys = np.stack([data[i + 1:i + 1 + BPTT] for i in range(0, steps * BPTT, BPTT)])

    torch.manual_seed(0)
    net = RNNModel(NTOKEN, EMSIZE, NHID, NLAYERS).to(tdtype)
    model = models.LSTMLM(NTOKEN, EMSIZE, NHID, NLAYERS, dropout=0.0, dtype=jdtype)
    sd0 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    params0 = funcnet.load_state_dict(model.init(jax.random.key(0)), sd0)
    # the one JAX-side weight perturb shifts: an entry of the tied embedding / decoder row of " "
    space = int(text.vocabulary().encode(" ")[0])
    params0["encoder"]["weight"] = params0["encoder"]["weight"].at[space, 0].add(opts.perturb)
    hidden0 = models.init_hidden(NLAYERS, BSZ, NHID, jdtype)

    # two chunks in one backward, with and without the cut between them; the first chunk's outputs
    chunks_t = [get_batch(train_data, i) for i in (0, BPTT)]
    chunks_j = [(jnp.asarray(xs[k]), jnp.asarray(ys[k])) for k in range(2)]
    t_cut, t_first = {}, None
    for truncate in (True, False):
        hidden = net.init_hidden(BSZ)
        total = 0.0
        for x, y in chunks_t:
            hidden = repackage_hidden(hidden) if truncate else hidden
            output, hidden = net(x, hidden)
            t_first = (output.detach(), tuple(h.detach() for h in hidden)) if t_first is None else t_first
            total = total + F.nll_loss(output, y)
        total.backward()
        t_cut[truncate] = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
        net.zero_grad(set_to_none=True)
    truncated, full, (out_j, (h_j, c_j)) = jax.jit(funcnet_chunks_grads, static_argnums=0)(
        model, params0, hidden0, chunks_j)
    j_cut = {True: funcnet.state_dict(truncated), False: funcnet.state_dict(full)}
    w = "rnn.weight_hh_l0"  # the recurrent weight: where backprop through the first chunk shows
    cut_moves = float((t_cut[True][w] - t_cut[False][w]).abs().max())

    # training: truncated BPTT, plain SGD after clipping, the example's lr 20 and clip 0.25
    t_losses, t_sec = timed(torch_train, net, train_data, steps)
    tx = optax.chain(gpt.clip_grad_norm(CLIP), optax.sgd(LR))
    train = funcnet_trainer(model, tx)
    (params_j, _, j_losses), j_sec = timed(train, params0, hidden0, jnp.asarray(xs), jnp.asarray(ys))
    t_final = {k: v.detach() for k, v in net.state_dict().items()}
    j_final = funcnet.state_dict(params_j)

    # the Python loop over time against the fused / scanned LSTM (layer 0 of the trained weights),
    # and the compile time of each as the sequence grows
    torch_rnn = {k.split(".", 1)[1]: jnp.asarray(v.numpy()) for k, v in t_final.items() if k.startswith("rnn.")}
    compiled = {n: compile_loop_and_scan(torch_rnn, n) for n in compile_lengths}
    c_loop = [compiled[n][1][0] for n in compile_lengths]
    c_scan = [compiled[n][1][1] for n in compile_lengths]
    T_CHECK = compile_lengths[1]
    emb_np = np.random.default_rng(0).standard_normal((T_CHECK, BSZ, EMSIZE)).astype(opts.dtype)
    h1 = tuple(h[:1] for h in hidden0)
    loop_j, scan_j = (f(jnp.asarray(emb_np), h1) for f in compiled[T_CHECK][0])
    cell_t, fused_t = tnn.LSTMCell(EMSIZE, NHID).to(tdtype), tnn.LSTM(EMSIZE, NHID).to(tdtype)
    with torch.no_grad():
        for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell_t, n).copy_(getattr(net.rnn, f"{n}_l0"))
            getattr(fused_t, f"{n}_l0").copy_(getattr(net.rnn, f"{n}_l0"))
        zeros = tuple(h[:1] for h in net.init_hidden(BSZ))
        loop_t, _ = torch_cell_loop([cell_t], torch.from_numpy(emb_np), zeros)
        fused_out, _ = fused_t(torch.from_numpy(emb_np), zeros)

    # step time, one TBPTT step (forward, backward, clip, SGD) on BPTT x BSZ, as ratios to funcnet's
    # (funcnet: the steady, warm call of the whole scanned run, per step)
    x1, y1 = train_data[:BPTT], train_data[1:BPTT + 1].reshape(-1)
    torch.manual_seed(0)
    timing_net = RNNModel(NTOKEN, EMSIZE, NHID, NLAYERS).to(tdtype)
    loop_cells = [tnn.LSTMCell(EMSIZE if k == 0 else NHID, NHID).to(tdtype) for k in range(NLAYERS)]
    loop_params = list(timing_net.encoder.parameters()) + [timing_net.decoder.bias] + \
        [p for c in loop_cells for p in c.parameters()]

    def torch_step(forward, params):
        def step():
            for p in params:
                p.grad = None
            F.nll_loss(forward(), y1).backward()
            tnn.utils.clip_grad_norm_(params, CLIP)
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-LR)
        return step

    def fused_forward():
        return timing_net(x1, timing_net.init_hidden(BSZ))[0]

    def loop_forward():
        out, _ = torch_cell_loop(loop_cells, timing_net.encoder(x1), timing_net.init_hidden(BSZ))
        return F.log_softmax(timing_net.decoder(out).view(-1, NTOKEN), dim=1)

    funcnet_step = (j_sec.steady if j_sec.steady is not None else float(j_sec) - j_sec.compile) / steps
    times = {
        "torch eager, Python loop of LSTMCell": _per_step(torch_step(loop_forward, loop_params)),
        "torch eager, fused nn.LSTM": _per_step(torch_step(fused_forward, list(timing_net.parameters()))),
        f"funcnet, jit + lax.scan ({steps} steps a call)": funcnet_step,
    }

    tol = opts.tol
    if opts.dtype == "float32":
        # SGD at lr 20 moves each weight by up to 20 * 0.25 per step, so a 1e-7 relative rounding
        # difference of a gradient is a 5e-6 absolute difference of a weight; the curves agree to
        # ~1e-5 over 40 steps (measured), and a 1e-3 shift of one embedding entry moves them by 1e-3
        curve_tol, param_tol = {"rtol": 1e-4, "atol": 1e-4}, {"rtol": 1e-4, "atol": 1e-4}
        why = f"float32 over {steps} SGD steps at lr {LR:g}: rounding differences grow with the steps"
        step0 = {"rtol": 1e-5, "atol": 1e-6}
    else:
        curve_tol = param_tol = step0 = tol
        why = f"float64 over {steps} SGD steps: reassociated sums only"
    checks = [
        equal("state_dict keys in torch's order, both tied keys included",
              list(funcnet.state_dict(params0, model=model)), list(sd0)),
        close("first batch log-probabilities (T*B, vocab): funcnet == torch", out_j.reshape(-1, NTOKEN),
              t_first[0], **step0, why="same weights, same batch"),
        close("first batch final hidden h_n: funcnet == torch", h_j, t_first[1][0], **step0),
        close("first batch final cell state c_n: funcnet == torch", c_j, t_first[1][1], **step0),
        *[close(f"two chunks, cut between them (stop_gradient == hidden.detach()): gradient of {k}", j_cut[True][k],
                g, **step0, why="the tied weight: the sum over the embedding and the decoder in both"
                if "encoder" in k else "the second chunk's loss reaches only its own steps")
          for k, g in t_cut[True].items()],
        *[close(f"two chunks, no cut (backprop through both): gradient of {k}", j_cut[False][k], g, **step0)
          for k, g in t_cut[False].items()],
        expect("the cut changes the gradient (by far more than the frameworks differ)",
               cut_moves > 10 * step0["atol"],
               f"max |truncated - full| of d loss / d {w} = {cut_moves:.2e} in torch, over 10x the atol "
               f"{step0['atol']:g} the frameworks' gradients meet"),
        raises("torch without repackage_hidden: the second backward reaches the freed first graph",
               lambda: torch_no_detach(RNNModel(NTOKEN, EMSIZE, NHID, NLAYERS).to(tdtype), train_data),
               RuntimeError, "backward through the graph a second time"),
        close(f"training loss per TBPTT step ({steps} steps): funcnet == torch", j_losses, t_losses, **curve_tol,
              why=why),
        *[close(f"final {k}: funcnet == torch", j_final[k], t_final[k], **param_tol, why=why) for k in t_final],
        close(f"torch: Python loop of LSTMCell == fused nn.LSTM ({T_CHECK} steps)", loop_t, fused_out, **step0,
              why="the same math; the fused kernel orders its sums its own way"),
        close(f"funcnet: Python loop of nn.LSTMCell (unrolled by jit) == nn.LSTM (one lax.scan), {T_CHECK} steps",
              loop_j, scan_j, **step0),
        close("funcnet nn.LSTM == torch nn.LSTM on torch's trained weights", scan_j, fused_out, **step0),
        expect("compile time of the unrolled loop grows with the sequence, the scan's does not",
               c_loop[-1] / c_loop[0] > 2 * c_scan[-1] / c_scan[0] and c_loop[-1] > 2 * c_scan[-1],
               "seconds to trace + compile one layer's forward at T = " + ", ".join(map(str, compile_lengths)) +
               ": loop " + ", ".join(f"{s:.2f}" for s in c_loop) + "; scan " + ", ".join(f"{s:.2f}" for s in c_scan)
               + " (bars: the loop's growth from first to last over twice the scan's, and the loop over twice "
                 "the scan at the longest; wall times, so ratios of ratios on a loaded machine)"),
    ]
    t_np, j_np = np.asarray(t_losses, np.float64), np.asarray(j_losses, np.float64)
    shown = [0, 1, steps // 2, steps - 1]
    n_params = sum(p.numel() for p in net.parameters())
    t_out = "\n".join([
        f"RNNModel(LSTM, ntoken {NTOKEN}, emsize {EMSIZE}, nhid {NHID}, nlayers {NLAYERS}, tied): {n_params} params",
        f"truncated BPTT {BPTT} x batch {BSZ}, clip_grad_norm_({CLIP}), SGD lr {LR:g}, {steps} steps:",
        *[f"  step {s:3d}: loss {t_np[s]:.6f}" for s in shown],
        "step time (forward + backward + clip + SGD, warm, one thread), ratio to funcnet's jit + lax.scan:",
        *[f"  {name:44s} {1e3 * s:7.2f} ms  x{s / funcnet_step:.2f}" for name, s in times.items()],
    ])
    j_out = "\n".join([
        f"funcnet.models.LSTMLM: {sum(a.size for a in jax.tree.leaves(params0))} params (one tied array)",
        "one lax.scan over the batches, hidden carried under stop_gradient:",
        *[f"  step {s:3d}: loss {j_np[s]:.6f}" for s in shown],
        f"max |funcnet - torch| over the curve: {np.abs(j_np - t_np).max():.1e}",
        "compile (trace + XLA) of one LSTM layer's forward, by sequence length:",
        *[f"  T = {n:4d}: Python loop unrolled {lo:6.2f} s   lax.scan {sc:5.2f} s"
          for n, lo, sc in zip(compile_lengths, c_loop, c_scan)],
    ])
    notes = ("torch's loss.backward() walks the graph recorded during the forward, so the hidden state carried to "
             "the next batch must be detached or the next backward reaches into a freed graph; in JAX the carry is "
             "a value, and stop_gradient says where a differentiated function stops (checked with two chunks in "
             "one backward). Dropout is 0 so both sides are deterministic. Step times are of warm calls on one "
             "thread; funcnet's is the warm scanned run divided by its steps. torch.compile is left out: compiling "
             "this model's step took 106 s on a loaded 2-core machine, beyond this comparison's budget.")
    return Result(
        name="recurrent", title=TITLE,
        torch=Side(source(RNNModel, batchify, get_batch, repackage_hidden, torch_train, torch_no_detach,
                          torch_cell_loop), t_out, t_sec),
        jax=Side(source(models.LSTMLM, funcnet_trainer, funcnet_chunks_grads, funcnet_cell_loop, compile_loop_and_scan),
                 j_out, j_sec),
        checks=checks, notes=notes,
        series={"training loss per TBPTT step": {"torch": t_np.tolist(), "funcnet": j_np.tolist()},
                "compile seconds of one LSTM layer's forward by sequence length": {
                    "Python loop (unrolled)": c_loop, "lax.scan": c_scan}},
    )
