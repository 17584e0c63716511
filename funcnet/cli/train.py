"""``funcnet train``: flags checked, outputs and checkpoints prepared, then ``fit`` (arrays, or ``--stream``'s Loader)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from funcnet import compile_cache
from funcnet.cli.checkpointing import _checkpointing, holds_run
from funcnet.cli.errors import UsageError
from funcnet.cli.outputs import _check_out, _file_above, _Outputs, _probe_writable
from funcnet.cli.signals import _Run
from funcnet.cli.sizes import check_fits_in_memory, out_of_memory_is_one_line
from funcnet.cli.stream import (
    _check_stream_flags,
    _records_in,
    _stream,
    _stream_fingerprint,
)

__all__ = ["train_command"]

# Flags of the public contract that this build does not honour yet: asking for
# anything but their neutral value is an error, never silently ignored.
_NOT_YET: dict[str, tuple] = {}


# Flags that decide how a run is saved, never its numbers: left out of metrics.json, so
# a resumed run writes the same file as an uninterrupted one.
_NOT_IN_RESULT = ("command", "quiet", "out", "checkpoint_dir", "resume", "checkpoint_every", "workers",
                  "verify_records", "log_every")


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
    """``funcnet train``: check the flags and outputs, train, write OUT's files and return the metrics."""
    _reject_unsupported(args)
    _check_flags(args)
    data_parallel = args.devices > 1 or args.parallel is not None
    if data_parallel:  # first: simulating CPU devices must come before any array (the fp16 loss scale is one)
        _parallel_flags(args)
    compile_cache.enable()  # a second run reads its compiled programs from disk (FUNCNET_NO_COMPILE_CACHE=1: off)
    policy, loss_scale = _precision(args)
    _check_backend()
    run = _Run(args)
    with contextlib.ExitStack() as stack:
        stack.enter_context(run.signals())
        outputs = _Outputs(Path(args.out))
        stack.enter_context(outputs.lock())  # one run per --out, as per --checkpoint-dir
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

    from funcnet import data, state_dict, text, train

    if args.dataset == "text":
        (x_tr, y_tr), (x_te, y_te) = text.load_text(args.block_size, stride=args.block_size // 2 or 1)
    else:
        (x_tr, y_tr), (x_te, y_te) = data.load(args.dataset, data_dir=args.data_dir, seed=args.seed)
    # The class count is the data set's, never max(label) + 1: one corrupt label byte must be
    # refused, not grow the model a 256th class.
    n_classes = text.vocabulary().size if args.dataset == "text" else data.num_classes(args.dataset)
    records = None if args.stream is None else _records_in(args, x_te.shape[1], n_classes)  # None: written below
    n_train = len(x_tr) if records is None else len(records)
    if args.batch_size > n_train:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {n_train} training examples of "
                         f"{args.dataset if records is None else '--stream ' + args.stream}; use --batch-size "
                         f"<= {n_train}")
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
    done, resume_kwargs = _checkpointing(args, config, model, tx, loss_scale, fingerprint, run)
    finished = resume_kwargs.pop("finished", None)
    if finished is not None and holds_run(outputs.out, config, done, run.saved_step):
        # a rerun of a finished run (a scheduler's restart-safe --resume auto line): --out is left as it is
        print(f"{finished} and --out {outputs.out} holds its outputs: nothing to train (pass a larger --max-steps "
              f"or --epochs to go on)")
        return json.loads((outputs.out / "metrics.json").read_text())
    if "state" in resume_kwargs:  # the newest checkpoint's state: say so, a resumed run looks like a fresh one
        print(f"resumed from step {run.saved_step} in {args.checkpoint_dir}")
    used = jax.devices()[:args.devices if data_parallel else 1]
    simulated = ", simulated" if data_parallel and used[0].platform == "cpu" else ""
    print(f"devices: {len(used)} ({used[0].platform}{simulated})")

    start = time.perf_counter()
    run.training = True
    with out_of_memory_is_one_line(args):
        common = {"epochs": args.epochs, "key": jax.random.key(args.seed), "progress": not args.quiet}
        from funcnet.callbacks import Callback
        from funcnet.precision import Precision

        on_epoch, on_steps, every = (resume_kwargs.pop(k, None) for k in ("on_epoch", "on_steps", "every_steps"))
        if on_steps is not None and args.max_steps is not None:
            every = every or args.max_steps  # a checkpoint where --max-steps stops inside an epoch
        hooks = [Callback(on_epoch, on_steps if every else None, every)]
        logged: list[tuple[int, float]] = []  # (step, mean loss of the N steps before it) for --log-every
        if args.log_every is not None:
            hooks.append(Callback(None, _step_logger(args.log_every, logged), args.log_every))
        parallel = {"devices": args.devices, "strategy": _strategy(args, model)} if data_parallel else {}
        # --stream: the Loader is the training data (its order and position: state.step)
        state, history = train.fit(model, tx, (x_tr, y_tr) if stream is None else stream, (x_te, y_te),
                                   batch_size=args.batch_size, precision=Precision(policy, loss_scale),
                                   callbacks=hooks, **parallel, max_steps=args.max_steps, **common,
                                   **resume_kwargs)
    run.training = False
    run.check_pending()  # SIGTERM after the last checkpoint: stop before touching --out
    seconds = time.perf_counter() - start
    history = done + history

    metrics = {"config": config, "model": description, "history": history, "final": history[-1] if history else {}}
    if args.dataset == "text":  # nats per character against a model that ignores context, and a sample
        metrics["unigram_baseline"] = text.unigram_entropy()
        metrics["sample"] = _sample(model, state.params, args)
        print(f"validation loss {metrics['final'].get('test_loss', float('nan')):.3f} nats/char "
              f"(unigram baseline {metrics['unigram_baseline']:.3f}); sample (temperature {SAMPLE_TEMPERATURE}, "
              f"top {SAMPLE_TOP_K}, seed {args.seed}):\n{metrics['sample']}")
    # torch's state_dict: parameters and buffers (BatchNorm's running statistics), torch's keys
    arrays = state_dict(state.params, state.model_state, model=model)
    run.check_pending()  # a SIGTERM whose exception was swallowed since: --out stays as it was
    outputs.commit(metrics, {k: np.asarray(v) for k, v in arrays.items()}, history, kept=run.kept(), steps=logged)
    run.wrote_out = True
    final = metrics["final"]
    ran = f"{args.epochs} epochs"
    if args.max_steps is not None and final and final["step"] >= args.max_steps:
        ran = f"{final['step']} steps (--max-steps) in {final['epoch']} epoch{'s' if final['epoch'] > 1 else ''}"
    print(f"trained {ran} on {args.dataset} in {seconds:.1f} s: "
          f"test accuracy {final.get('test_accuracy', float('nan')):.4f}; wrote {outputs.out}/metrics.json, "
          f"params.npz, loss.png")
    return metrics


