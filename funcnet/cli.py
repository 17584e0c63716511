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
_NOT_YET: dict[str, tuple] = {}

# Flags that decide how a run is saved, never its numbers: left out of metrics.json, so
# a resumed run writes the same file as an uninterrupted one.
_NOT_IN_RESULT = ("command", "quiet", "out", "checkpoint_dir", "resume", "checkpoint_every")


class UsageError(ValueError):
    """A bad flag value; printed as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like every other error of the command, instead of argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="funcnet", description=__doc__.splitlines()[0])
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
    t.add_argument("--checkpoint-dir", default=None,
                   help="save the whole training state there after every epoch (keeps the newest 3)")
    t.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="N",
                   help="also save every N steps inside an epoch (needs --checkpoint-dir)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir, exactly as if uninterrupted")
    t.add_argument("--out", default="runs/train", help="output folder (created if missing)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("info", help="print both framework stacks on this machine")
    # parsed by funcnet.memory.main; listed here so that `funcnet --help` shows it
    sub.add_parser("memory", help="estimate the memory of a training step (funcnet memory --help)")
    return parser


def _reject_unsupported(args) -> None:
    for attr, (neutral, flag) in _NOT_YET.items():
        if getattr(args, attr) != neutral:
            raise UsageError(
                f"{flag} {getattr(args, attr)} is not supported by this version of funcnet train yet; "
                f"leave it out (default: {neutral})"
            )


def _precision(args):
    """``(policy, initial loss-scale state)`` for --precision: bf16 keeps float32's range and
    needs no scaling; fp16 gets torch.amp.GradScaler's defaults."""
    if args.precision == "fp32":
        return None, None
    if args.devices > 1 or args.parallel is not None:
        raise UsageError(f"--precision {args.precision} is not supported with --devices/--parallel yet; "
                         f"train on one device or leave --precision out (default: fp32)")
    from funcnet.precision import DynamicLossScale

    return args.precision, DynamicLossScale() if args.precision == "fp16" else None


def train_command(args) -> dict:
    import jax
    import numpy as np
    import optax

    from funcnet import data, nn, state_dict, train

    _reject_unsupported(args)
    _check_flags(args)
    policy, loss_scale = _precision(args)
    data_parallel = args.devices > 1 or args.parallel is not None
    if data_parallel:
        _parallel_flags(args)
    (x_tr, y_tr), (x_te, y_te) = data.load(args.dataset, data_dir=args.data_dir, seed=args.seed)
    if args.batch_size > len(x_tr):
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {len(x_tr)} training examples of "
                         f"{args.dataset}; use --batch-size <= {len(x_tr)}")
    n_classes = int(max(y_tr.max(), y_te.max())) + 1
    model = nn.MLP([x_tr.shape[1], *args.hidden, n_classes])
    tx = optax.adam(args.lr) if args.optimizer == "adam" else optax.sgd(args.lr)

    config = {k: v for k, v in vars(args).items() if k not in _NOT_IN_RESULT}
    done, resume_kwargs = _checkpointing(args, config, model, tx, loss_scale)

    start = time.perf_counter()
    if data_parallel:
        from funcnet import parallel

        state, history = parallel.fit(model, tx, (x_tr, y_tr), (x_te, y_te), epochs=args.epochs,
                                      batch_size=args.batch_size, key=jax.random.key(args.seed),
                                      kind=args.parallel, devices=args.devices)
    else:
        state, history = train.fit(model, tx, (x_tr, y_tr), (x_te, y_te), epochs=args.epochs,
                                   batch_size=args.batch_size, key=jax.random.key(args.seed),
                                   progress=not args.quiet, policy=policy, loss_scale=loss_scale,
                                   **resume_kwargs)
    seconds = time.perf_counter() - start
    history = done + history

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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


def _parallel_flags(args) -> None:
    """--devices N / --parallel KIND (default shard_map). On a CPU-only machine the N devices
    are simulated, which must happen before JAX's backend starts: importing funcnet does
    not start it, and nothing before this call creates an array."""
    from funcnet import parallel

    if args.checkpoint_dir is not None:
        raise UsageError("--checkpoint-dir is not supported with --devices/--parallel yet; leave one of them out")
    if args.batch_size % args.devices:
        lo, hi = args.batch_size // args.devices * args.devices, (args.batch_size // args.devices + 1) * args.devices
        raise UsageError(f"--batch-size {args.batch_size} does not split evenly over --devices {args.devices}; "
                         f"use a multiple of {args.devices} (e.g. {f'{lo} or ' if lo else ''}{hi})")
    args.parallel = args.parallel or "shard_map"
    try:
        parallel.simulate_cpu_devices(args.devices)
    except RuntimeError as e:
        raise UsageError(str(e)) from None


