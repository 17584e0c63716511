"""funcnet.text: the pydoc_data.topics character data set against closed forms."""

import math

import jax
import numpy as np
import pytest
from pydoc_data.topics import topics

from funcnet import text


def test_corpus_is_every_topic_once_and_the_vocabulary_covers_it():
    corpus = text.corpus()
    assert len(topics) == 79 and len(corpus) == sum(map(len, topics.values())) + len(topics) - 1
    assert all(t in corpus for t in topics.values())
    assert corpus.startswith(topics[min(topics)]) and corpus.endswith(topics[max(topics)])
    vocab = text.vocabulary()
    assert list(vocab.chars) == sorted(set(vocab.chars)) and set(vocab.chars) == set(corpus)
    assert vocab.size == len(vocab.chars) and "\n" in vocab.chars and " " in vocab.chars
    ids = vocab.encode("def f(x):\n    return x")
    assert ids.dtype == np.int32 and [vocab.chars[i] for i in ids] == list("def f(x):\n    return x")
    assert vocab.decode(ids) == "def f(x):\n    return x"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.encode("\u2603")
    with pytest.raises(ValueError, match="expected"):
        vocab.decode([vocab.size])


def test_split_is_90_10_by_position_and_disjoint():
    train, val = text.tokens("train"), text.tokens("val")
    n = len(text.corpus())
    assert len(train) == int(0.9 * n) and len(train) + len(val) == n
    # the two splits are the corpus, in order: train is a prefix, val the rest
    assert text.vocabulary().decode(train) + text.vocabulary().decode(val) == text.corpus()
    with pytest.raises(ValueError):
        train[0] = 1  # read-only: a cached array nobody may change
    with pytest.raises(ValueError, match="'train' or 'val'"):
        text.tokens("test")


@pytest.mark.parametrize("block_size,stride", [(4, None), (4, 1), (5, 3), (7, 10)])
def test_blocks_are_contiguous_and_shifted_by_one(block_size, stride):
    ids = np.arange(100, 153, dtype=np.int32)  # 53 distinct ids: positions are readable off values
    x, y = text.blocks(ids, block_size, stride)
    s = block_size if stride is None else stride
    n = (len(ids) - block_size - 1) // s + 1
    assert x.shape == y.shape == (n, block_size) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(x[:, 0], ids[0] + s * np.arange(n))  # block i starts at i * stride
    np.testing.assert_array_equal(x, x[:, :1] + np.arange(block_size))  # contiguous
    np.testing.assert_array_equal(y, x + 1)  # next id at every position
    assert y[-1, -1] <= ids[-1] and (n * s + block_size >= len(ids))  # the last full block is kept


def test_blocks_refuse_too_short_inputs_and_bad_sizes():
    with pytest.raises(ValueError, match="cannot make one block"):
        text.blocks(np.arange(4), 4)
    with pytest.raises(ValueError, match="positive int"):
        text.blocks(np.arange(10), 0)
    with pytest.raises(ValueError, match="positive int"):
        text.blocks(np.arange(10), 3, stride=0)


def test_load_text_shapes_shuffle_and_no_leak_from_train_into_val():
    bs = 16
    (x_tr, y_tr), (x_va, y_va) = text.load_text(bs)
    n_train, n_val = len(text.tokens("train")), len(text.tokens("val"))
    assert x_tr.shape == y_tr.shape == ((n_train - bs - 1) // bs + 1, bs)
    assert x_va.shape == y_va.shape == ((n_val - bs - 1) // bs + 1, bs)
    assert x_tr.dtype == np.int32 and int(x_tr.max()) < text.vocabulary().size
    # the last training target sits at position (N-1)*bs + bs < n_train: nothing from val
    assert (len(x_tr) - 1) * bs + bs < n_train
    np.testing.assert_array_equal(x_va[0], text.tokens("val")[:bs])

    key = jax.random.key(7)
    (xs, ys), (xv, _) = text.load_text(bs, key=jax.random.clone(key))
    perm = np.asarray(jax.random.permutation(key, len(x_tr)))
    np.testing.assert_array_equal(xs, x_tr[perm])
    np.testing.assert_array_equal(ys, y_tr[perm])
    np.testing.assert_array_equal(xv, x_va)  # validation stays in order
    (xo, _), _ = text.load_text(bs, key=jax.random.key(8))
    assert not np.array_equal(xo, xs)


def test_unigram_entropy_matches_closed_forms():
    assert text.unigram_entropy(np.array([0, 0, 1, 1])) == pytest.approx(math.log(2), abs=1e-15)
    assert text.unigram_entropy(np.arange(8)) == pytest.approx(math.log(8), abs=1e-15)
    assert text.unigram_entropy(np.array([3, 3, 3])) == 0.0
    p = np.array([0.5, 0.25, 0.25])
    assert text.unigram_entropy(np.array([0, 0, 1, 2])) == pytest.approx(-(p * np.log(p)).sum(), abs=1e-15)
    h = text.unigram_entropy()  # the train split: between 0 and log(vocabulary size)
    assert 2.5 < h < math.log(text.vocabulary().size)
    assert text.bits_per_char(math.log(2)) == pytest.approx(1.0)


def test_complete_returns_the_prompt_and_the_new_characters():
    from funcnet.gpt import GPT, GPTConfig

    vocab = text.vocabulary()
    model = GPT(GPTConfig(block_size=8, vocab_size=vocab.size, n_layer=1, n_head=2, n_embd=8))
    params = model.init(jax.random.key(0))
    a = text.complete(model, params, "def ", 6, key=jax.random.key(1), greedy=True)
    assert a.startswith("def ") and len(a) == 10 and set(a) <= set(vocab.chars)
    assert text.complete(model, params, "def ", 6, key=jax.random.key(2), greedy=True) == a  # greedy: no key
    assert len(text.complete(model, params, "", 5, key=jax.random.key(3))) == 5  # from "\n", dropped
