"""state_dict / load_state_dict: torch's keys, strict errors that list every problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import funcnet
from funcnet import nn


def test_load_torch_state_dict_without_renaming():
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    model = nn.MLP([10, 5, 2])
    params = funcnet.load_state_dict(model.init(jax.random.key(0)), theirs.state_dict())
    for key, tensor in theirs.state_dict().items():
        np.testing.assert_array_equal(np.asarray(funcnet.state_dict(params)[key]), tensor.numpy())


def test_strict_load_lists_every_problem_at_once():
    params = nn.MLP([10, 5, 2]).init(jax.random.key(0))
    sd = dict(funcnet.state_dict(params))
    del sd["0.bias"]
    sd["4.weight"] = np.zeros((1, 1))
    sd["2.weight"] = np.zeros((3, 5))
    with pytest.raises(funcnet.StateDictError) as err:
        funcnet.load_state_dict(params, sd)
    msg = str(err.value)
    assert "missing keys: 0.bias" in msg
    assert "unexpected keys: 4.weight" in msg
    assert "2.weight: expected shape (2, 5), got (3, 5)" in msg


def test_non_strict_skips_keys_but_not_shape_mismatches():
    params = nn.MLP([10, 5, 2]).init(jax.random.key(0))
    sd = {"0.weight": np.ones((5, 10), np.float32), "extra": np.zeros(1)}
    loaded = funcnet.load_state_dict(params, sd, strict=False)
    assert np.all(np.asarray(loaded["0"]["weight"]) == 1)
    np.testing.assert_array_equal(np.asarray(loaded["2"]["weight"]), np.asarray(params["2"]["weight"]))
    with pytest.raises(funcnet.StateDictError, match="expected shape"):
        funcnet.load_state_dict(params, {"0.weight": np.ones((10, 5))}, strict=False)


def test_values_cast_to_template_dtype_and_leave_input_untouched():
    params = nn.Linear(3, 2).init(jax.random.key(0))
    sd = {"weight": np.ones((2, 3), np.float64), "bias": np.zeros(2, np.float64)}
    with pytest.raises(funcnet.StateDictError, match="a lossy cast"):  # float64 -> float32 only when asked
        funcnet.load_state_dict(params, sd)
    loaded = funcnet.load_state_dict(params, sd, cast=True)
    assert loaded["weight"].dtype == jnp.float32
    assert not np.all(np.asarray(params["weight"]) == 1)


def test_bad_state_dict_type():
    params = nn.Linear(3, 2).init(jax.random.key(0))
    with pytest.raises(TypeError, match="expected a mapping of dotted keys"):
        funcnet.load_state_dict(params, [1, 2])
