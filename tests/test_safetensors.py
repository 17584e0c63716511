"""save_safetensors / load_safetensors: files that torch's safetensors writes and reads, no torch needed.

The oracles are torch's own safetensors functions (save_file/load_file, save_model/load_model)
and the bits of the tensors they wrote or read.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.torch as st
import torch
from torch import nn as tnn

import funcnet
from funcnet import interop, nn


def bits(array):
    array = np.asarray(array)
    return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind == "f" or array.dtype == ml_dtypes.bfloat16 \
        else array


def torch_bits(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return bits(t.numpy())


SPECIAL = [0.0, -0.0, float("inf"), float("nan"), 1e-40, 1 / 3]


def torch_tensors():
    g = torch.Generator().manual_seed(0)
    f32 = torch.randn(3, 6, generator=g)
    f32[0, :len(SPECIAL)] = torch.tensor(SPECIAL)
    return {"fc.weight": f32, "fc.bias": torch.randn(3, generator=g).bfloat16(),
            "bn.num_batches_tracked": torch.tensor(2**40, dtype=torch.int64)}


def test_file_written_by_torch_loads_with_equal_bits(tmp_path):
    path = tmp_path / "torch.safetensors"
    tensors = torch_tensors()
    st.save_file(tensors, path)
    sd = interop.load_safetensors(path)
    assert sd.keys() == tensors.keys()
    assert sd["fc.bias"].dtype == ml_dtypes.bfloat16 and sd["bn.num_batches_tracked"].dtype == np.int64
    for k, t in tensors.items():
        np.testing.assert_array_equal(bits(sd[k]), torch_bits(t), err_msg=k)


def test_torch_file_loads_into_a_funcnet_model_float32_and_bf16(tmp_path):
    torch.manual_seed(1)
    net = tnn.Sequential(tnn.Linear(4, 3), tnn.ReLU(), tnn.Linear(3, 2))
    for dtype in (torch.float32, torch.bfloat16):
        net = net.to(dtype)
        st.save_file(net.state_dict(), tmp_path / "m.safetensors")
        jdtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
        model = nn.Sequential(nn.Linear(4, 3, dtype=jdtype), nn.ReLU(), nn.Linear(3, 2, dtype=jdtype))
        params = funcnet.load_state_dict(model.init(jax.random.key(0)),
                                         interop.load_safetensors(tmp_path / "m.safetensors"))
        for k, t in net.state_dict().items():
            got = funcnet.state_dict(params)[k]
            assert got.dtype == jdtype, k
            np.testing.assert_array_equal(bits(got), torch_bits(t), err_msg=k)


def test_float64_torch_file_loads_bitwise_under_x64(tmp_path):
    t = torch.randn(5, 3, dtype=torch.float64)
    t[0, :3] = torch.tensor([-0.0, 5e-324, float("nan")], dtype=torch.float64)
    st.save_file({"weight": t, "bias": torch.zeros(5, dtype=torch.float64)}, tmp_path / "f64.safetensors")
    with jax.enable_x64(True):
        model = nn.Linear(3, 5, dtype=jnp.float64)
        params = funcnet.load_state_dict(model.init(jax.random.key(0)),
                                         interop.load_safetensors(tmp_path / "f64.safetensors"))
        assert params["weight"].dtype == jnp.float64
        np.testing.assert_array_equal(bits(params["weight"]), torch_bits(t))


def test_file_written_by_funcnet_loads_in_torch_with_equal_bits(tmp_path):
    tensors = torch_tensors()
    with jax.enable_x64(True):  # so the int64 counter stays int64 on the way through
        params, state = interop.from_torch_with_state(tensors)
        interop.save_safetensors(tmp_path / "ours.safetensors", params, state, metadata={"format": "pt"})
    back = st.load_file(tmp_path / "ours.safetensors")
    assert back.keys() == tensors.keys()
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype, k
        np.testing.assert_array_equal(torch_bits(back[k]), torch_bits(t), err_msg=k)
    from safetensors import safe_open

    with safe_open(tmp_path / "ours.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_model_state_round_trips_through_a_file_into_torch(tmp_path):
    torch.manual_seed(2)
    net = tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4))
    net(torch.randn(5, 3))  # move the running statistics
    params, state = interop.from_torch_with_state(net)
    interop.save_safetensors(tmp_path / "bn.safetensors", params, state)
    fresh = tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4))
    missing, unexpected = st.load_model(fresh, tmp_path / "bn.safetensors")
    assert not missing and not unexpected
    for k, t in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], t), k


class TinyGPT(tnn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = tnn.ModuleDict({"wte": tnn.Embedding(7, 4)})
        self.lm_head = tnn.Linear(4, 7, bias=False)
        self.transformer.wte.weight = self.lm_head.weight


def test_tied_parameters_are_stored_once_as_torchs_save_model_does(tmp_path):
    torch.manual_seed(3)
    net = TinyGPT()
    params = interop.from_torch(net)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    interop.save_safetensors(ours, params)
    st.save_model(net, theirs)
    from safetensors import safe_open

    with safe_open(ours, framework="np") as f:  # one tensor; the tie recorded in the metadata
        assert list(f.keys()) == ["transformer.wte.weight"]
        assert f.metadata() == {"lm_head.weight": "transformer.wte.weight"}
    # torch's load_model reads our file and keeps the tie
    fresh = TinyGPT()
    assert st.load_model(fresh, ours) == (set(), [])
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    assert torch.equal(fresh.lm_head.weight, net.lm_head.weight)
    # both files load with every state_dict key, into params that keep the tie
    for path in (ours, theirs):
        sd = interop.load_safetensors(path)
        assert sorted(sd) == sorted(net.state_dict())
        loaded = funcnet.load_state_dict(jax.tree.map(jnp.zeros_like, params), sd)
        assert loaded["lm_head"]["weight"] == nn.Tied("transformer.wte.weight", 2)
        np.testing.assert_array_equal(loaded["transformer"]["wte"]["weight"], net.lm_head.weight.detach().numpy())


def test_failed_write_leaves_the_existing_file_byte_identical(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    interop.save_safetensors(path, params)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="'bad' holds .*expected a numeric array"):
        interop.save_safetensors(path, {"w": jnp.ones(3), "bad": "not an array"})
    assert path.read_bytes() == before

    # a write that dies halfway through: the partial bytes go to a temp file that is removed
    import safetensors.numpy

    def dies_midway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", dies_midway)
    with pytest.raises(OSError, match="disk full"):
        interop.save_safetensors(path, {"w": jnp.zeros((2, 3))})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    np.testing.assert_array_equal(interop.load_safetensors(path)["w"], np.arange(6.0).reshape(2, 3))


def test_bad_metadata_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match="metadata values must be str, got 'epoch': int"):
        interop.save_safetensors(tmp_path / "m.safetensors", {"w": jnp.ones(2)}, metadata={"epoch": 3})
    assert not os.listdir(tmp_path)


def test_safetensors_functions_work_without_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # import torch now raises ImportError
        import jax, jax.numpy as jnp, numpy as np
        from funcnet import interop, nn
        import funcnet
        model = nn.Linear(3, 2, dtype=jnp.bfloat16)
        params = model.init(jax.random.key(0))
        path = {str(tmp_path / "no_torch.safetensors")!r}
        interop.save_safetensors(path, params)
        sd = interop.load_safetensors(path)
        back = funcnet.load_state_dict(model.init(jax.random.key(1)), sd)
        assert back["weight"].dtype == jnp.bfloat16
        assert np.array_equal(np.asarray(back["weight"]).view(np.uint16), np.asarray(params["weight"]).view(np.uint16))
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        print("ok")
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ----------------------------------------------------------------------------- 0-d arrays
def bn_models():
    """A funcnet Linear + BatchNorm1d with moved statistics (num_batches_tracked, a 0-d buffer, at 7)
    and its torch twin."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = model.init(jax.random.key(4))
    keys = jax.random.split(jax.random.key(5), 2)
    state = {"1": {"running_mean": jax.random.normal(keys[0], (4,)),
                   "running_var": jax.random.uniform(keys[1], (4,), minval=0.5, maxval=2.0),
                   "num_batches_tracked": jnp.asarray(7, jnp.int32)}}
    return model, params, state, tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4))


