"""The ``funcnet`` command line: flags, their types and their one-line errors."""

from __future__ import annotations

import argparse

__all__ = ["build_parser"]

SEED_MAX = 2**32 - 1  # scikit-learn's and numpy's legacy seeds are 32-bit


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like every other error of the command, instead of argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--flag -7B`` as ``--flag=-7B``: argparse reads a value that starts with "-" as another
    flag (unless it is a plain number), and then says only "expected one argument"; joined, the
    value reaches the flag's own check, which names it."""
    out: list[str] = []
    for tok in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1] and len(tok) > 1 and tok[0] == "-"
                and (tok[1].isdigit() or tok[1] == ".")):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value}")
    return value


LR_MIN = 1e-10


def _learning_rate(text: str) -> float:
    value = _positive_float(text)
    if value < LR_MIN:
        raise argparse.ArgumentTypeError(
            f"expected a learning rate of at least {LR_MIN:g}, got {value:g}: a step that small cannot change float32 "
            f"weights (they resolve about 1e-7 of their size), so the run would learn nothing; try 1e-3")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


# float32's smallest normal number: logits divided by a temperature below it overflow to inf (or, flushed
# to zero, give 0/0), and the sample turns into the id of NaN's argmax: newlines
TEMPERATURE_MIN = 1.1754943508222875e-38
# the most characters one `funcnet sample` writes: each is one forward pass of the model, and the
# text is printed once it is complete
TOKENS_MAX = 100_000


def _temperature(text: str) -> float:
    value = _non_negative_float(text)
    if 0 < value < TEMPERATURE_MIN:
        raise argparse.ArgumentTypeError(
            f"expected 0 (greedy) or a temperature of at least {TEMPERATURE_MIN:.4g} (float32's smallest normal "
            f"number), got {value:g}: the logits divided by it overflow; pass 0 for the likeliest character each time")
    return value


def _tokens(text: str) -> int:
    value = _positive_int(text)
    if value > TOKENS_MAX:
        raise argparse.ArgumentTypeError(
            f"expected at most {TOKENS_MAX} characters, got {value}: each is one forward pass of the model and "
            f"nothing is printed before the last; sample in pieces, each --prompt the end of the last")
    return value


