"""``--checkpoint-dir`` / ``--checkpoint-every`` / ``--resume``: fit's hooks that save, and the resumed state."""

from __future__ import annotations

from pathlib import Path

from funcnet.cli.errors import UsageError


def _checkpointing(args, config, model, tx, loss_scale, fingerprint, run):
    """``(history_done, fit_kwargs)``: fit() hooks that save into --checkpoint-dir after every
    epoch and every --checkpoint-every steps (``callbacks.save_position``, as ``ModelCheckpoint``:
    nothing non-finite is saved, so the last checkpoint stays good) and, with --resume, the state
    and position of the newest checkpoint there (``callbacks.restore_position``, as
    ``callbacks.resume``). Each checkpoint's metadata holds the flags, the data's fingerprint,
    the history so far and the position inside the epoch, so a resumed run ends with the same
    metrics. A resumed run that has nothing left to train (its --max-steps or --epochs reached)
    gets ``fit_kwargs["finished"]``, the line that says so (not a ``fit`` argument: pop it).

    With --stream (``fit`` over a Loader) the batch order follows from ``state.step``, so a
    position inside an epoch is the epoch and its per-step metrics so far, with no shuffle key."""
    import jax

    from funcnet import callbacks, checkpoint, train

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
        if args.max_steps is not None and newest > args.max_steps:
            raise UsageError(f"--resume: the run in {directory} is at step {newest}, past --max-steps "
                             f"{args.max_steps}; pass --max-steps {newest} or more (a run cannot go back)")
        template = train.create_train_state(model, tx, jax.random.key(0), loss_scale=loss_scale)
        # the state and the position inside the epoch (the same code as callbacks.resume; --stream: no shuffle key,
        # a Loader's order follows from state.step)
        state, start = callbacks.restore_position(directory, template, newest, metadata=meta)
        done = meta["history"]
        reached = start.epoch + (start.metrics is not None)  # the epoch the checkpoint is in
        if reached > args.epochs:
            raise UsageError(f"--resume: the checkpoint in {directory} is in epoch {reached}, past --epochs "
                             f"{args.epochs}; pass --epochs {reached} or more")
        kwargs.update(state=state, start=start)
        run.saved_step = newest
        if (args.max_steps is not None and newest >= args.max_steps) or (
                start.metrics is None and start.epoch >= args.epochs):
            ends = (f"--max-steps {args.max_steps}" if args.max_steps is not None and newest >= args.max_steps
                    else f"--epochs {args.epochs}")
            kwargs["finished"] = f"the run in {directory} is finished (step {newest}, {ends})"
    elif newest is not None:
        raise UsageError(f"--checkpoint-dir {directory} already holds checkpoints (newest: step {newest}); pass "
                         f"--resume (or --resume auto) to continue that run, or choose an empty folder")

    def save(state, position, record=None):
        # the flags, the data's fingerprint and the history so far beside the position: a resumed run ends
        # with the same metrics; nothing non-finite is saved (NonFiniteLossError, the last good checkpoint kept)
        callbacks.save_position(directory, state, position, record=record,
                                metadata={"config": config, "data_sha256": fingerprint, "history": done})
        run.saved_step = int(state.step)
        run.check_pending(saved=True)  # SIGTERM while training: stop here, right after a save

    def on_epoch(state, record):
        done.append(record)
        save(state, train.Position(record["epoch"]), record)

    kwargs.update(on_epoch=on_epoch, every_steps=args.checkpoint_every, on_steps=save)
    return list(done), kwargs


def holds_run(out: Path, config: dict, done: list, step: int) -> bool:
    """``--out`` holds the outputs of the run whose newest checkpoint is ``step`` with history
    ``done``: its three files, written with the same flags, a history that starts with ``done``
    and ends at ``step`` (a run that --max-steps stopped inside an epoch adds that epoch's record)."""
    import json

    from funcnet import guards
    from funcnet.cli.outputs import OUTPUTS

    try:
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return False
    if not all((out / name).is_file() for name in OUTPUTS) or not isinstance(metrics, dict):
        return False
    history = metrics.get("history")
    same_flags = json.loads(json.dumps(guards.json_safe(config))) == metrics.get("config")
    return (same_flags and isinstance(history, list) and history[:len(done)] == done
            and len(history) - len(done) in (0, 1) and bool(history) and history[-1].get("step") == step)


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
