"""``--checkpoint-dir`` / ``--checkpoint-every`` / ``--resume``: fit's hooks that save, and the resumed state."""

from __future__ import annotations

from pathlib import Path

from funcnet.cli.errors import UsageError


def _checkpointing(args, config, model, tx, loss_scale, fingerprint, run):
    """``(history_done, fit_kwargs)``: fit() hooks that save into --checkpoint-dir after every
    epoch (and every --checkpoint-every steps; fit itself stops on a non-finite epoch before its
    on_epoch runs, so the last checkpoint stays good) and,
    with --resume, the state and position of the newest checkpoint there. Each checkpoint's
    metadata holds the flags, the data's fingerprint, the history so far and the position
    inside the epoch, so a resumed run ends with the same metrics.

    With --stream (``fit`` over a Loader) the batch order follows from ``state.step``, so a
    position inside an epoch is the epoch and its per-step metrics so far, with no shuffle key."""
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
        changed = [_changed(k, meta["config"], config) for k in sorted(set(meta["config"]) | set(config))
                   if k not in ("epochs", "max_steps") and _then(k, meta["config"]) != config.get(k)]
        if changed:
            raise UsageError(f"--resume: the run in {directory} was started with " + ", ".join(changed)
                             + "; pass the same flags (only --epochs and --max-steps may change) or use a new --checkpoint-dir")
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
        start = train.Position(pos["epoch"], metrics=partial)
        if partial is not None and "perm_key" in pos:  # in-memory: the epoch's shuffle key too (--stream: none)
            start = start._replace(
                perm_key=jax.random.wrap_key_data(np.asarray(pos["perm_key"], np.uint32), impl=pos["key_impl"]))
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
        shuffle = {} if position.perm_key is None else {  # None: a Loader's order, from state.step
            "perm_key": jax.random.key_data(position.perm_key).tolist(),
            "key_impl": str(jax.random.key_impl(position.perm_key))}
        save_inside(state, position.epoch, position.metrics, shuffle)

    kwargs.update(on_epoch=on_epoch, every_steps=args.checkpoint_every, on_steps=on_steps)
    return list(done), kwargs


def _defaults() -> dict:
    from funcnet.cli.parser import build_parser

    return vars(build_parser().parse_args(["train"]))


def _then(k, recorded: dict):
    """The flag's value in the checkpointed run: a flag that an older funcnet train did not record
    did not exist then, so that run had the flag's default."""
    return recorded[k] if k in recorded else _defaults().get(k)


def _changed(k, recorded: dict, config: dict) -> str:
    flag = f"--{k.replace('_', '-')}"
    if k not in recorded:
        return (f"{flag} unrecorded (an older funcnet train, which had no {flag}: its default "
                f"{_defaults().get(k)}) (now {config.get(k)})")
    return f"{flag} {recorded[k]} (now {config.get(k)})"


def _check_metadata(meta, path) -> None:
    ok = (isinstance(meta, dict) and isinstance(meta.get("config"), dict) and isinstance(meta.get("history"), list)
          and isinstance(meta.get("position"), dict) and isinstance(meta["position"].get("epoch"), int))
    if not ok:
        found = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise UsageError(f"--resume: {path} was not written by funcnet train (its metadata has {found or 'nothing'}, "
                         f"not the run's flags, history and position); restore it in Python with "
                         f"funcnet.checkpoint.restore, or use a new --checkpoint-dir")