def _resume_mode(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"expected nothing or 'auto', got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``funcnet`` parser: the train and sample flags with their checks and defaults, and the other commands'
    names."""
    parser = _Parser(prog="funcnet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model and write metrics.json, params.npz and loss.png",
                       epilog="exit status: 0 done, 2 bad input or I/O error, 3 non-finite loss, "
                              "130 interrupted (SIGINT), 143 terminated (SIGTERM; checkpoint saved "
                              "when --checkpoint-dir is given)")
    t.add_argument("--dataset", choices=["digits", "mnist", "synthetic", "text"], default=None,
                   help="digits, mnist, synthetic; text: characters of CPython's bundled docs (default: digits; text "
                        "for --model gpt and lstm, their only data set)")
    t.add_argument("--data-dir", default=None,
                   help="folder with the MNIST IDX files (needed by --dataset mnist; no default: nothing is downloaded)")
    t.add_argument("--stream", default=None, metavar="DIR",
                   help="train from record shards in DIR (funcnet.loader), read batch by batch from disk; an empty "
                        "or missing DIR gets --dataset's training split written there first; the test split stays "
                        "in memory (default: none, the data set is trained on from memory)")
    t.add_argument("--workers", type=_non_negative_int, default=None, metavar="K",
                   help="processes that read and batch --stream's records (default 0: this process)")
    t.add_argument("--verify-records", action="store_true",
                   help="read every --stream record once before training: each size and label, and the SHA-256 "
                        "written with them (default: off, only the count and the first and last record's sizes)")
    t.add_argument("--epochs", type=_positive_int, default=20,
                   help="passes over the training data (default %(default)s)")
    t.add_argument("--max-steps", type=_positive_int, default=None, metavar="N",
                   help="stop after N optimizer steps in all (across epochs, even inside one), then write the outputs "
                        "and the checkpoint as at a normal end; --epochs still caps the run (default: no limit)")
    t.add_argument("--log-every", type=_positive_int, default=None, metavar="N",
                   help="print the training loss every N optimizer steps (the mean of those N steps), and draw it "
                        "per step in loss.png; the epoch then runs in stretches of N steps, with the same result "
                        "(default: none, one line per epoch)")
    t.add_argument("--batch-size", type=_positive_int, default=32,
                   help="examples per optimizer step, over all devices (default %(default)s)")
    t.add_argument("--lr", type=_learning_rate, default=1e-3, help="learning rate (default %(default)s)")
    t.add_argument("--optimizer", choices=["sgd", "adam"], default="adam",
                   help="optax.sgd or optax.adam, at the learning rate (default %(default)s)")
    t.add_argument("--model", choices=["mlp", "cnn", "gpt", "lstm"], default="mlp",
                   help="mlp: Linear-ReLU layers; cnn: funcnet.models.ConvNet, conv-BatchNorm-ReLU-pool x2 on the "
                        "images (square inputs, side divisible by 4); gpt: funcnet.gpt, a character-level GPT on "
                        "--dataset text; lstm: funcnet.models.LSTMLM, word_language_model's tied LSTM, on "
                        "--dataset text (--block-size, --n-layer, --n-embd, --sample-chars apply) (default %(default)s)")
    g = t.add_argument_group("--model gpt")
    g.add_argument("--block-size", type=_positive_int, default=None, help="context length (default 64)")
    g.add_argument("--n-layer", type=_positive_int, default=None, help="transformer blocks (default 3; 2 for --model lstm, its layers)")
    g.add_argument("--n-head", type=_positive_int, default=None, help="attention heads (default 4)")
    g.add_argument("--n-embd", type=_positive_int, default=None, help="embedding width (default 96; 128 for --model lstm)")
    g.add_argument("--remat", choices=["paper", "selective", "full"], default=None,
                   help="activation checkpointing: run the blocks in a lax.scan under jax.checkpoint, keeping the "
                        "paper's tensors, those without the softmax output, or each block's input only (same "
                        "results, less memory; default: no remat)")
    g.add_argument("--sample-chars", type=_positive_int, default=None,
                   help="characters sampled after training (temperature 0.8, top 10, seeded by --seed), printed "
                        "and kept in metrics.json (default 200)")
    t.add_argument("--hidden", type=_positive_int, nargs="+", default=None,
                   help="hidden layer sizes of the MLP (default: 128)")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="bf16: bfloat16 compute with float32 weights; fp16: float16 with a dynamic loss scale, "
                        "torch.amp.GradScaler's defaults (default %(default)s)")
    t.add_argument("--devices", type=_positive_int, default=1,
                   help="data-parallel devices, simulated on a CPU-only machine; --batch-size splits over them "
                        "(default %(default)s)")
    t.add_argument("--parallel", choices=["pmap", "shard_map", "sharding", "fsdp", "zero1", "zero2", "tp", "pipe"],
                   default=None,
                   help="how the step is spread over --devices: data parallel (pmap, shard_map, sharding), the "
                        "optimizer state split (zero1; zero2: its gradients too), params too (fsdp), the matrices "
                        "split column then row (tp, --model mlp or gpt), or the layers in pipeline stages (pipe, "
                        "--model mlp or gpt; see --stages) (default: shard_map when --devices > 1, else none)")
    p = t.add_argument_group("--parallel pipe")
    p.add_argument("--stages", type=_positive_int, default=None,
                   help="pipeline stages, each a run of layers on its own device: the MLP's Linear layers split "
                        "evenly, the GPT's blocks (a divisor of --n-layer); --devices / --stages is the data axis "
                        "(default: --devices)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default=None,
                   help="the pipeline's order of microbatch forwards and backwards (default 1f1b)")
    p.add_argument("--microbatches", type=_positive_int, default=None,
                   help="microbatches per step and data device; --batch-size must split into them (default: "
                        "--stages)")
    t.add_argument("--seed", type=_seed, default=0,
                   help="seed of the initial weights, the data's split and shuffling, and the sample (default %(default)s)")
    t.add_argument("--checkpoint-dir", default=None,
                   help="save the whole training state there after every epoch (keeps the newest 3) (default: none, "
                        "no checkpoints)")
    t.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="N",
                   help="also save every N steps inside an epoch (needs --checkpoint-dir; default: none, epoch ends only)")
    t.add_argument("--resume", nargs="?", const=True, default=None, type=_resume_mode, metavar="auto",
                   help="continue from the newest checkpoint in --checkpoint-dir, exactly as if uninterrupted; "
                        "--resume auto also starts a fresh run when there is none yet (restart-safe) (default: off, a fresh run "
                        "in an empty --checkpoint-dir)")
    t.add_argument("--out", default=None,
                   help="output folder of its own (created if missing; replaced as a whole when the run ends; "
                        "locked while the run lasts); default runs/train-MODEL (runs/train-mlp, runs/train-cnn, "
                        "runs/train-gpt), so runs of different models never replace each other")
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("sample", help="print text from a GPT or LSTM that funcnet train --model gpt|lstm saved",
                       description="Sample characters from the language model saved in RUN_DIR: the --out folder of "
                                   "funcnet train --model gpt|lstm (metrics.json, params.npz) or its --checkpoint-dir "
                                   "(the newest checkpoint).")
    s.add_argument("run_dir", metavar="RUN_DIR", help="the run's --out folder or --checkpoint-dir")
    s.add_argument("--prompt", default="", help="text to continue (default: none; starts after a newline)")
    s.add_argument("--tokens", type=_tokens, default=200, metavar="N",
                   help=f"characters to sample, at most {TOKENS_MAX} (default %(default)s)")
    s.add_argument("--temperature", type=_temperature, default=0.8, metavar="T",
                   help="divides the logits; 0 takes the likeliest character each time (greedy, deterministic) "
                        "(default %(default)s)")
    s.add_argument("--top-k", type=_positive_int, default=10, metavar="K",
                   help="sample among the K likeliest characters (default %(default)s)")
    s.add_argument("--seed", type=_seed, default=0, help="the sampling's seed (default %(default)s)")

    sub.add_parser("info", help="print both framework stacks on this machine")
    # parsed by funcnet.cli.memory.main; listed here so that `funcnet --help` shows it
    sub.add_parser("memory", help="estimate the memory of a training step (funcnet memory --help)")
    sub.add_parser("port", help="write a torch model (FILE.py:Class) as funcnet.nn source (funcnet port --help)")
    return parser
