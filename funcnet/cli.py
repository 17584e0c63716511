"""The ``funcnet`` command: ``funcnet train``, ``funcnet info``.

``funcnet train`` trains an MLP on a bundled or local data set and writes
``OUT/metrics.json`` (no timings, so the same seed gives the same file),
``OUT/params.npz`` (state_dict keys) and ``OUT/loss.png``. Bad input is reported
in one line with a non-zero exit status, never a traceback.

Nothing the user had is lost:

- ``--out`` and ``--checkpoint-dir`` are checked (created, written to, locked) before any
  data is loaded. The three outputs are written into a hidden folder beside ``--out`` and
  swapped in as a whole (``renameat2(RENAME_EXCHANGE)`` on Linux), so ``--out`` holds the
  previous complete set or the new one, never a mix, whenever the run is killed. Hence
  ``--out`` must be a folder of its own (holding nothing but those three files).
- ``--checkpoint-dir`` is locked for the whole run (``funcnet.checkpoint.lock``): a
  second run on it exits at once, naming the folder and the PID holding it.
- ``--resume auto`` resumes when the folder holds a checkpoint and starts fresh when it
  does not: the one command line a job scheduler can restart as often as it likes.
- A NaN or infinite loss stops the run (exit 3) before it is checkpointed, so the last
  checkpoint is the last good one. JSON files hold no NaN/Infinity (strict JSON; a
  non-finite number would be written as the string "NaN"/"Infinity").
- SIGTERM: with ``--checkpoint-dir`` the run saves a checkpoint at the next epoch end
  (or ``--checkpoint-every`` boundary) and exits 143; ``--resume auto`` then continues
  bit for bit. Without one it exits 143 at once. Ctrl-C (SIGINT) exits 130 keeping the
  last checkpoint. Either way ``--out`` is left as it was.

Exit status: 0 done; 2 bad input or an I/O error (one line on stderr); 3 the loss became
NaN/Inf; 130 interrupted (SIGINT); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path

__all__ = ["main", "build_parser"]

# Flags of the public contract that this build does not honour yet: asking for
# anything but their neutral value is an error, never silently ignored.
_NOT_YET: dict[str, tuple] = {}

# Flags that decide how a run is saved, never its numbers: left out of metrics.json, so
# a resumed run writes the same file as an uninterrupted one.
_NOT_IN_RESULT = ("command", "quiet", "out", "checkpoint_dir", "resume", "checkpoint_every", "workers")


EXIT_ERROR, EXIT_NONFINITE, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 3, 130, 143
OUTPUTS = ("metrics.json", "params.npz", "loss.png")
SEED_MAX = 2**32 - 1  # scikit-learn's and numpy's legacy seeds are 32-bit


class UsageError(ValueError):
    """A bad flag value; printed as one line."""


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException like KeyboardInterrupt, so no ``except Exception`` swallows it."""


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


