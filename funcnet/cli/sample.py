"""``funcnet sample RUN_DIR``: text from a GPT or LSTM that ``funcnet train --model gpt|lstm``
saved, read from its ``--out`` folder (metrics.json, params.npz) or its ``--checkpoint-dir``
(the newest checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from funcnet.cli.errors import UsageError

__all__ = ["load_run", "sample_command"]

_TEXT_MODELS = ("gpt", "lstm")


def load_run(run_dir: str):
    """``(config, model, params)`` of the language model saved in ``run_dir``: a ``--out`` folder
    (its params.npz) or a ``--checkpoint-dir`` (its newest checkpoint's parameters)."""
    from funcnet import checkpoint

    path = Path(run_dir)
    if not path.exists():
        raise UsageError(f"RUN_DIR {run_dir} does not exist; pass the --out folder (or the --checkpoint-dir) of "
                         f"funcnet train --model gpt or --model lstm")
    if not path.is_dir():
        raise UsageError(f"RUN_DIR {run_dir} is a file; pass the folder funcnet train --out wrote (metrics.json, "
                         f"params.npz) or its --checkpoint-dir")
    if (path / "metrics.json").is_file() and (path / "params.npz").is_file():
        try:
            config = json.loads((path / "metrics.json").read_text())["config"]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path / 'metrics.json'} is not the metrics.json funcnet train writes ({e}); pass an "
                             f"untouched --out folder") from None
        if not isinstance(config, dict):
            raise UsageError(f"{path / 'metrics.json'} is not the metrics.json funcnet train writes (its config is "
                             f"{type(config).__name__}, not an object); pass an untouched --out folder")
        _check_text_model(config, run_dir)
        model = _model(config, path / "metrics.json")
        return config, model, _from_npz(path / "params.npz", model)
    newest = checkpoint.latest_step(path)
    if newest is None:
        raise UsageError(f"RUN_DIR {run_dir} holds neither metrics.json and params.npz (funcnet train --out) nor a "
                         f"checkpoint (--checkpoint-dir); pass the folder a funcnet train --model gpt|lstm run wrote")
    meta = checkpoint.read_metadata(path, newest)
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        raise UsageError(f"{checkpoint.checkpoint_path(path, newest)} was not written by funcnet train (no flags in "
                         f"its metadata); pass a funcnet train --checkpoint-dir or --out folder")
    _check_text_model(config, run_dir)
    model = _model(config, checkpoint.checkpoint_path(path, newest))
    return config, model, _from_checkpoint(path, newest, model, config)


def _check_text_model(config: dict, run_dir: str) -> None:
    kind = config.get("model", "mlp")
    if kind not in _TEXT_MODELS:
        raise UsageError(f"RUN_DIR {run_dir} holds a --model {kind} run; funcnet sample writes text from a "
                         f"--model gpt or --model lstm run (funcnet train --model gpt --out DIR)")


def _model(config: dict, source: Path):
    from funcnet import text
    from funcnet.cli.train import text_model

    try:
        return text_model(SimpleNamespace(**config), text.vocabulary().size)
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a flag missing, or a value of another type
        raise UsageError(f"{source}: the run's flags there do not build a model ({type(e).__name__}: {e}); the file "
                         f"was edited or is not funcnet train's: pass an untouched --out folder or --checkpoint-dir") \
            from None


def _template(model):
    import jax

    return model.init(jax.random.key(0))


def _from_npz(path: Path, model):
    import numpy as np

    from funcnet import load_state_dict
    from funcnet.state import StateDictError

    import zipfile

    try:
        with np.load(path) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:  # cut short, or a byte changed (the CRC)
        raise UsageError(f"{path} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]}); it is not the "
                         f"params.npz funcnet train wrote: train again, or sample from the run's --checkpoint-dir") \
            from None
    try:
        return load_state_dict(_template(model), arrays)
    except StateDictError as e:
        raise UsageError(f"{path} does not fit {model.name} built from its metrics.json ({e}); either metrics.json "
                         f"was edited (pass an untouched --out folder) or the run was trained under another Python "
                         f"version (the vocabulary is this Python's documentation's: sample with the one that trained "
                         f"it)") from None


def _from_checkpoint(path: Path, step: int, model, config: dict):
    import jax
    import optax

    from funcnet import checkpoint, train
    from funcnet.precision import DynamicLossScale

    tx = optax.adam(config["lr"]) if config.get("optimizer") == "adam" else optax.sgd(config["lr"])
    scale = DynamicLossScale() if config.get("precision") == "fp16" else None
    template = train.create_train_state(model, tx, jax.random.key(0), loss_scale=scale)
    return checkpoint.restore(path, template, step).params


def sample_command(args) -> str:
    """Print and return ``--prompt`` followed by ``--tokens`` sampled characters."""
    import jax

    from funcnet import text

    config, model, params = load_run(args.run_dir)
    vocab = text.vocabulary()
    try:
        vocab.encode(args.prompt)
    except ValueError as e:
        raise UsageError(f"--prompt: {e}") from None
    greedy = args.temperature == 0
    out = text.complete(model, params, args.prompt, args.tokens, key=jax.random.key(args.seed),
                        temperature=1.0 if greedy else args.temperature, top_k=args.top_k, greedy=greedy,
                        block_size=config["block_size"])
    print(out)
    sampled = out[len(args.prompt):] if args.prompt else out
    if sampled and not sampled.strip():
        import sys

        kind = "greedy " if greedy else ""
        print(f"funcnet sample: note: the {len(sampled)} {kind}sampled characters are all blanks ({_blanks(sampled)}): "
              f"the model in {args.run_dir} predicts nothing but whitespace, so it is undertrained; train it longer "
              f"(more --epochs or --max-steps)" + ("" if not greedy else " or sample with --temperature 0.8"),
              file=sys.stderr)
    return out


def _blanks(text: str) -> str:
    names = {" ": "spaces", "\n": "newlines", "\t": "tabs"}
    return ", ".join(names.get(c, repr(c)) for c in sorted(set(text)))
