"""A GPT-2-small-shaped transformer on the CPU: funcnet's GPT and the converted transformers model against torch.

    python benchmarks/gpt_small.py [--single-thread] [--cpu-time] [--compile] [--seq 256] [--batch 1]
                                   [--rounds 3] [--dtypes fp32 bf16] [--quick] [--json out.json]

The model is GPT-2 small's shape (12 layers, 768 wide, 12 heads, vocabulary 50257, 1024
positions; ``--seq`` up to 1024 tokens per sequence), built three ways from one set of random
weights (no download):

- ``torch``: transformers' ``GPT2LMHeadModel`` from a ``GPT2Config`` (exact erf GELU, dropout
  off), timed eager and, with ``--compile``, under ``torch.compile`` (the same module, so the
  same parameters);
- ``converted``: that module converted by ``funcnet.interop.convert``;
- ``funcnet GPT``: ``funcnet.gpt.GPT`` (nanoGPT's layout) with the same weights loaded
  (transformers' ``Conv1D`` weights transposed into ``Linear``'s).

Each is timed on the forward (eval, the mean cross entropy of the next-token logits) and on
a train step (forward, backward, AdamW with torch's defaults on both sides), in float32 and
in bf16: ``torch.autocast(dtype=bfloat16)`` on torch's side, funcnet's ``"bf16"`` mixed-precision
policy (float32 master weights, a bf16 copy for the forward and backward) on ours.

Before any timing the three float32 losses are compared on a batch the converted model was not
traced on (a difference beyond float32's rounding fails the run, exit 1), and the bf16 losses
against the float32 one within bf16's rounding.

Model FLOPs (nanoGPT's ``estimate_mfu``, PaLM's appendix B): N = the parameters without the
position embedding (the tied token embedding counts once, as the LM head's matmul), per token
``6 N + 12 L T C`` for a train step and ``2 N + 4 L T C`` for the forward (L layers, T tokens
per sequence, C width; the attention term counts the full T x T score and value matmuls, as
the formula does, though a causal kernel may skip half). The fraction of peak divides the
model FLOPs per second by the best measured matmul rate of this CPU in the same dtype (a
large square matmul timed in the same run, jnp and torch, on the same threads): what this
machine's matmul units actually deliver, not a datasheet number. Where JAX runs on a GPU
(``benchmarks/device_check.sh``) each row is held to its own device's rate: funcnet's rows to
the GPU's matmul, torch's (this script's torch is the CPU build) to the CPU's.

Times are medians of interleaved rounds (``benchmarks/conv.py``'s ``interleaved``), forward
and train step each in their own rounds; ratios are torch eager's time over each row's (above
one: faster than torch eager), measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab": 50257, "positions": 1024}
QUICK = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab": 512, "positions": 64}
DTYPES = ("fp32", "bf16")
LR, WEIGHT_DECAY = 1e-4, 0.01  # torch.optim.AdamW's default decay; betas (0.9, 0.999), eps 1e-8 on both sides


def model_flops(n_params: int, n_layer: int, n_embd: int, seq: int, tokens: int, train: bool) -> float:
    """nanoGPT's per-token count times the tokens: (6 N + 12 L T C) for a train step, (2 N + 4 L T C)
    for a forward."""
    per_token = (6 if train else 2) * n_params + (12 if train else 4) * n_layer * seq * n_embd
    return float(per_token * tokens)


def hf_config(shape: dict):
    import transformers

    return transformers.GPT2Config(vocab_size=shape["vocab"], n_positions=shape["positions"], n_embd=shape["n_embd"],
                                   n_layer=shape["n_layer"], n_head=shape["n_head"], activation_function="gelu",
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                   bos_token_id=0, eos_token_id=0)


def funcnet_gpt(shape: dict, hf_module):
    """funcnet.gpt.GPT of the same shape with ``hf_module``'s weights (Conv1D's (in, out) weights transposed)."""
    import jax

    from funcnet import gpt, load_state_dict

    config = gpt.GPTConfig(block_size=shape["positions"], vocab_size=shape["vocab"], n_layer=shape["n_layer"],
                           n_head=shape["n_head"], n_embd=shape["n_embd"], dropout=0.0, bias=True)
    model = gpt.GPT(config)
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    sd = {k: (v.t() if k.endswith(conv1d) else v).detach().contiguous()
          for k, v in hf_module.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    params = load_state_dict(jax.eval_shape(model.init, jax.random.key(0)), sd)
    return model, params, gpt.num_params(params)


def matmul_peak(n: int, rounds: int, interleaved) -> dict:
    """FLOP/s of an n x n @ n x n matmul, jnp (jit) and torch, float32 and bf16 (and jnp's bf16 summed into
float32), in interleaved rounds."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, n, n)).astype(np.float32)
    mm = jax.jit(jnp.matmul)
    runners = {}
    for name, dt, tdt in (("fp32", jnp.float32, torch.float32), ("bf16", jnp.bfloat16, torch.bfloat16)):
        ja, jb = jnp.asarray(a, dt), jnp.asarray(b, dt)
        ta, tb = torch.from_numpy(a).to(tdt), torch.from_numpy(b).to(tdt)
        runners[f"jnp {name}"] = lambda ja=ja, jb=jb: mm(ja, jb)
        runners[f"torch {name}"] = lambda ta=ta, tb=tb: torch.mm(ta, tb)
    # bf16 inputs summed into a float32 result (preferred_element_type): XLA:CPU keeps this dot in
    # bf16, where a bf16-result dot is rewritten as a float32 one with conversions around it
    wide = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    ja, jb = jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)
    runners["jnp bf16 into fp32"] = lambda: wide(ja, jb)
    ms = interleaved(runners, rounds, 1, min_ms=100.0)
    rate = {k: 2.0 * n ** 3 / (v / 1e3) for k, v in ms.items()}
    return {"n": n, "ms": ms, "flops_per_s": rate, "gflops_per_s": {k: v / 1e9 for k, v in rate.items()}}


