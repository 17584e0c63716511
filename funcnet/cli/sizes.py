"""``funcnet train``'s memory checks: a model whose training step cannot fit is refused before
anything is allocated, and an out-of-memory error at run time is one line; both name the flags
that size the model in use (never one it refuses)."""

from __future__ import annotations

import contextlib
import os

from funcnet.cli.errors import UsageError

__all__ = ["check_fits_in_memory", "lstm_activations", "out_of_memory_is_one_line", "size_flags"]

# the flags that set each model's size, as a user would reduce them
_SIZE_FLAGS = {
    "mlp": ("--hidden", "--batch-size"),
    "cnn": ("--batch-size",),
    "gpt": ("--n-layer", "--n-embd", "--block-size", "--batch-size"),
    "lstm": ("--n-layer", "--n-embd", "--block-size", "--batch-size"),
}
_REMAT = {None: "none", "paper": "none", "selective": "selective", "full": "full"}


def size_flags(model: str) -> str:
    """``"--n-layer, --n-embd, --block-size or --batch-size"``: what reduces ``model``'s memory."""
    flags = _SIZE_FLAGS[model]
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} or {flags[-1]}"


def lstm_activations(layers: int, hidden: int, vocab: int, seq: int, batch: int, *, bytes_per_value: int = 4,
                     logits_bytes: int = 4) -> int:
    """Bytes of the activations of one training step of an LSTM language model
    (``funcnet.models.LSTMLM``, embedding width ``hidden``), per token: the embedding ``h``;
    per layer what the backward keeps, the input projection ``4h``, the four gate activations
    ``4h``, the cell ``c``, ``tanh(c)`` and the output ``h``, and what it makes, the gradients
    of the projection ``4h`` and of the output ``h`` (``16h``); the logits, their log-softmax
    and its gradient ``3v`` in ``logits_bytes``: ``s b (p (h + 16 h L) + logits_bytes 3 v)``.
    XLA's own count for a compiled step is within a factor 1.5 of it (tests/test_cli_lm.py)."""
    return seq * batch * (bytes_per_value * (hidden + 16 * hidden * layers) + logits_bytes * 3 * vocab)


def _available() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def check_fits_in_memory(args, model=None, sizes=None, vocab: int | None = None) -> None:
    """Refuse, before anything is allocated, a model whose training step cannot fit in this
    machine's memory (CPU); on an accelerator, an out-of-memory error at run time says the same
    (``out_of_memory_is_one_line``). ``sizes``: the MLP's layer sizes; ``model`` and ``vocab``:
    the GPT's or LSTM's module (its parameters counted by shape) and vocabulary size."""
    import jax

    from funcnet import memory

    if jax.default_backend() != "cpu":
        return
    available = _available()
    if available is None:  # pragma: no cover - not POSIX
        return
    precision = memory.PRECISIONS[args.precision]
    same = f" --optimizer {args.optimizer} --precision {args.precision}"
    if args.model == "mlp":
        est = memory.estimate(memory.mlp_params(sizes), args.optimizer, sizes=sizes, batch=args.batch_size,
                              **precision)
        what = f"--hidden {' '.join(map(str, sizes[1:-1]))}"
        how = f"funcnet memory --sizes {','.join(map(str, sizes))} --batch {args.batch_size}"
    elif args.model == "gpt":
        est = memory.estimate(None, args.optimizer, layers=args.n_layer, hidden=args.n_embd, heads=args.n_head,
                              vocab=vocab, seq=args.block_size, batch=args.batch_size, recompute=_REMAT[args.remat],
                              dropout=False, **precision)
        what = (f"--model gpt with --n-layer {args.n_layer} --n-embd {args.n_embd} --block-size {args.block_size} "
                f"--batch-size {args.batch_size}")
        how = (f"funcnet memory --transformer --layers {args.n_layer} --hidden {args.n_embd} --heads {args.n_head} "
               f"--vocab {vocab} --seq {args.block_size} --batch {args.batch_size} --no-dropout --recompute "
               f"{_REMAT[args.remat]} --activation-dtype {precision['param_dtype']}{same}")
    elif args.model == "lstm":
        n_params = sum(leaf.size for leaf in jax.tree.leaves(jax.eval_shape(model.init, jax.random.key(0))))
        p = memory.dtype_bytes(precision["param_dtype"])
        acts = lstm_activations(args.n_layer, args.n_embd, vocab, args.block_size, args.batch_size,
                                bytes_per_value=p)
        est = memory.estimate(n_params, args.optimizer, activations=acts, **precision)
        what = (f"--model lstm with --n-layer {args.n_layer} --n-embd {args.n_embd} --block-size {args.block_size} "
                f"--batch-size {args.batch_size}")
        how = f"funcnet memory --params {n_params} --activations {acts}{same}"
    else:
        return
    if est.total > available:
        raise UsageError(f"{what} needs about {est.total / 1e9:.3g} GB for one training step (params, gradients, "
                         f"optimizer state, activations; {how}) but this machine has {available / 1e9:.3g} GB; "
                         f"reduce {size_flags(args.model)}")


@contextlib.contextmanager
def out_of_memory_is_one_line(args):
    """Turn XLA's out-of-memory error inside the block into a one-line ``UsageError`` naming the flags that set the
    sizes."""
    try:
        yield
    except RuntimeError as e:  # jax.errors.JaxRuntimeError
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
            raise
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        remat = ", pass --remat full" if args.model == "gpt" and args.remat != "full" else ""
        raise UsageError(f"out of memory while training ({first[:200]}); reduce {size_flags(args.model)}{remat}, or "
                         f"use --precision bf16 (funcnet memory estimates a step)") from None