def _resume_mode(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"expected nothing or 'auto', got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="funcnet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model and write metrics.json, params.npz and loss.png",
                       epilog="exit status: 0 done, 2 bad input or I/O error, 3 non-finite loss, "
                              "130 interrupted (SIGINT), 143 terminated (SIGTERM; checkpoint saved "
                              "when --checkpoint-dir is given)")
    t.add_argument("--dataset", choices=["digits", "mnist", "synthetic", "text"], default=None,
                   help="digits (default), mnist, synthetic; text: characters of CPython's bundled docs "
                        "(the default, and the only data set, of --model gpt)")
    t.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (--dataset mnist)")
    t.add_argument("--stream", default=None, metavar="DIR",
                   help="train from record shards in DIR (funcnet.loader), read batch by batch from disk; an empty "
                        "or missing DIR gets --dataset's training split written there first; the test split stays "
                        "in memory")
    t.add_argument("--workers", type=_non_negative_int, default=None, metavar="K",
                   help="processes that read and batch --stream's records (default 0: this process)")
    t.add_argument("--epochs", type=_positive_int, default=20)
    t.add_argument("--batch-size", type=_positive_int, default=32)
    t.add_argument("--lr", type=_positive_float, default=1e-3)
    t.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    t.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp",
                   help="mlp: Linear-ReLU layers; cnn: funcnet.models.ConvNet, conv-BatchNorm-ReLU-pool x2 on the "
                        "images (square inputs, side divisible by 4); gpt: funcnet.gpt, a character-level GPT on "
                        "--dataset text")
    g = t.add_argument_group("--model gpt")
    g.add_argument("--block-size", type=_positive_int, default=None, help="context length (default 64)")
    g.add_argument("--n-layer", type=_positive_int, default=None, help="transformer blocks (default 3)")
    g.add_argument("--n-head", type=_positive_int, default=None, help="attention heads (default 4)")
    g.add_argument("--n-embd", type=_positive_int, default=None, help="embedding width (default 96)")
    g.add_argument("--remat", choices=["paper", "selective", "full"], default=None,
                   help="activation checkpointing: run the blocks in a lax.scan under jax.checkpoint, keeping the "
                        "paper's tensors, those without the softmax output, or each block's input only (same "
                        "results, less memory; default: no remat)")
    g.add_argument("--sample-chars", type=_positive_int, default=None,
                   help="characters sampled (greedy) after training, printed and kept in metrics.json "
                        "(default 200)")
    t.add_argument("--hidden", type=_positive_int, nargs="+", default=None,
                   help="hidden layer sizes of the MLP (default: 128)")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    t.add_argument("--devices", type=_positive_int, default=1)
    t.add_argument("--parallel", choices=["pmap", "shard_map", "sharding"], default=None)
    t.add_argument("--seed", type=_seed, default=0)
    t.add_argument("--checkpoint-dir", default=None,
                   help="save the whole training state there after every epoch (keeps the newest 3)")
    t.add_argument("--checkpoint-every", type=_positive_int, default=None, metavar="N",
                   help="also save every N steps inside an epoch (needs --checkpoint-dir)")
    t.add_argument("--resume", nargs="?", const=True, default=None, type=_resume_mode, metavar="auto",
                   help="continue from the newest checkpoint in --checkpoint-dir, exactly as if uninterrupted; "
                        "--resume auto also starts a fresh run when there is none yet (restart-safe)")
    t.add_argument("--out", default="runs/train",
                   help="output folder of its own (created if missing; replaced as a whole when the run ends)")
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
    from funcnet.precision import DynamicLossScale

    return args.precision, DynamicLossScale() if args.precision == "fp16" else None


def train_command(args) -> dict:
    _reject_unsupported(args)
    _check_flags(args)
    policy, loss_scale = _precision(args)
    data_parallel = args.devices > 1 or args.parallel is not None
    if data_parallel:
        _parallel_flags(args)
    _check_backend()
    run = _Run(args)
    with contextlib.ExitStack() as stack:
        stack.enter_context(run.signals())
        outputs = _Outputs(Path(args.out))
        stack.callback(outputs.discard)
        outputs.prepare()  # --out is writable: before any data is loaded or training starts
        if args.checkpoint_dir is not None:
            from funcnet import checkpoint

            stack.enter_context(checkpoint.lock(args.checkpoint_dir))
            _probe_writable(Path(args.checkpoint_dir), "--checkpoint-dir")
        return _train(args, run, outputs, policy, loss_scale, data_parallel)


