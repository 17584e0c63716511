"""The ``funcnet`` command: ``funcnet train``, ``funcnet info``.

``funcnet train`` trains an MLP on a bundled or local data set and writes
``OUT/metrics.json`` (no timings, so the same seed gives the same file),
``OUT/params.npz`` (state_dict keys) and ``OUT/loss.png``. Bad input is reported
in one line with a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main", "build_parser"]

# Flags of the public contract that this build does not honour yet: asking for
# anything but their neutral value is an error, never silently ignored.
_NOT_YET = {
    "precision": ("fp32", "--precision"),
    "devices": (1, "--devices"),
    "parallel": (None, "--parallel"),
    "checkpoint_dir": (None, "--checkpoint-dir"),
    "resume": (False, "--resume"),
}


class UsageError(ValueError):
    """A bad flag value; printed as one line."""


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
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="funcnet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an MLP and write metrics.json, params.npz and loss.png")
    t.add_argument("--dataset", choices=["digits", "mnist", "synthetic"], default="digits")
    t.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (--dataset mnist)")
    t.add_argument("--epochs", type=_positive_int, default=20)
    t.add_argument("--batch-size", type=_positive_int, default=32)
    t.add_argument("--lr", type=_positive_float, default=1e-3)
    t.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    t.add_argument("--hidden", type=_positive_int, nargs="+", default=[128],
                   help="hidden layer sizes of the MLP (default: 128)")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    t.add_argument("--devices", type=_positive_int, default=1)
    t.add_argument("--parallel", choices=["pmap", "shard_map", "sharding"], default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--checkpoint-dir", default=None)
    t.add_argument("--resume", action="store_true")
    t.add_argument("--out", default="runs/train", help="output folder (created if missing)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("info", help="print both framework stacks on this machine")
    return parser


def _reject_unsupported(args) -> None:
    for attr, (neutral, flag) in _NOT_YET.items():
        if getattr(args, attr) != neutral:
            raise UsageError(
                f"{flag} {getattr(args, attr)} is not supported by this version of funcnet train yet; "
                f"leave it out (default: {neutral})"
            )


def train_command(args) -> dict:
    import jax
    import numpy as np
    import optax

    from funcnet import data, nn, state_dict, train

    _reject_unsupported(args)
    (x_tr, y_tr), (x_te, y_te) = data.load(args.dataset, data_dir=args.data_dir, seed=args.seed)
    data.check_batch_size(args.batch_size, len(x_tr))
    n_classes = int(max(y_tr.max(), y_te.max())) + 1
    model = nn.MLP([x_tr.shape[1], *args.hidden, n_classes])
    tx = optax.adam(args.lr) if args.optimizer == "adam" else optax.sgd(args.lr)

    start = time.perf_counter()
    state, history = train.fit(model, tx, (x_tr, y_tr), (x_te, y_te), epochs=args.epochs,
                               batch_size=args.batch_size, key=jax.random.key(args.seed),
                               progress=not args.quiet)
    seconds = time.perf_counter() - start

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("command", "quiet", "out")}
    metrics = {"config": config, "model": [x_tr.shape[1], *args.hidden, n_classes],
               "history": history, "final": history[-1] if history else {}}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    np.savez(out / "params.npz", **{k: np.asarray(v) for k, v in state_dict(state.params).items()})
    _plot_loss(history, out / "loss.png")
    final = metrics["final"]
    print(f"trained {args.epochs} epochs on {args.dataset} in {seconds:.1f} s: "
          f"test accuracy {final.get('test_accuracy', float('nan')):.4f}; wrote {out}/metrics.json, "
          f"params.npz, loss.png")
    return metrics


def _plot_loss(history, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [r["train_loss"] for r in history], label="train loss")
    if history and "test_loss" in history[0]:
        ax.plot(epochs, [r["test_loss"] for r in history], label="test loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross entropy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def info_command(args) -> None:
    from funcnet import info

    info.print_stacks()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            train_command(args)
        elif args.command == "info":
            info_command(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"funcnet {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
