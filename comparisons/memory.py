"""Training memory = params + grads + optimizer state + activations, counted both ways.

The articles' estimate for a 7B model with Adam in float32: params 7B x 4 bytes =
28 GB, grads 28 GB, Adam's two moments 56 GB, activations 20-50 GB, so about
132-162 GB. Here the same four parts are counted on a real MLP (784-512-512-10,
batch 256, Adam): PyTorch counts the tensors it holds after one step (parameters,
``.grad``, ``optimizer.state``, and what autograd saved for backward, through
``saved_tensors_hooks``); JAX counts them from shapes alone (``jax.eval_shape``,
nothing allocated) and XLA reports the compiled step's buffers before it runs.
On a GPU torch's measured figure would be ``torch.cuda.max_memory_allocated()``;
on this CPU torch has no allocator statistics, so its side counts tensors.
"""

from __future__ import annotations

import math


from comparisons._core import Options, Result, Side, equal, expect, source, timed

TITLE = "Memory: params + grads + optimizer state + activations; the 7B table; estimate vs XLA's measure"

SIZES = [784, 512, 512, 10]
BATCH = 256


def torch_memory(sizes, batch):
    import torch

    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [torch.nn.Linear(fan_in, fan_out)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, sizes[0]), torch.randint(0, sizes[-1], (batch,))

    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):  # every tensor autograd keeps for backward; parameters are not activations
        storage = t.untyped_storage()
        if t.is_floating_point() and t.dim() > 0 and storage.data_ptr() not in param_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    return {
        "params": nbytes(model.parameters()),
        "grads": nbytes(p.grad for p in model.parameters()),
        "optimizer": nbytes(t for s in opt.state.values() for k, t in s.items() if k != "step"),
        "step counters": nbytes(s["step"] for s in opt.state.values()),  # one per parameter tensor
        "activations": sum(saved.values()),
        "cuda peak": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }


def jax_memory(sizes, batch):
    import jax
    import optax

    from funcnet import memory, nn, train

    model, tx = nn.MLP(sizes), optax.adam(1e-3)
    # shapes only: the estimate and XLA's analysis need no memory of their own
    state = jax.eval_shape(lambda k: train.create_train_state(model, tx, k), jax.random.key(0))
    x = jax.ShapeDtypeStruct((batch, sizes[0]), jax.numpy.float32)
    y = jax.ShapeDtypeStruct((batch,), jax.numpy.int32)
    counted = memory.estimate_tree(state.params, tx, activations=memory.mlp_activations(sizes, batch))
    moments = [leaf for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim > 0]
    return {
        "estimate": memory.estimate(memory.mlp_params(sizes), "adam", sizes=sizes, batch=batch),
        "counted": counted,
        "optimizer": memory.tree_bytes(moments),
        "step counters": counted.optimizer - memory.tree_bytes(moments),  # optax: one count for all
        "measured": memory.measure(train.make_step(model, tx), state, (x, y)),  # donates the old state
        "measured, no donation": memory.measure(train.make_step(model, tx, donate=False), state, (x, y)),
    }


def _seven_b():
    from funcnet import memory

    fp32 = memory.estimate("7B", "adam")
    mixed = memory.estimate("7B", "adam", **memory.PRECISIONS["bf16"])
    low = memory.estimate("7B", "adam", activations=20 * 10**9)
    high = memory.estimate("7B", "adam", activations=50 * 10**9)
    return fp32, mixed, low, high


def run(opts: Options = Options()) -> Result:
    from funcnet import memory

    # perturb widens the JAX side's first hidden layer, so the two sides no longer count the same model
    jax_sizes = [SIZES[0], SIZES[1] + math.ceil(abs(opts.perturb))] + SIZES[2:]
    t, t_seconds = timed(torch_memory, SIZES, BATCH)
    j, j_seconds = timed(jax_memory, jax_sizes, BATCH)
    fp32, mixed, low, high = _seven_b()
    est, m = j["estimate"], j["measured"]
    n = 7 * 10**9
    checks = [
        equal("7B, Adam, float32: params / grads / Adam moments (bytes)",
              (fp32.params, fp32.grads, fp32.optimizer), (n * 4, n * 4, n * 8),
              why="the articles' 28 GB / 28 GB / 56 GB"),
        equal("7B with 20-50 GB of activations: total (bytes)", (low.total, high.total), (132 * 10**9, 162 * 10**9),
              why="the articles' 132-162 GB"),
        equal("params: torch numel x element_size == JAX tree bytes", j["counted"].params, t["params"]),
        equal("grads: torch .grad bytes == JAX grads (same tree)", j["counted"].grads, t["grads"]),
        equal("Adam moments: torch exp_avg + exp_avg_sq == optax mu + nu", j["optimizer"], t["optimizer"]),
        equal("Adam moments == closed form 2 x 4 bytes x n_params", j["optimizer"], est.optimizer),
        equal("activations: tensors torch's autograd saved == batch x sum(sizes) x 4", est.activations,
              t["activations"]),
        expect("estimate within 10% of XLA's measure of the donated step",
               abs(est.total / m.total - 1) <= 0.10,
               f"estimate {est.total:,} vs measured {m.total:,} bytes ({est.total / m.total - 1:+.1%})"),
        expect("without donation the step needs more memory (no in-place update)",
               j["measured, no donation"].total > m.total,
               f"{j['measured, no donation'].total:,} vs {m.total:,} bytes donated"),
    ]
    torch_out = "\n".join(f"{k}: {v:,} bytes" if isinstance(v, int) else f"{k}: {v} (no CUDA device)"
                          for k, v in t.items())
    jax_out = (f"estimate (closed form): {est.as_dict()}\n"
               f"optax moments: {j['optimizer']:,} bytes; step counters: {j['step counters']} bytes\n"
               f"XLA, donated step: {m.as_dict()}\n"
               f"XLA, no donation: total {j['measured, no donation'].total:,} bytes")
    notes = (
        "7B, Adam, float32 (funcnet memory --params 7B):\n"
        + "  ".join(f"{k} {v / 1e9:.0f} GB" for k, v in fp32.as_dict().items() if v)
        + f"\n7B, Adam, bf16 params/grads + float32 master and state: total {mixed.total / 1e9:.0f} GB "
        "(mixed precision saves activation memory, not parameter/optimizer memory)\n"
        f"7B + 20 GB / 50 GB activations: {low.total / 1e9:.0f} / {high.total / 1e9:.0f} GB\n"
        "torch keeps a step counter tensor per parameter tensor; optax keeps one count for all.\n"
        f"XLA's total = arguments + outputs + temps - aliased; x is an argument and is counted with the "
        f"activations in the estimate. MLP {'-'.join(map(str, jax_sizes))}, batch {BATCH}, "
        f"{memory.mlp_params(jax_sizes):,} params."
    )
    return Result(
        name="memory", title=TITLE,
        torch=Side(source(torch_memory), torch_out, t_seconds),
        jax=Side(source(jax_memory), jax_out, j_seconds),
        checks=checks, notes=notes,
    )
