"""Hugging Face checkpoints: ``from_pretrained(DIR)`` reads a folder as ``save_pretrained`` writes
it (config.json and the weights, no network), builds the torch model with transformers and
converts it; ``generate_greedy`` is greedy decoding with a converted causal LM.

transformers and torch are imported inside the functions: ``import funcnet`` never needs them.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp

from funcnet import nn
from funcnet.interop.trace.registry import ConversionError


def from_pretrained(path: str | os.PathLike, example_inputs: dict | None = None, *, train: bool = False):
    """``(model, params, state, torch_model)`` of the checkpoint folder ``path``.

    The architecture is ``config.json``'s ``architectures[0]`` (a transformers class), loaded
    with ``local_files_only=True`` and ``use_cache=False`` (a pure forward keeps no cache).
    It is traced on ``example_inputs`` (a dict of torch tensors) or, when they are not given,
    on a small input read off the config: ``input_ids`` with an ``attention_mask`` for text,
    ``pixel_values`` for images. ``train=False`` (the default) traces eval mode alone.
    """
    from funcnet.interop.trace.modules import convert

    path = os.fspath(path)
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"from_pretrained: {path!r} has no config.json; expected a folder written by "
                                f"model.save_pretrained(folder) (config.json and model.safetensors)")
    torch_model, config = _torch_model(path)
    inputs = example_inputs if example_inputs is not None else _example(torch_model, config)
    model, params, state = convert(torch_model, train=train, **inputs)
    return model, params, state, torch_model


def _torch_model(path: str):
    """``(torch_model, config)`` of a checkpoint folder: ``architectures[0]`` of its config.json,
    loaded locally with ``use_cache=False``, in eval mode."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ConversionError(f"from_pretrained: {os.path.join(path, 'config.json')} names architectures={names!r}, "
                              f"and transformers {transformers.__version__} has no such class; save the model with "
                              f"save_pretrained (it writes its class there), or build it yourself and use "
                              f"interop.convert")
    try:
        model = cls.from_pretrained(path, local_files_only=True, use_cache=False)
    except Exception as e:  # noqa: BLE001 - named below, or passed on as it was
        if type(e).__name__ == "SafetensorError":  # safetensors' own: a file cut short or a damaged header
            raise ConversionError(f"from_pretrained: {_weights_file(path)} is damaged ({' '.join(str(e).split())}); "
                                  f"it is not a whole safetensors file: save the model again with save_pretrained, "
                                  f"or copy the file again") from None
        mismatch = _first_mismatch(cls, config, path) if isinstance(e, RuntimeError) else None
        if mismatch is None:
            raise
        raise ConversionError(f"from_pretrained: {os.path.join(path, 'config.json')} does not match the weights in "
                              f"{_weights_file(path)}: {mismatch}; use the config.json saved with these weights "
                              f"(save_pretrained writes both)") from None
    return model.eval(), config


def _weights_file(path: str) -> str:
    """The weights file(s) of a checkpoint folder, for messages."""
    names = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".bin")))
    return os.path.join(path, names[0]) if len(names) == 1 else f"the weights files of {path} ({', '.join(names)})"


def _first_mismatch(cls, config, path: str) -> str | None:
    """``"KEY: the file holds [..], config.json makes [..] (and N more)"`` for a checkpoint whose
    config builds parameters of other shapes than its safetensors files hold; None if none differ."""
    import torch
    from safetensors import safe_open

    try:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
        held = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(path, name), framework="pt") as f:
                    held.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    except Exception:  # noqa: BLE001 - the comparison is a courtesy; the original error stands
        return None
    bad = [k for k in held if k in expected and held[k] != expected[k]]
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return (f"{bad[0]}: the file holds {list(held[bad[0]])}, config.json makes {list(expected[bad[0]])}{more}")


def _example(torch_model, config) -> dict:
    import torch

    kind = getattr(torch_model, "main_input_name", "input_ids")
    if kind == "input_ids" and getattr(config, "vocab_size", None):
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (2, 8), generator=gen)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind == "pixel_values" and getattr(config, "image_size", None):
        size = config.image_size
        return {"pixel_values": torch.randn(2, getattr(config, "num_channels", 3), size, size)}
    raise ConversionError(f"from_pretrained: cannot make an example input for {type(torch_model).__name__} "
                          f"(its main input is {kind!r}); pass example_inputs={{{kind!r}: tensor, ...}}")


def generate_greedy(model, params, input_ids: Any, max_new_tokens: int, *, state: dict | None = None):
    """``input_ids`` (batch, length) followed by ``max_new_tokens`` tokens, each the argmax of the
    converted causal LM's last logits, as torch's ``generate(do_sample=False)`` without an end
    token. The sequence lives in one buffer of the final length, later positions masked out, so
    one compiled forward serves every step."""
    ids = jnp.asarray(input_ids)
    if ids.ndim != 2 or max_new_tokens < 1:
        raise ValueError(f"generate_greedy: expected input_ids of shape (batch, length) and max_new_tokens >= 1, "
                         f"got shape {ids.shape} and {max_new_tokens}")
    batch, start = ids.shape
    total = start + max_new_tokens
    buffer = jnp.zeros((batch, total), ids.dtype).at[:, :start].set(ids)

    @jax.jit
    def step(buffer, t):
        mask = (jnp.arange(total) < t).astype(buffer.dtype)[None].repeat(batch, 0)
        out, _ = nn.call(model, params, state or {}, input_ids=buffer, attention_mask=mask, train=False)
        logits = jax.lax.dynamic_index_in_dim(out["logits"], t - 1, axis=1, keepdims=False)
        return buffer.at[:, t].set(jnp.argmax(logits, axis=-1).astype(buffer.dtype))

    for t in range(start, total):
        buffer = step(buffer, t)
    return buffer