def _train(args, run, outputs, policy, loss_scale, data_parallel) -> dict:
    import jax
    import numpy as np
    import optax

    from funcnet import data, state_dict, train

    from funcnet import text

    if args.dataset == "text":
        (x_tr, y_tr), (x_te, y_te) = text.load_text(args.block_size, stride=args.block_size // 2 or 1)
    else:
        (x_tr, y_tr), (x_te, y_te) = data.load(args.dataset, data_dir=args.data_dir, seed=args.seed)
    records = None if args.stream is None else _records_in(args, x_te.shape[1])  # None: written below
    n_train = len(x_tr) if records is None else len(records)
    if args.batch_size > n_train:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {n_train} training examples of "
                         f"{args.dataset if records is None else '--stream ' + args.stream}; use --batch-size "
                         f"<= {n_train}")
    # The class count is the data set's, never max(label) + 1: one corrupt label byte must be
    # refused, not grow the model a 256th class.
    n_classes = text.vocabulary().size if args.dataset == "text" else data.num_classes(args.dataset)
    _check_data(args, (x_tr, y_tr), (x_te, y_te), n_classes)
    model, description = _build_model(args, x_tr.shape[1], n_classes)
    tx = optax.adam(args.lr) if args.optimizer == "adam" else optax.sgd(args.lr)

    config = {k: v for k, v in vars(args).items() if k not in _NOT_IN_RESULT}
    stream = None
    if args.stream is None:
        fingerprint = data.fingerprint(x_tr, y_tr, x_te, y_te)
    else:
        stream = _stream(args, records, x_tr, y_tr)
        fingerprint = _stream_fingerprint(stream.records, x_te, y_te)
        x_tr = y_tr = None  # the training data is read from disk from here on
    done, resume_kwargs = _checkpointing(args, config, model, tx, loss_scale, fingerprint, run,
                                         steps_per_epoch=None if stream is None else stream.steps_per_epoch)

    start = time.perf_counter()
    run.training = True
    with _out_of_memory_is_one_line(args):
        common = {"epochs": args.epochs, "key": jax.random.key(args.seed), "progress": not args.quiet,
                  "policy": policy, "loss_scale": loss_scale, **resume_kwargs}
        if stream is not None:
            from funcnet import loader

            state, history = loader.fit_stream(model, tx, stream, (x_te, y_te), **common)
        else:
            parallel = {"devices": args.devices, "parallel": args.parallel} if data_parallel else {}
            state, history = train.fit(model, tx, (x_tr, y_tr), (x_te, y_te), batch_size=args.batch_size,
                                       **parallel, **common)
    run.training = False
    run.check_pending()  # SIGTERM after the last checkpoint: stop before touching --out
    seconds = time.perf_counter() - start
    history = done + history

    metrics = {"config": config, "model": description, "history": history, "final": history[-1] if history else {}}
    if args.model == "gpt":  # nats per character against a model that ignores context, and a greedy sample
        metrics["unigram_baseline"] = text.unigram_entropy()
        metrics["sample"] = text.complete(model, state.params, "\n", args.sample_chars, key=jax.random.key(args.seed),
                                          greedy=True)
        print(f"validation loss {metrics['final'].get('test_loss', float('nan')):.3f} nats/char "
              f"(unigram baseline {metrics['unigram_baseline']:.3f}); greedy sample:\n{metrics['sample']}")
    # torch's state_dict: parameters and buffers (BatchNorm's running statistics), torch's keys
    arrays = state_dict(state.params, state.model_state, model=model)
    outputs.commit(metrics, {k: np.asarray(v) for k, v in arrays.items()}, history, kept=run.kept())
    final = metrics["final"]
    print(f"trained {args.epochs} epochs on {args.dataset} in {seconds:.1f} s: "
          f"test accuracy {final.get('test_accuracy', float('nan')):.4f}; wrote {outputs.out}/metrics.json, "
          f"params.npz, loss.png")
    return metrics


def _records_in(args, n_features: int):
    """The ``loader.Records`` in --stream DIR, or None when DIR is missing or empty (``_stream``
    writes --dataset's training split there)."""
    import numpy as np

    from funcnet import loader

    directory = Path(args.stream)
    if not (directory / loader._META).is_file():
        if directory.is_dir() and any(directory.iterdir()):
            raise UsageError(f"--stream {args.stream} holds files but no {loader._META}, so no records written by "
                             f"funcnet.loader.write_records; pass an empty or missing folder (the training split of "
                             f"--dataset {args.dataset} is written there) or a folder of records")
        return None
    try:
        records = loader.Records(directory)
    except (KeyError, TypeError, ValueError) as e:  # a records.json of something else
        raise UsageError(f"--stream {args.stream}: {loader._META} is not funcnet.loader's ({type(e).__name__}: {e}); "
                         f"write the records again, or pass an empty folder") from None
    if int(np.prod(records.shape)) != n_features:
        raise UsageError(f"--stream {args.stream} holds examples of shape {records.shape} "
                         f"({int(np.prod(records.shape))} features) but the test split of --dataset {args.dataset} has "
                         f"{n_features}; pass the --dataset the records were written from, or an empty --stream folder")
    return records


def _stream(args, records, x_tr, y_tr):
    """A ``loader.Loader`` over --stream DIR, after writing the training split ``(x_tr, y_tr)``
    there when ``records`` is None. The records are written into a hidden folder beside DIR
    and renamed into place, so a run killed while writing leaves no half-written DIR."""
    from funcnet import loader

    directory = Path(args.stream)
    if records is None:
        for kind, stale in _Outputs(directory)._stale():  # what killed writers left (dead PIDs only)
            if kind == "tmp":
                shutil.rmtree(stale, ignore_errors=True)
        staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            shards = min(4, len(x_tr))
            loader.write_records(staging, x_tr, y_tr, shards=shards)  # float32 as loaded: the same bits as in memory
            os.rename(staging, directory)  # onto a missing or empty folder
            _fsync_dir(directory.parent)
        except OSError as e:
            raise OSError(e.errno, f"--stream {args.stream}: could not write the training split of {args.dataset} "
                                   f"there: {e.strerror or e}; pass a folder this user can write, with free space") \
                from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"--stream {args.stream}: wrote the {len(x_tr)} training examples of {args.dataset} there ({shards} "
              f"ArrayRecord shards); training reads them from disk, the test split stays in memory")
    else:
        print(f"--stream {args.stream}: training on the {len(records)} records already there; --dataset "
              f"{args.dataset} gives the test split only")
    return loader.Loader(directory, args.batch_size, seed=args.seed, workers=args.workers)


