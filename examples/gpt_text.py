"""Train a small GPT on CPython's bundled documentation, then sample from it.

    python examples/gpt_text.py [--epochs 2] [--stride 32] [--n-layer 3] [--n-embd 96] ...

The data is ``funcnet.text`` (``pydoc_data.topics``, ~465,000 characters, no download), the
model ``funcnet.gpt.GPT`` (nanoGPT's, its torch twin in ``comparisons/gpt.py``), the
optimizer nanoGPT's (``funcnet.gpt.configure_optimizers``: AdamW with decay on matrices,
gradient clipping, warmup + cosine over the whole run), the loop ``funcnet.fit``: each
epoch one compiled ``lax.scan``. At the end it prints the validation loss in nats (and
bits) per character against the unigram baseline, the entropy of the training split's
character frequencies (the loss of a model that ignores context), and a greedy and a
temperature sample.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import jax

import funcnet
from funcnet import gpt, text
from funcnet.callbacks import Callback


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--stride", type=int, default=32, help="offset between training blocks")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=3)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=96)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt", default="The ")
    parser.add_argument("--sample-chars", type=int, default=300)
    parser.add_argument("--max-val-loss", type=float, default=1.5,
                        help="exit 1 above this validation loss (nats/char); the full run reaches 1.43")
    parser.add_argument("--quick", action="store_true",
                        help="1 layer, width 32, context 32, 1 epoch over blocks 256 apart: the CI setting, "
                             "checked against the unigram baseline instead of --max-val-loss")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_layer, args.n_embd, args.block_size, args.stride, args.epochs = 1, 32, 32, 256, 1
        args.sample_chars, args.max_val_loss = 60, None

    key_data, key_init, key_sample = jax.random.split(jax.random.key(args.seed), 3)
    train, val = text.load_text(args.block_size, stride=args.stride, key=key_data)
    vocab = text.vocabulary()
    config = gpt.GPTConfig(block_size=args.block_size, vocab_size=vocab.size, n_layer=args.n_layer,
                           n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout)
    model = gpt.GPT(config)
    steps = args.epochs * (len(train[0]) // args.batch_size)
    warmup = min(args.warmup, steps // 2)
    tx = gpt.configure_optimizers(learning_rate=args.lr, warmup_steps=warmup, decay_steps=steps)
    params = jax.eval_shape(model.init, key_init)  # shapes only: fit initializes from key_init
    print(f"{config}\n{gpt.num_params(params):,} parameters (non-embedding); {len(train[0]):,} training blocks "
          f"of {args.block_size} (stride {args.stride}), {len(val[0]):,} validation blocks; vocabulary "
          f"{vocab.size} characters")
    print(f"budget: {args.epochs} epochs = {steps:,} steps of {args.batch_size} x {args.block_size} = "
          f"{steps * args.batch_size * args.block_size:,} tokens, AdamW lr {args.lr}, warmup {warmup} + cosine")

    start = last = time.perf_counter()

    def on_epoch(state, record):
        nonlocal last
        now = time.perf_counter()
        print(f"  epoch {record['epoch']}: train loss {record['train_loss']:.4f}, val loss "
              f"{record['test_loss']:.4f} ({now - last:.0f} s)", flush=True)
        last = now

    state, history = funcnet.fit(model, tx, train, val, epochs=args.epochs, batch_size=args.batch_size,
                                 key=key_init, progress=False, callbacks=[Callback(on_epoch=on_epoch)])
    seconds = time.perf_counter() - start
    val_loss = history[-1]["test_loss"]
    baseline = text.unigram_entropy()
    print(f"trained in {seconds:.0f} s ({steps * args.batch_size * args.block_size / seconds:,.0f} tokens/s, "
          f"compilation included) on {jax.devices()[0].platform}")
    print(f"validation loss {val_loss:.3f} nats/char ({text.bits_per_char(val_loss):.2f} bits/char); "
          f"unigram baseline {baseline:.3f} nats/char ({text.bits_per_char(baseline):.2f} bits/char); "
          f"uniform over the vocabulary {math.log(vocab.size):.3f}")
    greedy = text.complete(model, state.params, args.prompt, args.sample_chars, key=key_sample, greedy=True)
    sampled = text.complete(model, state.params, args.prompt, args.sample_chars, key=key_sample,
                            temperature=0.8, top_k=None)
    print(f"\n--- greedy, prompt {args.prompt!r} ---\n{greedy}\n\n--- temperature 0.8 ---\n{sampled}")
    bar = baseline if args.max_val_loss is None else args.max_val_loss
    if not val_loss < bar or not greedy.strip():
        print(f"FAILED: validation loss {val_loss:.3f} nats/char is not below the bar {bar:.3f} "
              f"({'the unigram baseline' if args.max_val_loss is None else '--max-val-loss'}), or the sample is empty",
              file=sys.stderr)
    return {"ok": val_loss < bar and bool(greedy.strip()), "val_loss": val_loss, "baseline": baseline, "steps": steps, "seconds": seconds,
            "greedy": greedy, "sample": sampled, "history": history}


if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(0 if main()["ok"] else 1)