def _peak(peak: dict, dtype: str, torch_row: bool) -> float:
    """The matmul rate a row is held to: on a CPU the best of jnp's and torch's in its dtype (one
    machine); with an accelerator, its own device's (JAX's there, torch's on the CPU)."""
    import jax

    rates = peak["flops_per_s"]
    if jax.default_backend() == "cpu":
        return max(v for k, v in rates.items() if k.split()[1] == dtype)
    return max(v for k, v in rates.items() if k.split()[:2] == ["torch" if torch_row else "jnp", dtype])


def _torch_runners(module, run, x, y, autocast: bool, opt):
    import torch

    def loss_of(idx, tgt):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = run(input_ids=idx).logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())

    def forward():
        module.eval()
        with torch.no_grad():
            return loss_of(x, y)

    def train_step():
        module.train()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss

    return forward, train_step, loss_of


def _funcnet_runners(model, params, x, y, logits_of, policy):
    """Forward loss (eval, jit) and a make_step train step (AdamW, ``policy``) of a funcnet model."""
    import jax
    import optax

    from funcnet import losses, nn, precision, train

    pol = None if policy is None else precision.get_policy(policy)

    def loss_fn(out, tgt):
        return losses.cross_entropy(logits_of(out).astype("float32"), tgt)

    @jax.jit
    def forward(p, x, y):
        if pol is not None:
            p, x = pol.cast_to_compute((p, x))
        return loss_fn(nn.call(model, p, {}, x, train=False)[0], y)

    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    step = train.make_step(model, tx, loss_fn, policy=policy, metrics=lambda out, tgt: {})
    state = [train.create_train_state(model, tx, jax.random.key(0), params=params, policy=policy)]

    def train_step():
        state[0], metrics = step(state[0], (x, y))
        return metrics["loss"]

    # the forward reads the train state's params (the latest ones): one copy of the weights per model
    return (lambda: forward(state[0].params, x, y)), train_step, forward


