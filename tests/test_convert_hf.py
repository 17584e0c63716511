"""interop.from_pretrained on a folder written by transformers' save_pretrained (no network), and
greedy generation with the converted causal LM against torch's generate(do_sample=False); the same
folder through `funcnet port --hf DIR`, whose written module and weights load and match torch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from funcnet import interop  # noqa: E402

VOCAB = 100


# weights drawn wider than transformers' default (0.02): a tiny random model then writes varied
# sequences, not one token repeated, so greedy decoding is a real comparison


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        initializer_range=0.5))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=None, eos_token_id=None,
        initializer_range=0.5))


def _bloom():
    # its attention calls torch.baddbmm(alibi, batch1=q, batch2=k): the arguments by keyword
    return transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, initializer_range=0.5))


def _mamba():
    # the slow path (use_associative_scan=False, no kernels): a Python loop over the positions
    module = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=8, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=3,
        use_associative_scan=False, bos_token_id=None, eos_token_id=None, pad_token_id=None))
    with torch.no_grad():  # its initialisation is its own (A_log, dt): the projections drawn wider instead
        for name, p in module.named_parameters():
            if name.endswith("proj.weight"):
                p.normal_(0, 0.5)
    return module


@pytest.fixture(scope="module", params=["llama", "bloom", pytest.param("mamba", marks=pytest.mark.slow),
                                               pytest.param("gpt2", marks=pytest.mark.slow)])
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    module = {"llama": _llama, "gpt2": _gpt2, "bloom": _bloom, "mamba": _mamba}[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    module.save_pretrained(folder)
    model, params, state, torch_model = interop.from_pretrained(folder)
    return model, params, state, torch_model


def test_a_checkpoint_folder_converts_and_matches_torch_on_a_fresh_input(saved):
    model, params, _, torch_model = saved
    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    with torch.no_grad():
        want = torch_model(input_ids=ids, attention_mask=mask).logits.numpy()
    got = np.asarray(model.apply(params, input_ids=jnp.asarray(ids.numpy()),
                                 attention_mask=jnp.asarray(mask.numpy()))["logits"])
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-5  # float32, 2 layers of width 32-64


def test_greedy_generation_of_20_tokens_equals_torch_generate(saved):
    model, params, state, torch_model = saved
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = torch_model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=20, min_new_tokens=20)
    got = interop.generate_greedy(model, params, jnp.asarray(prompt.numpy()), 20, state=state)
    assert want.shape == (2, 25) and all(len(np.unique(row)) > 3 for row in want[:, 5:].numpy())  # varied
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


def _port(module, folder):
    """`funcnet port --hf` on ``module`` saved in ``folder``: the written module, built, and the written weights."""
    import safetensors.torch

    import funcnet
    from funcnet.cli import main

    module.save_pretrained(folder / "checkpoint")
    out, weights = folder / "port.py", folder / "port.safetensors"
    assert main(["port", "--hf", str(folder / "checkpoint"), "--out", str(out), "--weights", str(weights)]) == 0
    scope: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), scope)  # noqa: S102 (the written module)
    model = scope[type(module).__name__]()
    params = funcnet.load_state_dict(jax.eval_shape(model.init, jax.random.key(0)),
                                     safetensors.torch.load_file(weights))
    return model, params


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """`funcnet port --hf` on a saved Llama: the torch model, and the written module with the written weights."""
    torch.manual_seed(0)
    module = _llama().eval()
    return module, *_port(module, tmp_path_factory.mktemp("llama_port"))


def test_port_hf_writes_a_module_and_weights_that_match_torch_on_a_fresh_input(ported):
    module, model, params = ported
    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[2, -3:] = 0
    with torch.no_grad():
        want = module(input_ids=ids, attention_mask=mask).logits.numpy()
    forward = jax.jit(lambda p, i, m: model.apply(p, input_ids=i, attention_mask=m)["logits"])
    got = np.asarray(forward(params, jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy())))
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-5  # float32, 2 layers of width 32-64


def test_port_hf_greedy_generation_of_20_tokens_equals_torch_generate(ported):
    module, model, params = ported
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        want = module.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=20,
                               min_new_tokens=20)
    got = interop.generate_greedy(model, params, jnp.asarray(prompt.numpy()), 20)
    assert all(len(np.unique(row)) > 3 for row in want[:, 4:].numpy())  # varied, not one token repeated
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


# Mamba slow (5-7 s each, the unrolled loop compiled at 25 positions): tests/test_convert_shapes.py checks its port
# is written with the loop and equals torch at other lengths by default
@pytest.mark.parametrize("make", [_bloom, pytest.param(_mamba, marks=pytest.mark.slow)], ids=["bloom", "mamba"])
def test_port_hf_generates_torchs_20_greedy_tokens(make, tmp_path):
    # Bloom's attention calls torch.baddbmm(alibi, batch1=q, batch2=k): the port once wrote a call that raised.
    # Mamba's slow path loops over positions (`for i in range(seq_len)`): the port once unrolled it at the
    # example's length and refused every other, so generation (which grows the length) could not run
    torch.manual_seed(0)
    module = make().eval()
    model, params = _port(module, tmp_path)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = module.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=20,
                               min_new_tokens=20)
    got = interop.generate_greedy(model, params, jnp.asarray(prompt.numpy()), 20)
    assert all(len(np.unique(row)) > 3 for row in want[:, 5:].numpy())  # varied, not one token repeated
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.mark.parametrize("flags, message", [
    (["--hf", "{missing}"], r"--hf .*missing: no .*config.json; expected a folder written by model.save_pretrained"),
    (["net.py:Net", "--hf", "{folder}"], r"both net.py:Net and --hf .*: pass one model"),
    (["--hf", "{folder}", "--input-shape", "1,3"], r"with --input-shape: a checkpoint's config.json builds"),
    ([], r"no model: pass FILE.py:Class .* or --hf DIR"),
])
def test_port_hf_refuses_bad_flags_in_one_line(flags, message, tmp_path, capsys):
    import re

    from funcnet.cli import main

    (tmp_path / "config.json").write_text("{}")
    flags = [f.format(missing=tmp_path / "missing", folder=tmp_path) for f in flags]
    assert main(["port", *flags, "--out", str(tmp_path / "x.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_a_folder_without_config_is_named_with_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config.json; expected a folder written by .*save_pretrained"):
        interop.from_pretrained(tmp_path)