def test_a_funcnet_file_keeps_0d_shapes_for_torch_strict_load_and_for_funcnet(tmp_path):
    model, params, state, twin = bn_models()
    path = tmp_path / "bn.safetensors"
    interop.save_safetensors(path, params, state)
    written = st.load_file(path)
    assert {k: tuple(t.shape) for k, t in written.items()} == {k: tuple(t.shape) for k, t in twin.state_dict().items()}
    twin.load_state_dict(written, strict=True)
    for k, v in funcnet.state_dict(params, state).items():
        np.testing.assert_array_equal(twin.state_dict()[k].numpy(), np.asarray(v), err_msg=k)
    assert twin[1].num_batches_tracked.shape == () and int(twin[1].num_batches_tracked) == 7
    # funcnet reads back what it wrote, into a fresh model's templates
    back_params, back_state = funcnet.load_state_dict(model.init(jax.random.key(9)), interop.load_safetensors(path),
                                                      state=model.init_state())
    assert back_state["1"]["num_batches_tracked"].shape == () and int(back_state["1"]["num_batches_tracked"]) == 7
    for k, v in funcnet.state_dict(params, state).items():
        np.testing.assert_array_equal(np.asarray(funcnet.state_dict(back_params, back_state)[k]), np.asarray(v))


def test_a_torch_batchnorm_file_loads_into_a_funcnet_model(tmp_path):
    model, _, _, twin = bn_models()
    twin.train()
    twin(torch.randn(6, 3))
    twin(torch.randn(6, 3))  # num_batches_tracked 2, running statistics moved
    st.save_file(twin.state_dict(), tmp_path / "torch_bn.safetensors")
    params, state = funcnet.load_state_dict(model.init(jax.random.key(0)),
                                            interop.load_safetensors(tmp_path / "torch_bn.safetensors"),
                                            state=model.init_state())
    loaded = funcnet.state_dict(params, state)
    assert loaded.keys() == twin.state_dict().keys()
    for k, t in twin.state_dict().items():
        assert loaded[k].shape == t.shape, k
        np.testing.assert_array_equal(np.asarray(loaded[k]), t.numpy(), err_msg=k)


def test_an_old_file_with_a_0d_buffer_stored_as_shape_1_still_loads(tmp_path):
    # what save_safetensors wrote before it kept 0-d shapes; torch's load_state_dict accepts it too
    model, params, state, _ = bn_models()
    flat = {k: torch.from_numpy(np.array(v)) for k, v in funcnet.state_dict(params, state).items()}
    flat["1.num_batches_tracked"] = flat["1.num_batches_tracked"].reshape(1)
    st.save_file(flat, tmp_path / "old.safetensors")
    _, back_state = funcnet.load_state_dict(model.init(jax.random.key(0)),
                                            interop.load_safetensors(tmp_path / "old.safetensors"),
                                            state=model.init_state())
    assert back_state["1"]["num_batches_tracked"].shape == () and int(back_state["1"]["num_batches_tracked"]) == 7
    # a (2,) array is still a mismatch, not silently squeezed
    flat["1.num_batches_tracked"] = torch.tensor([7, 7], dtype=torch.int32)
    with pytest.raises(funcnet.state.StateDictError, match=r"num_batches_tracked: expected shape \(\), got \(2,\)"):
        funcnet.load_state_dict(model.init(jax.random.key(0)), {k: v for k, v in flat.items()},
                                state=model.init_state())
