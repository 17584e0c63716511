"""Reprs against torch's: every layer of the layer tables prints as ``repr(torch_layer)`` when the
constructor arguments match, and modules with children print torch's tree (``print(model)``)."""

import jax.numpy as jnp
import pytest
import torch

from comparisons.recurrent import RNNModel
from funcnet import models, nn
from tests import (test_nn_activation, test_nn_attention, test_nn_conv, test_nn_embedding, test_nn_norm,
                   test_nn_pooling, test_nn_recurrent, test_nn_transformer)


def _rows():
    for name, ours, theirs, _ in test_nn_activation.TABLE:
        yield f"activation-{name}", ours, theirs
    for table, family in ((test_nn_conv.TABLE, "conv"), (test_nn_pooling.TABLE, "pooling")):
        for name, cls, args, kwargs, _ in table:
            yield (f"{family}-{name}", lambda cls=cls, a=args, k=kwargs: getattr(nn, cls)(*a, **k),
                   lambda cls=cls, a=args, k=kwargs: getattr(torch.nn, cls)(*a, **k))
    for row in test_nn_norm.TABLE:
        ours, theirs, _ = row.values
        if row.id != "syncbn_local":  # SyncBatchNorm against BatchNorm2d: different classes, different reprs
            yield f"norm-{row.id}", lambda ours=ours: ours(jnp.float32), theirs
    for name, kwargs in test_nn_embedding.CASES:
        yield (f"embedding-{name}", lambda k=kwargs: nn.Embedding(10, 4, **k),
               lambda k=kwargs: torch.nn.Embedding(10, 4, **k))
    E, H = test_nn_attention.E, test_nn_attention.H
    for name, (ctor, _, _) in test_nn_attention.CASES.items():
        ctor = {"num_heads": H, **ctor}
        yield (f"attention-{name}", lambda c=ctor: nn.MultiheadAttention(E, **c),
               lambda c=ctor: torch.nn.MultiheadAttention(E, **c))
    t = test_nn_transformer
    for name, (ctor, _, _) in t.CASES.items():
        yield (f"encoder-{name}", lambda c=ctor: nn.TransformerEncoderLayer(t.D, t.NHEAD, t.FF, **c),
               lambda c=ctor: torch.nn.TransformerEncoderLayer(t.D, t.NHEAD, t.FF, **c))
    for name, (ours_ctor, torch_ctor, _, _) in t.DEC_CASES.items():
        yield (f"decoder-{name}", lambda c=ours_ctor: nn.TransformerDecoderLayer(t.D, t.NHEAD, t.FF, **c),
               lambda c=torch_ctor or ours_ctor: torch.nn.TransformerDecoderLayer(t.D, t.NHEAD, t.FF, **c))
    r = test_nn_recurrent
    for name, (kind, ctor, *_) in r.CASES.items():
        ours_cls, torch_cls = r.KINDS[kind]
        yield (f"recurrent-{name}", lambda o=ours_cls, c=ctor: o(r.I, r.H, **c),
               lambda t=torch_cls, c=ctor: t(r.I, r.H, **c))


ROWS = list(_rows())


@pytest.mark.parametrize("ours, theirs", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_layer_repr_is_torchs(ours, theirs):
    assert repr(ours()) == repr(theirs())


def test_sequential_and_containers_print_torchs_tree():
    ours = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)),
                         nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Tanh()]),
                         nn.ModuleDict({"a": nn.Dropout(0.1), "b": nn.Identity()}))
    theirs = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)),
        torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Tanh()]),
        torch.nn.ModuleDict({"a": torch.nn.Dropout(0.1), "b": torch.nn.Identity()}))
    assert repr(ours) == repr(theirs)
    assert repr(nn.Sequential()) == repr(torch.nn.Sequential()) and repr(nn.ModuleList([])) == "ModuleList()"


def test_composites_print_torchs_tree():
    assert repr(models.LSTMLM(103, 32, 32, 2, dropout=0.0)) == repr(RNNModel(103, 32, 32, 2))
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, activation=nn.GELU()), 3, nn.LayerNorm(8))
    theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, activation=torch.nn.GELU()), 3,
                                         torch.nn.LayerNorm(8), enable_nested_tensor=False)
    assert repr(ours) == repr(theirs)
    assert repr(nn.Transformer(8, 2, 1, 2, 16)) == repr(torch.nn.Transformer(8, 2, 1, 2, 16))