def run(args, console) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from conv import CLOCK, interleaved
    from conv_models import compile_unavailable
    from funcnet import interop

    shape = QUICK if args.quick else SMALL
    seq, batch = args.seq, args.batch
    if not 1 <= seq <= shape["positions"]:
        raise SystemExit(f"gpt_small: --seq {seq} is outside the model's 1..{shape['positions']} positions; "
                         f"pass --seq between 1 and {shape['positions']}")
    torch.manual_seed(0)
    module = transformers.GPT2LMHeadModel(hf_config(shape))
    module.eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, shape["vocab"], (batch, seq + 1))
    fresh = rng.integers(0, shape["vocab"], (batch, seq + 1))  # the check's batch: not the one traced
    x, y = ids[:, :-1], ids[:, 1:]
    tx_, ty_ = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
    jx, jy = jnp.asarray(x, jnp.int32), jnp.asarray(y, jnp.int32)
    fx, fy = jnp.asarray(fresh[:, :-1], jnp.int32), jnp.asarray(fresh[:, 1:], jnp.int32)
    tfx, tfy = torch.from_numpy(fresh[:, :-1].copy()), torch.from_numpy(fresh[:, 1:].copy())

    t0 = time.perf_counter()
    converted, conv_params, _ = interop.convert(module, tx_)
    convert_s = time.perf_counter() - t0
    ours, ours_params, n_params = funcnet_gpt(shape, module)
    console.print(f"GPT-2-small shape {shape}, {n_params / 1e6:.1f}M parameters (nanoGPT's count), batch {batch} x "
                  f"{seq} tokens; converted in {convert_s:.1f} s")

    models = {"funcnet GPT": (ours, ours_params, lambda out: out),
              "converted": (converted, conv_params, lambda out: out["logits"])}
    why_not = compile_unavailable() if args.compile else "pass --compile"
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    compiled = torch.compile(module) if why_not is None else None

    # the same numbers first: float32 losses on a batch the converted model was not traced on
    _, _, torch_loss = _torch_runners(module, module, tx_, ty_, False, opt)
    _, _, torch_bf16 = _torch_runners(module, module, tx_, ty_, True, opt)
    with torch.no_grad():
        want = {"fp32": float(torch_loss(tfx, tfy)), "bf16": float(torch_bf16(tfx, tfy))}
    with torch.no_grad():
        top = float(module(input_ids=tfx).logits.abs().max())
    # The loss moves by at most twice the logits' largest error. float32: every matmul sums up to
    # 4C products (rounding ~ sqrt(4C) 2**-24 relative), 4 L + 1 of them in sequence (errors add
    # like a random walk); bf16: each matmul's inputs are rounded to bf16 (2**-8 relative), on both
    # sides in different places, so the bf16 losses are held to the float32 loss at that rounding.
    depth, width = 4 * shape["n_layer"] + 1, 4 * shape["n_embd"]
    tol = {"fp32": 2 * top * depth ** 0.5 * width ** 0.5 * 2.0 ** -24, "bf16": 2 * top * depth ** 0.5 * 2.0 ** -8}
    check, failed = {"torch": want, "max_abs_logit": top, "tolerance": tol}, False
    for name, (model, params, logits_of) in models.items():
        for dtype in DTYPES:
            _, _, fwd = _funcnet_runners(model, params, fx, fy, logits_of, None if dtype == "fp32" else "bf16")
            got = float(fwd(params, fx, fy))
            diff = abs(got - want["fp32"])
            ok = diff <= tol[dtype]
            failed |= not ok
            check[f"{name} {dtype}"] = {"loss": got, "diff_vs_torch_fp32": diff, "ok": bool(ok)}
            console.print(f"check {name} {dtype}: loss {got:.6f}, torch fp32 {want['fp32']:.6f} (torch bf16 "
                          f"{want['bf16']:.6f}), |diff| {diff:.2e} <= {tol[dtype]:.2e}: {'ok' if ok else 'WRONG'}")
            del fwd
    if failed:
        return {"check": check, "failed": True}

    # 2048: n**3 work enough for a CPU core's steady rate; a GPU needs a larger matmul to reach its rate
    peak = matmul_peak(256 if args.quick else 2048 if jax.default_backend() == "cpu" else 8192, args.rounds,
                       interleaved)
    console.print("matmul " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak["flops_per_s"].items()))
    rows = []
    tokens = batch * seq
    for dtype in args.dtypes:
        bf16 = dtype == "bf16"
        runners_f, runners_t = {}, {}
        for name, (model, params, logits_of) in models.items():
            runners_f[name], runners_t[name], _ = _funcnet_runners(model, params, jx, jy, logits_of,
                                                                   "bf16" if bf16 else None)
        runners_f["torch eager"], runners_t["torch eager"], _ = _torch_runners(module, module, tx_, ty_, bf16, opt)
        if compiled is not None:
            torch._dynamo.reset()
            compiled = torch.compile(module)
            runners_f["torch.compile"], runners_t["torch.compile"], _ = _torch_runners(module, compiled, tx_, ty_,
                                                                                     bf16, opt)
        for mode, runners in (("forward", runners_f), ("train", runners_t)):
            ms = interleaved(runners, args.rounds, 1)
            flops = model_flops(n_params, shape["n_layer"], shape["n_embd"], seq, tokens, mode == "train")
            for impl, t in ms.items():
                best = _peak(peak, dtype, torch_row=impl.startswith("torch"))
                row = {"impl": impl, "dtype": dtype, "mode": mode, "ms": t, "tokens_per_s": tokens / (t / 1e3),
                       "model_flops_per_s": flops / (t / 1e3), "model_gflops_per_s": flops / (t / 1e3) / 1e9,
                       "mfu": flops / (t / 1e3) / best,
                       "vs_torch_eager": ms["torch eager"] / t}
                rows.append(row)
                console.print(f"{dtype} {mode:<8} {impl:<14} {t:>10.1f} ms {row['tokens_per_s']:>9.0f} tok/s "
                              f"{row['model_flops_per_s'] / 1e9:>7.1f} GFLOP/s  MFU {row['mfu']:.3f}  "
                              f"torch eager / this {row['vs_torch_eager']:.2f}")
        del runners_f, runners_t
    if why_not is not None:
        console.print(f"torch.compile not timed: {why_not}")
    return {"shape": shape, "seq": seq, "batch": batch, "n_params": n_params, "tokens_per_step": tokens,
            "flops_formula": "train: (6 N + 12 L T C) per token; forward: (2 N + 4 L T C) per token; N = parameters "
                             "without the position embedding",
            "flops": {m: model_flops(n_params, shape["n_layer"], shape["n_embd"], seq, tokens, m == "train")
                      for m in ("forward", "train")},
            "matmul_peak": peak, "check": check, "rows": rows, "convert_s": convert_s,
            "torch_compile": "timed" if why_not is None else f"not timed: {why_not}",
            "clock": "CPU time" if CLOCK[0] is time.process_time else "wall time", "failed": False}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence (GPT-2 small: up to 1024)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--quick", action="store_true", help="a smoke run: a 2-layer, 64-wide model, one round")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (minutes per dtype)")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this process's CPU time, not wall time: steadier on a busy machine")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    for flag in ("seq", "batch", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.quick:
        args.seq, args.rounds = min(args.seq, QUICK["positions"]), 1
    from conv import CLOCK

    if args.cpu_time:
        CLOCK[0] = time.process_time
    if args.single_thread:
        from funcnet import profile

        profile.one_core()  # JAX and torch on one core, before JAX starts
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    import jax
    import torch
    from rich.console import Console

    if args.single_thread:
        torch.set_num_threads(1)
    console = Console(width=max(Console().width, 160))
    load = os.getloadavg()
    console.print(f"backend {jax.default_backend()}, torch {torch.__version__}, jax {jax.__version__}, "
                  f"single-thread {args.single_thread}, {'CPU' if args.cpu_time else 'wall'} time, "
                  f"load average {load[0]:.1f}")
    result = {"load_before": load, "single_thread": args.single_thread, "cpu_time": args.cpu_time,
              "backend": jax.default_backend(), **run(args, console)}
    result["load_after"] = os.getloadavg()
    console.print(f"load average after: {result['load_after'][0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if result["failed"]:
        console.print("gpt_small: a loss differs from torch's beyond its tolerance; nothing was timed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