def _step_logger(every: int, logged: list):
    """``on_steps`` of --log-every: one line per ``every`` steps, the mean training loss of those
    steps (the per-step losses of the epoch so far are the position's metrics)."""
    import numpy as np

    def on_steps(state, position):
        step = int(state.step)
        losses = np.asarray(position.metrics["loss"], np.float64)[-every:] if position.metrics else np.array([])
        if losses.size:
            logged.append((step, float(losses.mean())))
            print(f"step {step} (epoch {position.epoch + 1}): train loss {losses.mean():.4f} (mean of steps "
                  f"{step - losses.size + 1}-{step})", flush=True)

    return on_steps


SAMPLE_TEMPERATURE, SAMPLE_TOP_K = 0.8, 10


def _sample(model, params, args) -> str:
    r"""``--sample-chars`` characters after "\n", sampled (temperature 0.8, the 10 likeliest),
    deterministic per --seed. Greedy decoding is no sample of a small model: after a few epochs
    its argmax is " " almost everywhere, and it printed a blank line of spaces."""
    import jax

    from funcnet import text

    return text.complete(model, params, "\n", args.sample_chars, key=jax.random.key(args.seed),
                         temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, block_size=args.block_size)


def _build_model(args, n_features: int, n_classes: int):
    """``(model, description for metrics.json)`` for --model: the MLP's layer sizes, or the
    ConvNet's or GPT's repr."""
    from funcnet import models, nn

    if args.model in _TEXT_MODELS:
        if args.hidden is not None:
            takes = "--n-layer, --n-head, --n-embd" if args.model == "gpt" else "--n-layer and --n-embd"
            raise UsageError(f"--hidden sets the MLP's layers; --model {args.model} takes {takes}")
        model = text_model(args, n_classes)
        check_fits_in_memory(args, model, vocab=n_classes)
        return model, model.name
    if args.model == "mlp":
        args.hidden = args.hidden or [128]
        sizes = [n_features, *args.hidden, n_classes]
        check_fits_in_memory(args, sizes=sizes)
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