def _check_flags(args) -> None:
    if args.dataset == "mnist" and args.data_dir is None:
        raise UsageError("--dataset mnist needs --data-dir DIR, a folder with the four MNIST IDX files "
                         "(nothing is downloaded)")
    if args.data_dir is not None and args.dataset != "mnist":
        raise UsageError(f"--data-dir {args.data_dir} is only read with --dataset mnist; leave it out for "
                         f"--dataset {args.dataset}")
    if args.checkpoint_dir is None:
        for flag, value in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every)):
            if value:
                raise UsageError(f"{flag} needs --checkpoint-dir DIR, the folder the run saves its checkpoints in")
    elif Path(args.checkpoint_dir).exists() and not Path(args.checkpoint_dir).is_dir():
        raise UsageError(f"--checkpoint-dir {args.checkpoint_dir} is a file; pass a folder (created if missing)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a file; pass a folder (created if missing)")


def _checkpointing(args, config, model, tx, loss_scale=None):
    """``(history_done, fit_kwargs)``: fit() hooks that save into --checkpoint-dir after every
    epoch (and every --checkpoint-every steps) and, with --resume, the state and position of
    the newest checkpoint there. Each checkpoint's metadata holds the flags, the history so
    far and the position inside the epoch, so a resumed run ends with the same metrics."""
    if args.checkpoint_dir is None:
        return [], {}
    import jax
    import numpy as np

    from funcnet import checkpoint, train

    directory = Path(args.checkpoint_dir)
    newest = checkpoint.latest_step(directory)
    done, kwargs = [], {}
    if args.resume:
        if newest is None:
            raise checkpoint.CheckpointError(f"--resume: no checkpoint in {directory}; run without --resume "
                                             f"to start a fresh run there")
        meta = checkpoint.read_metadata(directory, newest)
        changed = [f"--{k.replace('_', '-')} {meta['config'].get(k)} (now {config.get(k)})"
                   for k in sorted(set(meta["config"]) | set(config))
                   if k != "epochs" and meta["config"].get(k) != config.get(k)]
        if changed:
            raise UsageError(f"--resume: the run in {directory} was started with " + ", ".join(changed)
                             + "; pass the same flags (only --epochs may change) or use a new --checkpoint-dir")
        template = train.create_train_state(model, tx, jax.random.key(0), loss_scale=loss_scale)
        state = checkpoint.restore(directory, template, newest)
        pos, done = meta["position"], meta["history"]
        start = train.Position(pos["epoch"])
        if "perm_key" in pos:  # a checkpoint taken inside an epoch
            start = start._replace(
                perm_key=jax.random.wrap_key_data(np.asarray(pos["perm_key"], np.uint32), impl=pos["key_impl"]),
                metrics={k: np.asarray(values, dtype) for k, (dtype, values) in pos["metrics"].items()})
        reached = start.epoch + (start.perm_key is not None)
        if reached > args.epochs:
            raise UsageError(f"--resume: the checkpoint in {directory} is in epoch {reached}, past --epochs "
                             f"{args.epochs}; pass --epochs {reached} or more")
        kwargs.update(state=state, start=start)
    elif newest is not None:
        raise UsageError(f"--checkpoint-dir {directory} already holds checkpoints (newest: step {newest}); pass "
                         f"--resume to continue that run, or choose an empty folder")

    def on_epoch(state, record):
        done.append(record)
        checkpoint.save(directory, state, step=int(state.step),
                        metadata={"config": config, "history": done, "position": {"epoch": record["epoch"]}})

    def on_steps(state, position):
        inside = {"epoch": position.epoch, "perm_key": jax.random.key_data(position.perm_key).tolist(),
                  "key_impl": str(jax.random.key_impl(position.perm_key)),
                  # every per-step metric the step returns (fp16 adds grads_finite, loss_scale), exactly
                  "metrics": {k: [np.asarray(v).dtype.name, np.asarray(v).tolist()]
                              for k, v in position.metrics.items()}}
        checkpoint.save(directory, state, step=int(state.step),
                        metadata={"config": config, "history": done, "position": inside})

    kwargs.update(on_epoch=on_epoch, every_steps=args.checkpoint_every, on_steps=on_steps)
    return list(done), kwargs


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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["memory"]:
        from funcnet import memory

        return memory.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            train_command(args)
        elif args.command == "info":
            info_command(args)
    except (ValueError, OSError) as e:  # UsageError, CheckpointError, missing files, unwritable folders
        # Strict-restore errors list one problem per line; the command reports in one line.
        message = " ".join(line.strip() for line in str(e).splitlines())
        print(f"funcnet {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"funcnet {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