def _stream_fingerprint(records, x_te, y_te) -> str:
    """What --resume compares for --stream: records.json (count, shape, dtype, shard names and
    the SHA-256 of the records, taken by write_records as it wrote them) and the shards' sizes,
    plus the test split. Cheap at any size: the shards are not read again (streamed data may
    be far larger than memory), so shards changed in place after writing go unnoticed."""
    import numpy as np

    from funcnet import data, loader

    listing = np.frombuffer((records.directory / loader._META).read_bytes(), np.uint8)
    sizes = np.array([os.path.getsize(p) for p in records.paths], np.int64)
    return data.fingerprint(listing, sizes, x_te, y_te)


def _build_model(args, n_features: int, n_classes: int):
    """``(model, description for metrics.json)`` for --model: the MLP's layer sizes, or the
    ConvNet's or GPT's repr."""
    from funcnet import gpt, models, nn

    if args.model == "gpt":
        if args.hidden is not None:
            raise UsageError("--hidden sets the MLP's layers; --model gpt takes --n-layer, --n-head, --n-embd")
        model = gpt.build(n_classes, args.block_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                          remat=args.remat)
        return model, model.name
    if args.model == "mlp":
        args.hidden = args.hidden or [128]
        sizes = [n_features, *args.hidden, n_classes]
        _check_fits_in_memory(args, sizes)
        return nn.MLP(sizes), sizes
    if args.hidden is not None:
        raise UsageError(f"--hidden {' '.join(map(str, args.hidden))} sets the MLP's layers; --model {args.model} "
                         f"has none: leave --hidden out")
    side = int(round(n_features ** 0.5))
    if side * side != n_features or side % 4:
        raise UsageError(f"--model cnn needs square images whose side is divisible by 4 (8x8 digits, 28x28 MNIST); "
                         f"--dataset {args.dataset} has {n_features} features per example: use --model mlp")
    model = models.ConvNet(n_classes, image=side)
    return model, model.name


def _check_data(args, train_data, test_data, n_classes) -> None:
    from funcnet import guards

    for name, (x, y) in (("training", train_data), ("test", test_data)):
        guards.check_finite(x, f"the {name} inputs of {args.dataset}", "funcnet train")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= n_classes):
            bad = int(y.max()) if int(y.max()) >= n_classes else int(y.min())
            raise UsageError(f"the {name} labels of {args.dataset} include {bad}, outside its {n_classes} classes "
                             f"[0, {n_classes - 1}]; the data is damaged: replace the files")


def _check_backend() -> None:
    """Start JAX's backend now, so a platform that is asked for and missing (JAX_PLATFORMS=cuda
    on a machine without CUDA) is one line, not an assertion deep inside the first array."""
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        platforms = os.environ.get("JAX_PLATFORMS", "")
        detail = " ".join(str(e).split()) or type(e).__name__
        raise UsageError(f"JAX could not start a backend (JAX_PLATFORMS={platforms!r}): {detail}; unset JAX_PLATFORMS "
                         f"or set JAX_PLATFORMS=cpu") from None


def _check_fits_in_memory(args, sizes) -> None:
    """Refuse, before anything is allocated, a model whose training step cannot fit in this
    machine's memory (CPU); on an accelerator, an out-of-memory error at run time says the same."""
    import jax

    from funcnet import memory

    if jax.default_backend() != "cpu":
        return
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    est = memory.estimate(memory.mlp_params(sizes), args.optimizer, sizes=sizes, batch=args.batch_size,
                          **memory.PRECISIONS[args.precision])
    if est.total > available:
        raise UsageError(f"--hidden {' '.join(map(str, sizes[1:-1]))} needs about {est.total / 1e9:.3g} GB for one "
                         f"training step (params, gradients, optimizer state, activations; funcnet memory "
                         f"--sizes {','.join(map(str, sizes))} --batch {args.batch_size}) but this machine has "
                         f"{available / 1e9:.3g} GB; reduce --hidden or --batch-size")


@contextlib.contextmanager
def _out_of_memory_is_one_line(args):
    try:
        yield
    except RuntimeError as e:  # jax.errors.JaxRuntimeError
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
            raise
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise UsageError(f"out of memory while training ({first[:200]}); reduce --hidden or --batch-size, or "
                         f"use --precision bf16 (funcnet memory estimates a step)") from None


