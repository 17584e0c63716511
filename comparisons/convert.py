"""Your own torch model, converted: nanoGPT's forward traced into funcnet, and its optimizer with it.

torch: the nanoGPT model of the ``gpt`` comparison (its own ``forward`` in every class:
``b, t = idx.size()``, an ``assert``, ``torch.arange``, a loop over ``self.transformer.h``,
``split`` / ``view`` / ``transpose``, weight tying), trained with AdamW in two param groups
(decay on the matrices only), ``clip_grad_norm_`` and a warmup + cosine schedule written with
torch's own schedulers. funcnet: nobody writes the model: ``interop.convert(net, x)`` records
the forward on real tensors and returns ``(model, params, state)``; ``interop.to_source`` writes
the same model as readable funcnet source (shown on the right); ``interop.convert_optimizer``
turns the optimizer and its scheduler into one optax transformation, group by group. The run
must agree with torch step by step, and what cannot be converted is refused with its line.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

import funcnet
from funcnet import gpt, interop, text
from comparisons._core import Options, Result, Side, close, dtypes, equal, expect, one_torch_thread, raises, timed
from comparisons.gpt import CONFIG, TorchGPT, funcnet_train, funcnet_trainer, torch_train

__all__ = ["TITLE", "run", "torch_optimizer"]

TITLE = "Your own torch model, converted: interop.convert traces nanoGPT, to_source writes the port"

STEPS, BATCH = 50, 8
LR, MIN_LR, WD, BETAS, WARMUP, CLIP = 1e-3, 1e-4, 0.1, (0.9, 0.95), 10, 1.0


def torch_optimizer(net, steps):
    """nanoGPT's AdamW groups, its warmup + cosine as torch's own schedulers (SequentialLR)."""
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / (WARMUP + 1), total_iters=WARMUP)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - WARMUP, eta_min=MIN_LR)
    return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[WARMUP])


class _Branchy(TorchGPT):
    """nanoGPT with a branch on the data: what tracing cannot carry into a compiled function."""

    def forward(self, idx):
        logits = super().forward(idx)
        if logits.abs().max() > 100:  # a Python branch on a tensor's value
            logits = logits / 2
        return logits


def run(opts: Options = Options(), *, steps: int = STEPS) -> Result:
    with one_torch_thread():  # tiny ops: extra OpenMP threads only wait on each other
        return _run(opts, steps)


def _run(opts: Options, steps: int) -> Result:
    tdtype, _ = dtypes(opts)
    (x_train, y_train), _ = text.load_text(CONFIG.block_size, key=jax.random.key(0))
    xb = x_train[: steps * BATCH].reshape(steps, BATCH, CONFIG.block_size)
    yb = y_train[: steps * BATCH].reshape(steps, BATCH, CONFIG.block_size)
    batches = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) for x, y in zip(xb, yb)]
    x0 = batches[0][0]

    torch.manual_seed(0)
    net = TorchGPT(CONFIG).to(tdtype)
    sd0 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    (model, params, state), convert_sec = timed(interop.convert, net, x0, steady=False)
    port, source_sec = timed(interop.to_source, net, x0, steady=False)
    wte = params["transformer"]["wte"]  # the tied array (lm_head.weight is an nn.Tied to it)
    wte["weight"] = wte["weight"].at[0, 0].add(opts.perturb)
    opt, sched = torch_optimizer(net, steps)
    tx = interop.convert_optimizer(opt, sched, params, module=net)

    # the written port: executed, torch's state_dict loaded strictly, the same logits
    namespace: dict = {}
    exec(compile(port, "<to_source>", "exec"), namespace)  # noqa: S102 (the generated module)
    ported = namespace["TorchGPT"]()
    ported_params = funcnet.load_state_dict(ported.init(jax.random.key(0)), sd0)

    # forward and gradients from the initial weights on the first batch
    logits_t = net(x0)
    F.cross_entropy(logits_t.view(-1, logits_t.size(-1)), batches[0][1].view(-1)).backward()
    t_grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    logits_j = jax.jit(model.apply)(params, jnp.asarray(xb[0]))
    logits_port = jax.jit(ported.apply)(ported_params, jnp.asarray(xb[0]))
    loss = lambda p: funcnet.losses.cross_entropy(model.apply(p, jnp.asarray(xb[0])), jnp.asarray(yb[0]))  # noqa: E731
    j_grads = funcnet.state_dict(jax.jit(jax.grad(loss))(params))

    # training: torch's loop with its optimizer, clipping and scheduler; funcnet's make_step in a scan
    (t_losses, t_lrs, _), t_sec = timed(torch_train, net, opt, sched, batches, CLIP)
    tx = _clipped(tx)
    train = funcnet_trainer(model, tx)
    (trained, j_losses), j_sec = timed(funcnet_train, train, model, params, tx, jnp.asarray(xb), jnp.asarray(yb))

    t_final = {k: v.detach() for k, v in net.state_dict().items()}
    j_final = funcnet.state_dict(trained.params)
    if opts.dtype == "float32":
        # as in the gpt comparison: AdamW turns ~1e-7 rounding differences of small gradient
        # components into differences of whole updates, so the curves drift apart slowly
        curve_tol, param_tol = {"rtol": 1e-5, "atol": 1e-4}, {"rtol": 1e-4, "atol": 2e-4}
        step0 = {"rtol": 1e-5, "atol": 1e-6}
    else:
        curve_tol = param_tol = step0 = opts.tol
    why = f"{opts.dtype} over {steps} AdamW steps: rounding differences grow with the steps"
    grad_scale = max(float(g.abs().max()) for g in t_grads.values())
    grad_diff = max(float(np.max(np.abs(np.asarray(j_grads[k], np.float64) - g.numpy().astype(np.float64))))
                    for k, g in t_grads.items())
    lines_t = sum(len(_source_lines(c)) for c in _classes(net))
    lines_j = len([line for line in port.splitlines() if line.strip()])

    checks = [
        equal("state_dict keys in torch's order, both tied keys included",
              list(funcnet.state_dict(params, state, model=model)), list(sd0),
              why="every child named as its torch attribute"),
        equal("the tie stays one array", len(jax.tree.leaves(params)), len(list(net.parameters())),
              why="lm_head.weight is transformer.wte.weight in torch; nn.Tied in funcnet"),
        close("logits from the initial weights: convert(net, x) == torch", logits_j, logits_t.detach(), **step0),
        close("logits: the source to_source wrote, torch's state_dict loaded strictly == torch", logits_port,
              logits_t.detach(), **step0, why="the port is a plain funcnet module, no interop at run time"),
        expect("gradients at step 0: jax.grad of the converted model == torch backward",
               grad_diff <= step0["atol"] + step0["rtol"] * grad_scale,
               f"largest difference {grad_diff:.2e} over every parameter (largest gradient {grad_scale:.2e})"),
        close(f"training loss per step ({steps} steps, converted AdamW groups + SequentialLR): funcnet == torch",
              j_losses, t_losses, **curve_tol, why=why),
        *[close(f"final {k}: funcnet == torch", j_final[k], t_final[k], **param_tol, why=why) for k in t_final],
        raises("a branch on a tensor's value is refused, naming the line", lambda: interop.convert(
            _Branchy(CONFIG).to(tdtype), x0), interop.ConversionError, "Tensor.__bool__"),
        raises("nanoGPT's LambdaLR of math.cos cannot trace: refused, naming jnp's replacement",
               lambda: interop.convert_optimizer(*_lambda_optimizer(net), params, module=net), Exception, "jnp"),
        expect("the port is about as long as the torch source", lines_j <= 1.2 * lines_t,
               f"{lines_j} lines written for {lines_t} lines of torch classes (non-blank)"),
    ]
    t_np = t_losses.numpy().astype(np.float64)
    shown = [0, 1, steps // 2, steps - 1]
    t_out = "\n".join([
        f"TorchGPT: {sum(p.numel() for p in net.parameters())} params, its own forward in 4 classes",
        f"AdamW(2 groups, wd {WD} on the matrices) + clip_grad_norm_({CLIP}) + SequentialLR(LinearLR warmup "
        f"{WARMUP}, CosineAnnealingLR), {steps} steps:",
        *[f"  step {s:3d}: loss {t_np[s]:.6f}  lr {t_lrs[s]:.2e}" for s in shown],
    ])
    j_np = np.asarray(j_losses, dtype=np.float64)
    j_out = "\n".join([
        f"interop.convert(net, x): {model.name}, {len(jax.tree.leaves(params))} arrays, traced in "
        f"{float(convert_sec):.2f} s; to_source wrote {lines_j} lines",
        "interop.convert_optimizer(opt, sched, params, module=net), clipped as torch's loop clips:",
        *[f"  step {s:3d}: loss {j_np[s]:.6f}" for s in shown],
    ])
    return Result(
        name="convert", title=TITLE,
        torch=Side(source=_torch_source(), output=t_out, seconds=float(t_sec)),
        jax=Side(source=_shown(port), output=j_out, seconds=float(j_sec), compile_seconds=j_sec.compile,
                 steady_seconds=j_sec.steady),
        checks=checks,
        notes="The torch model is the gpt comparison's, untouched: convert records its forward once per mode on "
              "the example batch (a TorchFunctionMode sees every torch call; hooks keep one graph per module), "
              "sizes stay symbolic (any batch and length up to block_size), and each class becomes an "
              "nn.Composite whose children carry torch's names, so torch's state_dict loads as is.",
    )


def _clipped(tx):
    # torch's loop clips before optimizer.step(); funcnet's chain does the same, first
    import optax

    return optax.chain(gpt.clip_grad_norm(CLIP), tx)


def _lambda_optimizer(net):
    from comparisons.gpt import torch_optimizer as nanogpt_optimizer

    return nanogpt_optimizer(net, LR, WD, BETAS, WARMUP, STEPS, MIN_LR)


def _classes(net):
    seen = []
    for m in net.modules():
        if type(m).__module__ == TorchGPT.__module__ and type(m) not in seen:
            seen.append(type(m))
    return seen


def _source_lines(cls) -> list[str]:
    import inspect

    return [line for line in inspect.getsource(cls).splitlines() if line.strip()]


def _torch_source() -> str:
    import inspect

    net_classes = _classes(TorchGPT(CONFIG))
    return "\n\n".join(inspect.getsource(c).rstrip() for c in net_classes) + "\n\n" + inspect.getsource(
        torch_optimizer).rstrip()


def _shown(port: str) -> str:
    return port.rstrip() + "\n\n# model, params, state = interop.convert(net, x)\n" \
        "# tx = interop.convert_optimizer(opt, sched, params, module=net)"
