r"""A character-level text data set with no download: CPython's own documentation.

``pydoc_data.topics.topics`` ships with every CPython (it backs ``help("assert")``): 79
topics, about 465,000 characters of English prose and code (the exact text depends on the
Python version). The corpus is the topics joined by "\n" in sorted key order; the
vocabulary is its sorted set of characters; the first 90% of the characters train, the
rest validate (by position, as nanoGPT's shakespeare_char). Blocks are contiguous
``block_size + 1`` characters, giving ``x`` (the first block_size ids) and ``y`` (the
last block_size, shifted by one): next-character prediction at every position.

torch counterpart: nanoGPT's ``data/shakespeare_char/prepare.py`` plus ``get_batch``
(which samples random offsets each step; here the offsets are a fixed grid of
``stride``, shuffled by a PRNG key, so ``funcnet.fit`` can scan whole epochs).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import numpy as np

__all__ = ["Vocab", "corpus", "vocabulary", "tokens", "blocks", "load_text", "unigram_entropy", "complete",
           "bits_per_char"]

TRAIN_FRACTION = 0.9


@functools.lru_cache(maxsize=1)
def corpus() -> str:
    r"""The topics of ``pydoc_data.topics`` joined by "\n" in sorted key order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


class Vocab(NamedTuple):
    """``chars``: the sorted characters; id i is ``chars[i]``. ``encode(str) -> int32 ids``,
    ``decode(ids) -> str``."""

    chars: str

    @property
    def size(self) -> int:
        """The number of characters (the model's vocabulary size)."""
        return len(self.chars)

    def encode(self, s: str) -> np.ndarray:
        """The int32 ids of ``s``'s characters; a ValueError names characters outside the vocabulary."""
        index = {c: i for i, c in enumerate(self.chars)}
        missing = sorted(set(s) - set(index))
        if missing:
            raise ValueError(f"encode: characters {missing[:8]} are not in the vocabulary of {self.size} "
                             f"characters of the corpus; remove or replace them")
        return np.fromiter((index[c] for c in s), dtype=np.int32, count=len(s))

    def decode(self, ids) -> str:
        """The text of ``ids``; a ValueError names ids outside ``[0, size)``."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"decode: ids range over [{ids.min()}, {ids.max()}], expected [0, {self.size - 1}]")
        return "".join(self.chars[i] for i in ids.reshape(-1).tolist())


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocab:
    """The sorted set of the corpus's characters (103 on CPython 3.11)."""
    return Vocab("".join(sorted(set(corpus()))))


@functools.lru_cache(maxsize=2)
def _tokens(split: str) -> np.ndarray:
    ids = vocabulary().encode(corpus())
    n_train = int(TRAIN_FRACTION * len(ids))
    out = ids[:n_train] if split == "train" else ids[n_train:]
    out.setflags(write=False)
    return out


def tokens(split: str = "train") -> np.ndarray:
    """The int32 ids of ``split``: "train" is the first ``int(0.9 * len(corpus()))``
    characters, "val" the rest (read-only array)."""
    if split not in ("train", "val"):
        raise ValueError(f"tokens: split must be 'train' or 'val', got {split!r}")
    return _tokens(split)


def blocks(ids, block_size: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous blocks of ``ids``: block i covers ``ids[i*stride : i*stride + block_size + 1]``;
    ``x[i]`` is its first ``block_size`` ids, ``y[i]`` its last ``block_size`` (x shifted by
    one). ``stride`` defaults to ``block_size`` (every id is a target once); 1 gives every
    offset. Returns ``(x, y)``, both ``(N, block_size)`` int32 with
    ``N = (len(ids) - block_size - 1) // stride + 1``."""
    for name, value in (("block_size", block_size), ("stride", stride)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"blocks: {name} must be a positive int, got {value!r}")
    stride = block_size if stride is None else stride
    ids = np.asarray(ids, dtype=np.int32)
    if len(ids) < block_size + 1:
        raise ValueError(f"blocks: {len(ids)} ids cannot make one block of block_size + 1 = {block_size + 1}; "
                         f"use a smaller block_size")
    n = (len(ids) - block_size - 1) // stride + 1
    starts = np.arange(n) * stride
    rows = ids[starts[:, None] + np.arange(block_size + 1)]
    return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])


def load_text(block_size: int, *, stride: int | None = None, key: jax.Array | None = None):
    """``((x_train, y_train), (x_val, y_val))`` of ``blocks`` of the train and validation
    splits, int32 ``(N, block_size)``, the shape ``funcnet.data.load`` returns, ready for
    ``funcnet.fit``. With ``key`` the training blocks come in the order of
    ``jax.random.permutation(key, N)`` (the validation blocks stay in order). The vocabulary
    is ``vocabulary()``; the validation split is never shuffled or overlapped (stride
    ``block_size``) so its loss counts each character once."""
    train = blocks(tokens("train"), block_size, stride)
    val = blocks(tokens("val"), block_size)
    if key is not None:
        perm = np.asarray(jax.random.permutation(key, len(train[0])))
        train = (train[0][perm], train[1][perm])
    return train, val


def unigram_entropy(ids=None) -> float:
    """``-sum_c p_c log p_c`` in nats of the character frequencies of ``ids`` (default: the
    train split): the loss of a model that ignores context, the baseline a language model
    must beat."""
    ids = tokens("train") if ids is None else np.asarray(ids)
    counts = np.bincount(ids.reshape(-1))
    p = counts[counts > 0] / ids.size
    return float(-(p * np.log(p)).sum())


def complete(model, params, prompt: str, max_new_tokens: int, *, key, temperature: float = 1.0,
             top_k: int | None = None, greedy: bool = False, vocab: Vocab | None = None,
             block_size: int | None = None) -> str:
    r"""``prompt`` followed by ``max_new_tokens`` characters from ``funcnet.gpt.generate``
    (an empty prompt starts from "\n", as nanoGPT's sample.py). ``block_size``: the context
    kept, for a model without a GPT's position embedding (the LSTM)."""
    from funcnet.gpt import generate

    vocab = vocabulary() if vocab is None else vocab
    ids = vocab.encode(prompt or "\n")[None]
    out = generate(model, params, ids, max_new_tokens, key=key, temperature=temperature, top_k=top_k,
                   greedy=greedy, block_size=block_size)
    text = vocab.decode(np.asarray(out)[0])
    return text if prompt else text[1:]


def bits_per_char(nats: float) -> float:
    """A loss in nats per character as bits per character."""
    return nats / math.log(2)