class _Run:
    """What the run has saved so far and how SIGTERM is handled. With a checkpoint folder,
    SIGTERM during training only sets a flag: the next checkpoint callback saves and then
    stops (a step boundary; the compiled epoch cannot be interrupted anyway). Otherwise, or
    outside training, it stops at once."""

    def __init__(self, args):
        self.directory = None if args.checkpoint_dir is None else Path(args.checkpoint_dir)
        self.training = False
        self.pending = False
        self.saved_step = None  # the newest checkpoint: resumed from, or saved by this run

    @contextlib.contextmanager
    def signals(self):
        def on_sigterm(signum, frame):
            if self.training and self.directory is not None:
                self.pending = True
            else:
                raise Terminated(self.stopped_message())

        try:
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def check_pending(self, saved: bool = False):
        if self.pending:
            self.pending = False
            raise Terminated(self.stopped_message(saved))

    def kept(self) -> str:
        if self.directory is None:
            return ""
        if self.saved_step is None:
            return f"; no checkpoint was saved in {self.directory} yet"
        return f"; the last checkpoint (step {self.saved_step}) in {self.directory} is kept"

    def stopped_message(self, saved: bool = False) -> str:
        if self.directory is None:
            return "nothing was saved (no --checkpoint-dir): rerun to start over"
        if self.saved_step is None:
            return f"no checkpoint was saved in {self.directory} yet: rerun with --resume auto to start over"
        how = "saved" if saved else "kept the last"
        return (f"{how} checkpoint step {self.saved_step} in {self.directory}; rerun the same command with "
                f"--resume auto to continue exactly where it stopped")


def _probe_writable(folder: Path, flag: str) -> None:
    probe = folder / f".write-test-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(probe, "xb") as f:
            f.write(b"funcnet")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, f"{flag} {folder} cannot be written: {e.strerror}; pass a folder this user can "
                               f"write, with free space") from None
    finally:
        probe.unlink(missing_ok=True)