def text_model(args, vocab: int):
    """The GPT or LSTM language model of ``args.model`` and its flags (``funcnet sample`` rebuilds
    a saved run's from its metrics.json)."""
    from funcnet import gpt, models

    if args.model == "gpt":
        return gpt.build(vocab, args.block_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                         remat=args.remat)
    return models.LSTMLM(vocab, args.n_embd, args.n_embd, args.n_layer, dropout=0.0, batch_first=True,
                         return_hidden=False)


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


def _strategy(args, model):
    """fit's strategy for --parallel: its name; for pipe, ``Strategy("pipe")`` of --stages,
    --microbatches and --schedule (``parallel.stages`` splits the MLP's Linears evenly; the GPT
    takes its own fast path); for tp a plan: the MLP's Linear layers in pairs,
    column- then row-parallel (Megatron's MLP), a last unpaired layer whole; the GPT's Megatron plan
    with c_attn whole (its rows are nanoGPT's [q | k | v], which split over devices into no whole
    heads; each device computes the attention, c_proj splits its heads row-parallel), the
    embedding split by vocabulary where --devices divides it."""
    if args.parallel == "pipe":  # the GPT by its fast path (the model is funcnet's GPT), the MLP by its Linears
        from funcnet.parallel import strategy as _strategy_mod

        return _strategy_mod.Strategy("pipe", pipeline=args.stages, microbatches=args.microbatches,
                                      schedule=args.schedule)
    if args.parallel != "tp":
        return args.parallel
    from funcnet.parallel import strategy as _strategy_mod
    from funcnet.parallel import tensor as tp

    if args.model == "gpt":
        vocab = tp.gpt_config_of(model).vocab_size
        plan = {**tp.gpt_plan("split" if vocab % args.devices == 0 else "replicate"), "*attn.c_attn": tp.Replicate()}
        return _strategy_mod.Strategy("tp", plan=plan)
    linears = [str(i) for i in range(0, 2 * (len(args.hidden) + 1), 2)]  # nn.MLP: Linear, activation, ...
    plan = {name: tp.ColwiseParallel() if i % 2 == 0 else tp.RowwiseParallel()
            for i, name in enumerate(linears[:len(linears) // 2 * 2])}
    if not plan:
        raise UsageError("--parallel tp splits the MLP's hidden layers; give it one (--hidden 128)")
    return _strategy_mod.Strategy("tp", plan=plan)


def _check_tp(args) -> None:
    """--parallel tp has a plan for --model mlp and gpt, whose widths --devices must divide."""
    if args.parallel != "tp":
        return
    if args.model == "gpt":
        if args.n_embd % args.devices:
            raise UsageError(f"--parallel tp splits the GPT's MLP and attention projection over --devices "
                             f"{args.devices}, which does not divide --n-embd {args.n_embd}; use an --n-embd that is "
                             f"a multiple of {args.devices}")
        return
    if args.model != "mlp":
        why = {"cnn": "funcnet train has no plan for the ConvNet; from Python: fit(strategy=Strategy('tp', plan=...))",
               "lstm": "an LSTM's gates are packed in one matrix, which no column/row plan splits whole"}[args.model]
        raise UsageError(f"--parallel tp takes --model mlp or gpt; for --model {args.model}: {why}; or use --parallel "
                         f"fsdp, zero1 or zero2")
    hidden = args.hidden or [128]
    split = hidden[0:2 * ((len(hidden) + 1) // 2):2]  # a column-parallel layer's outputs, its row partner's inputs
    bad = [h for h in split if h % args.devices]
    if bad:
        raise UsageError(f"--parallel tp splits each hidden layer over --devices {args.devices}, which does not "
                         f"divide --hidden {' '.join(map(str, hidden))}; use widths that are multiples of "
                         f"{args.devices}")


_PIPE_FLAGS = ("stages", "schedule", "microbatches")


def _given(args, names) -> list[str]:  # the flags among names (argparse destinations) that the user set
    return [f"--{k.replace('_', '-')}" for k in names if getattr(args, k) is not None]


def _check_pipe(args) -> None:
    """--parallel pipe (and its --stages, --schedule, --microbatches) for a model the pipeline can
    split: the MLP's Linear layers evenly, the GPT's blocks; refused here, before anything compiles."""
    if args.parallel != "pipe":
        if given := _given(args, _PIPE_FLAGS):
            raise UsageError(f"{', '.join(given)} set the pipeline of --parallel pipe; add --parallel pipe "
                             f"--devices N or leave {'them' if len(given) > 1 else 'it'} out")
        return
    args.stages = args.stages or args.devices
    args.schedule = args.schedule or "1f1b"
    args.microbatches = args.microbatches or args.stages
    if args.devices % args.stages:
        raise UsageError(f"--stages {args.stages} does not divide --devices {args.devices} (the data axis is "
                         f"--devices / --stages); use --devices a multiple of {args.stages}")
    if args.model in ("cnn", "lstm"):
        why = {"cnn": "the ConvNet's BatchNorm keeps running statistics, which the pipeline's stages do not carry",
               "lstm": "its layers run as one LSTM module, which no even split cuts"}[args.model]
        raise UsageError(f"--parallel pipe takes --model mlp or gpt; for --model {args.model}: {why}; use --parallel "
                         f"shard_map, fsdp, zero1 or zero2")
    if args.precision != "fp32":
        raise UsageError(f"--parallel pipe trains in float32; leave out --precision {args.precision}")
    if args.model == "mlp":
        layers = len(args.hidden or [128]) + 1
        if layers < args.stages:
            raise UsageError(f"--parallel pipe splits the MLP's {layers} Linear layers into --stages {args.stages}; "
                             f"use at most {layers} stages or more --hidden layers")
        if args.stream is not None:
            raise UsageError("--parallel pipe traces the MLP on arrays, not --stream records; leave out --stream "
                             "or use --parallel shard_map")
    elif args.n_layer % args.stages:
        raise UsageError(f"--parallel pipe splits the GPT's --n-layer {args.n_layer} blocks into --stages "
                         f"{args.stages}, which does not divide it; use a divisor of {args.n_layer}")
    per = args.microbatches * (args.devices // args.stages)
    if args.batch_size % per:
        raise UsageError(f"--batch-size {args.batch_size} does not split into --microbatches {args.microbatches} on "
                         f"each of {args.devices // args.stages} data devices; use a multiple of {per}")


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
    _check_tp(args)
    _check_pipe(args)
    try:
        parallel.simulate_cpu_devices(args.devices)
    except RuntimeError as e:
        raise UsageError(str(e)) from None


_GPT_FLAGS = {"block_size": 64, "n_layer": 3, "n_head": 4, "n_embd": 96, "sample_chars": 200, "remat": None}
_LSTM_FLAGS = {"block_size": 64, "n_layer": 2, "n_embd": 128, "sample_chars": 200}
_TEXT_MODELS = ("gpt", "lstm")


def _check_model_flags(args) -> None:
    """--model and --dataset go together (gpt and lstm read text, the others images or features);
    the text models' flags get their defaults, and are refused for the models without them."""
    if args.dataset is None:
        args.dataset = "text" if args.model in _TEXT_MODELS else "digits"
    if (args.model in _TEXT_MODELS) != (args.dataset == "text"):
        raise UsageError(f"--model {args.model} does not train on --dataset {args.dataset}: --model gpt and --model "
                         f"lstm read --dataset text and the other models read digits, mnist or synthetic")
    if args.model == "lstm":
        given = _given(args, [k for k in _GPT_FLAGS if k not in _LSTM_FLAGS])
        if given:
            raise UsageError(f"{', '.join(given)} set the GPT; --model lstm has no such setting: leave "
                             f"{'them' if len(given) > 1 else 'it'} out or pass --model gpt")
        for k, default in _LSTM_FLAGS.items():
            if getattr(args, k) is None:
                setattr(args, k, default)
        return
    if args.model != "gpt":
        given = _given(args, _GPT_FLAGS)
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
    if args.parallel != "pipe":
        _check_pipe(args)  # --stages, --schedule, --microbatches need --parallel pipe
    if args.out is None:  # one default per model: a cnn run never replaces the mlp run's outputs
        args.out = f"runs/train-{args.model}"
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