class _Outputs:
    """``--out``'s three files, replaced together: written into a hidden folder beside ``--out``
    (``.NAME.tmp-PID-RANDOM``), fsync-ed, then exchanged with ``--out`` in one atomic rename."""

    def __init__(self, out: Path):
        self.out = out
        self.staging = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"

    def _stale(self):
        prefix = f".{self.out.name}."
        for entry in os.listdir(self.out.parent):
            if not entry.startswith(prefix):
                continue
            kind, _, rest = entry[len(prefix):].partition("-")
            pid = rest.split("-")[0]
            if kind in ("tmp", "old") and pid.isdigit() and not _pid_alive(int(pid)):
                yield kind, self.out.parent / entry

    def prepare(self) -> None:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            stale = sorted(self._stale())
            for kind, path in stale:
                if kind == "old" and not self.out.exists():
                    os.rename(path, self.out)  # a fallback swap that died between its two renames
                else:
                    shutil.rmtree(path, ignore_errors=True)
            self.staging.mkdir()
            _probe_writable(self.staging, "--out")
            if self.out.exists() and not os.access(self.out, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", str(self.out))
        except OSError as e:
            if e.strerror and e.strerror.startswith("--out"):
                raise
            raise OSError(e.errno, f"--out {self.out} cannot be written: {e.strerror} ({e.filename or self.out}); "
                                   f"pass a folder this user can write") from None

    def commit(self, metrics: dict, arrays: dict, history: list, kept: str = "") -> None:
        import numpy as np

        from funcnet import guards

        try:
            text = json.dumps(guards.json_safe(metrics), indent=2, allow_nan=False) + "\n"
            with open(self.staging / "metrics.json", "x") as f:
                f.write(text)
                _sync(f)
            with open(self.staging / "params.npz", "xb") as f:
                np.savez(f, **arrays)
                _sync(f)
            _plot_loss(history, self.staging / "loss.png")
            with open(self.staging / "loss.png", "rb") as f:
                os.fsync(f.fileno())
            _fsync_dir(self.staging)
            self._swap()
        except OSError as e:
            raise OSError(e.errno, f"could not write the outputs to {self.out}: {e.strerror or e} "
                                   f"({e.filename or self.staging}); {self.out} is left as it was{kept}") from None

    def _swap(self) -> None:
        if not self.out.exists():
            os.rename(self.staging, self.out)
        elif _exchange(self.staging, self.out):
            pass  # self.staging now holds the previous set
        else:  # no atomic exchange here: two renames; prepare() repairs a death between them
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(self.out, old)
            os.rename(self.staging, self.out)
            os.rename(old, self.staging)
        _fsync_dir(self.out.parent)
        shutil.rmtree(self.staging, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    from funcnet.checkpoint import _fsync_dir as fsync_dir  # one copy: the rename made durable

    fsync_dir(directory)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    import errno as _errno

    if err in (_errno.EINVAL, _errno.ENOSYS, _errno.ENOTSUP):  # a file system without RENAME_EXCHANGE
        return False
    raise OSError(err, os.strerror(err), str(b))


def _pid_alive(pid: int) -> bool:
    from funcnet.checkpoint import _pid_alive as alive

    return alive(pid)


def _parallel_flags(args) -> None:
    """--devices N / --parallel KIND (default shard_map). On a CPU-only machine the N devices
    are simulated, which must happen before JAX's backend starts: importing funcnet does
    not start it, and nothing before this call creates an array."""
    from funcnet import parallel

    if args.batch_size % args.devices:
        lo, hi = args.batch_size // args.devices * args.devices, (args.batch_size // args.devices + 1) * args.devices
        raise UsageError(f"--batch-size {args.batch_size} does not split evenly over --devices {args.devices}; "
                         f"use a multiple of {args.devices} (e.g. {f'{lo} or ' if lo else ''}{hi})")
    args.parallel = args.parallel or "shard_map"
    try:
        parallel.simulate_cpu_devices(args.devices)
    except RuntimeError as e:
        raise UsageError(str(e)) from None


_GPT_FLAGS = {"block_size": 64, "n_layer": 3, "n_head": 4, "n_embd": 96, "sample_chars": 200, "remat": None}


def _check_model_flags(args) -> None:
    """--model and --dataset go together (gpt reads text, the others images or features);
    the GPT's flags get their defaults, and are refused for the other models."""
    if args.dataset is None:
        args.dataset = "text" if args.model == "gpt" else "digits"
    if (args.model == "gpt") != (args.dataset == "text"):
        raise UsageError(f"--model {args.model} does not train on --dataset {args.dataset}: --model gpt reads "
                         f"--dataset text and the other models read digits, mnist or synthetic")
    if args.model != "gpt":
        given = [f"--{k.replace('_', '-')}" for k in _GPT_FLAGS if getattr(args, k) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} set the GPT; --model {args.model} has no such setting: "
                             f"leave {'them' if len(given) > 1 else 'it'} out or pass --model gpt")
        return
    for k, default in _GPT_FLAGS.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    if args.n_embd % args.n_head:
        raise UsageError(f"--n-embd {args.n_embd} does not split over --n-head {args.n_head} heads; pass an "
                         f"--n-embd divisible by {args.n_head}")


def _check_flags(args) -> None:
    _check_model_flags(args)
    if args.dataset == "mnist" and args.data_dir is None:
        raise UsageError("--dataset mnist needs --data-dir DIR, a folder with the four MNIST IDX files "
                         "(nothing is downloaded)")
    if args.data_dir is not None and args.dataset != "mnist":
        raise UsageError(f"--data-dir {args.data_dir} is only read with --dataset mnist; leave it out for "
                         f"--dataset {args.dataset}")
    for flag, value in (("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir), ("--data-dir", args.data_dir),
                        ("--stream", args.stream)):
        if value is not None and not value.strip():
            raise UsageError(f"{flag} is empty; pass a folder name (an empty one would mean the current folder)")
    for flag, value in (("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir), ("--stream", args.stream)):
        blocker = value is not None and _file_above(Path(value))
        if blocker:
            raise UsageError(f"{flag} {value} is inside {blocker}, which is a file; pass a folder path")
    if args.checkpoint_dir is None:
        for flag, value in (("--resume", args.resume), ("--checkpoint-every", args.checkpoint_every)):
            if value:
                raise UsageError(f"{flag} needs --checkpoint-dir DIR, the folder the run saves its checkpoints in")
    elif Path(args.checkpoint_dir).exists() and not Path(args.checkpoint_dir).is_dir():
        raise UsageError(f"--checkpoint-dir {args.checkpoint_dir} is a file; pass a folder (created if missing)")
    _check_stream_flags(args)
    _check_out(args)


def _check_stream_flags(args) -> None:
    """--stream DIR [--workers K]: one device, the MLP and conv net (not the GPT's text)."""
    if args.stream is None:
        if args.workers is not None:
            raise UsageError(f"--workers {args.workers} sets the processes that read --stream's records; pass "
                             f"--stream DIR to train from records on disk, or leave --workers out")
        return
    args.workers = args.workers or 0
    if args.model == "gpt":
        raise UsageError(f"--stream {args.stream} reads image or feature records with class labels; --model gpt "
                         f"trains on --dataset text in memory: leave --stream out")
    if args.devices > 1 or args.parallel is not None:
        given = f"--devices {args.devices}" if args.devices > 1 else f"--parallel {args.parallel}"
        raise UsageError(f"{given} is not supported with --stream yet (streamed batches train on one device); "
                         f"leave {given.split()[0]} out, or drop --stream to train data-parallel in memory")
    if Path(args.stream).exists() and not Path(args.stream).is_dir():
        raise UsageError(f"--stream {args.stream} is a file; pass a folder of records (funcnet.loader.write_records) "
                         f"or an empty or missing one, where the training split of --dataset is written")


def _file_above(path: Path):
    """The nearest existing ancestor of ``path`` if it is not a folder (so ``path`` cannot be created)."""
    for parent in path.absolute().parents:
        if os.path.lexists(parent):
            return parent if not parent.is_dir() else None
    return None


def _check_out(args) -> None:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file; pass a folder (created if missing)")
    resolved, cwd = out.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved.parent == resolved:
        raise UsageError(f"--out {args.out} is the current folder or one above it; the outputs replace --out as a "
                         f"whole, so give the run a folder of its own (e.g. --out runs/train)")
    for flag, value, beside in (("--checkpoint-dir", args.checkpoint_dir, "ckpt"), ("--stream", args.stream, "data")):
        inner = None if value is None else Path(value).resolve()
        if inner is not None and (inner == resolved or resolved in inner.parents):
            raise UsageError(f"{flag} {value} is inside --out {args.out}, which is replaced as a whole when the run "
                             f"ends; put it beside, e.g. {flag} {args.out}-{beside}")
    if not out.is_dir():
        return
    entries = os.listdir(out)
    foreign = sorted(e for e in entries if e not in OUTPUTS)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise UsageError(f"--out {args.out} holds other files ({shown}); the outputs replace --out as a whole, so "
                         f"it may hold only {', '.join(OUTPUTS)}: choose a new folder")
    for name in OUTPUTS:
        path = out / name
        if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
            raise UsageError(f"--out {args.out}: {name} is not a regular file (a folder or a link); move it away "
                             f"or choose another --out")


def _checkpointing(args, config, model, tx, loss_scale, fingerprint, run, steps_per_epoch=None):
    """``(history_done, fit_kwargs)``: fit() hooks that save into --checkpoint-dir after every
    epoch (and every --checkpoint-every steps; fit itself stops on a non-finite epoch before its
    on_epoch runs, so the last checkpoint stays good) and,
    with --resume, the state and position of the newest checkpoint there. Each checkpoint's
    metadata holds the flags, the data's fingerprint, the history so far and the position
    inside the epoch, so a resumed run ends with the same metrics.

    With ``steps_per_epoch`` (--stream) the kwargs are ``loader.fit_stream``'s: the batch
    order follows from ``state.step``, so a position inside an epoch is the epoch and its
    per-step metrics so far (no shuffle key), resumed as ``partial_metrics``."""
    import jax
    import numpy as np

    from funcnet import checkpoint, guards, train

    if args.checkpoint_dir is None:
        return [], {}

    directory = Path(args.checkpoint_dir)
    newest = checkpoint.latest_step(directory)
    done, kwargs = [], {}
    if args.resume is True and newest is None:
        raise checkpoint.CheckpointError(f"--resume: no checkpoint in {directory}; run without --resume "
                                         f"to start a fresh run there (or pass --resume auto: resume if there is one)")
    if args.resume and newest is not None:
        meta = checkpoint.read_metadata(directory, newest)
        _check_metadata(meta, checkpoint.checkpoint_path(directory, newest))
        changed = [f"--{k.replace('_', '-')} {meta['config'].get(k)} (now {config.get(k)})"
                   for k in sorted(set(meta["config"]) | set(config))
                   if k != "epochs" and meta["config"].get(k) != config.get(k)]
        if changed:
            raise UsageError(f"--resume: the run in {directory} was started with " + ", ".join(changed)
                             + "; pass the same flags (only --epochs may change) or use a new --checkpoint-dir")
        if meta.get("data_sha256", fingerprint) != fingerprint:
            raise UsageError(f"--resume: the {args.dataset} data changed since the run in {directory} was started "
                             f"(fingerprint {meta['data_sha256'][:12]}... then, {fingerprint[:12]}... now); resume "
                             f"with the same data files or start over in a new --checkpoint-dir")
        template = train.create_train_state(model, tx, jax.random.key(0), loss_scale=loss_scale)
        state = checkpoint.restore(directory, template, newest)
        pos, done = meta["position"], meta["history"]
        partial = None  # the epoch's per-step metrics so far, when the checkpoint was taken inside an epoch
        if "metrics" in pos:
            partial = {k: np.asarray(values, dtype) for k, (dtype, values) in pos["metrics"].items()}
        reached = pos["epoch"] + (partial is not None)
        if steps_per_epoch is not None:  # --stream: the rest of the position is state.step
            resumed = {"partial_metrics": partial}
        else:
            start = train.Position(pos["epoch"])
            if partial is not None:  # in-memory: the epoch's shuffle key too
                start = start._replace(
                    perm_key=jax.random.wrap_key_data(np.asarray(pos["perm_key"], np.uint32), impl=pos["key_impl"]),
                    metrics=partial)
            resumed = {"start": start}
        if reached > args.epochs:
            raise UsageError(f"--resume: the checkpoint in {directory} is in epoch {reached}, past --epochs "
                             f"{args.epochs}; pass --epochs {reached} or more")
        kwargs.update(state=state, **resumed)
        run.saved_step = newest
    elif newest is not None:
        raise UsageError(f"--checkpoint-dir {directory} already holds checkpoints (newest: step {newest}); pass "
                         f"--resume (or --resume auto) to continue that run, or choose an empty folder")

    def save(state, metadata):
        step = int(state.step)
        checkpoint.save(directory, state, step=step,
                        metadata={"config": config, "data_sha256": fingerprint, "history": done, **metadata})
        run.saved_step = step
        run.check_pending(saved=True)  # SIGTERM while training: stop here, right after a save

    def on_epoch(state, record):
        done.append(record)
        save(state, {"position": {"epoch": record["epoch"]}})

    def save_inside(state, epoch, step_metrics, shuffle):
        losses = np.asarray(step_metrics["loss"])
        guards.check_finite_losses(losses, int(state.step) - len(losses) + 1, epoch + 1, state.params)
        inside = {"epoch": epoch, **shuffle,
                  # every per-step metric the step returns (fp16 adds grads_finite, loss_scale), exactly
                  "metrics": {k: [np.asarray(v).dtype.name, np.asarray(v).tolist()]
                              for k, v in step_metrics.items()}}
        save(state, {"position": inside})

    def on_steps(state, position):
        save_inside(state, position.epoch, position.metrics,
                    {"perm_key": jax.random.key_data(position.perm_key).tolist(),
                     "key_impl": str(jax.random.key_impl(position.perm_key))})

    def on_stream_steps(state, partial_metrics):  # fit_stream's hook: epochs done follow from state.step
        save_inside(state, int(state.step) // steps_per_epoch, partial_metrics, {})

    kwargs.update(on_epoch=on_epoch, every_steps=args.checkpoint_every,
                  on_steps=on_steps if steps_per_epoch is None else on_stream_steps)
    return list(done), kwargs


def _check_metadata(meta, path) -> None:
    ok = (isinstance(meta, dict) and isinstance(meta.get("config"), dict) and isinstance(meta.get("history"), list)
          and isinstance(meta.get("position"), dict) and isinstance(meta["position"].get("epoch"), int))
    if not ok:
        found = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise UsageError(f"--resume: {path} was not written by funcnet train (its metadata has {found or 'nothing'}, "
                         f"not the run's flags, history and position); restore it in Python with "
                         f"funcnet.checkpoint.restore, or use a new --checkpoint-dir")


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
    from funcnet.guards import NonFiniteLossError

    prog = f"funcnet {args.command}"
    try:
        if args.command == "train":
            train_command(args)
        elif args.command == "info":
            info_command(args)
    except NonFiniteLossError as e:
        print(f"{prog}: error: {_one_line(e)}{_kept(args)}", file=sys.stderr)
        return EXIT_NONFINITE
    except (ValueError, OSError) as e:  # UsageError, CheckpointError, missing files, unwritable folders
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{_kept(args)}; --out is left as it was", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as e:
        print(f"{prog}: terminated by SIGTERM: {e}; --out is left as it was", file=sys.stderr)
        return EXIT_TERMINATED
    return 0


def _one_line(e: BaseException) -> str:
    # Strict-restore errors list one problem per line; the command reports in one line.
    return " ".join(line.strip() for line in str(e).splitlines())


def _kept(args) -> str:
    directory = getattr(args, "checkpoint_dir", None)
    if directory is None:
        return ""
    from funcnet import checkpoint

    newest = checkpoint.latest_step(directory)
    if newest is None:
        return f"; no checkpoint in {directory}"
    return f"; the last good checkpoint (step {newest}) in {directory} is kept"


if __name__ == "__main__":
    sys.exit(main())
