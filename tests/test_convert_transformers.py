"""interop.convert on Hugging Face transformers models built from tiny configs (no download):
BERT, GPT-2 with labels (its loss too), Llama and ViT (and in the slow run T5 with labels, CLIP,
Whisper and Wav2Vec2 with its weight-normed positional conv), each traced on one input and compared with
torch on a fresh one (other values, another batch size and length, padding in another row):
the eval forward and the gradients of every parameter; a ResNet whose wide 3x3 convolutions run
by Winograd's F(2x2, 3x3) at another batch and image size."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import funcnet  # noqa: E402
from funcnet import interop  # noqa: E402

VOCAB = 100


def _text(batch, length, seed, padded_row):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[padded_row, -2:] = 0  # right padding: the masks transformers builds from it must be followed, not baked
    return {"input_ids": ids, "attention_mask": mask}


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(cfg), _text(2, 6, 0, 0), _text(3, 7, 1, 2)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False,
                                  bos_token_id=0, eos_token_id=0)
    trace, fresh = _text(2, 6, 0, 0), _text(3, 7, 1, 1)
    trace["labels"], fresh["labels"] = trace["input_ids"], fresh["input_ids"]
    return transformers.GPT2LMHeadModel(cfg), trace, fresh


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                   use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg), _text(2, 6, 0, 0), _text(3, 7, 1, 2)


def _vit():
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=4)
    gen = torch.Generator().manual_seed(1)
    return (transformers.ViTModel(cfg), {"pixel_values": torch.randn(2, 3, 16, 16)},
            {"pixel_values": torch.randn(3, 3, 16, 16, generator=gen)})


def _t5():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                use_cache=False, decoder_start_token_id=0, pad_token_id=0)
    trace, fresh = _text(2, 6, 0, 0), _text(3, 7, 1, 2)
    trace["labels"], fresh["labels"] = _text(2, 5, 2, 0)["input_ids"], _text(3, 4, 3, 0)["input_ids"]
    return transformers.T5ForConditionalGeneration(cfg), trace, fresh


def _clip():
    cfg = transformers.CLIPConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 32},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 4}, projection_dim=16)
    gen = torch.Generator().manual_seed(1)
    trace, fresh = _text(2, 6, 0, 0), _text(3, 7, 1, 2)
    trace["pixel_values"], fresh["pixel_values"] = torch.randn(2, 3, 16, 16), torch.randn(3, 3, 16, 16, generator=gen)
    return transformers.CLIPModel(cfg), trace, fresh


def _whisper():
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                     max_target_positions=32, use_cache=False, pad_token_id=0, bos_token_id=0,
                                     eos_token_id=0, decoder_start_token_id=0)
    gen = torch.Generator().manual_seed(1)
    trace = {"input_features": torch.randn(2, 8, 32), "decoder_input_ids": _text(2, 6, 0, 0)["input_ids"]}
    fresh = {"input_features": torch.randn(3, 8, 32, generator=gen),
             "decoder_input_ids": _text(3, 7, 1, 0)["input_ids"]}
    return transformers.WhisperModel(cfg), trace, fresh


def _wav2vec2():
    # weight_norm on the positional conv (torch.nn.utils.parametrizations: the weight is computed from
    # parametrizations.weight.original0/1). Train mode is traced too, so its two train-only draws are off: LayerDrop
    # (torch.rand([]) < p, a branch on a draw) and SpecAugment (numpy draws of the masked spans)
    cfg = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                      conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                      num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, layerdrop=0.0,
                                      mask_time_prob=0.0)

    def audio(batch, length, seed, padded_row):
        gen = torch.Generator().manual_seed(seed)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[padded_row, -length // 4:] = 0
        return {"input_values": torch.randn(batch, length, generator=gen), "attention_mask": mask}

    return transformers.Wav2Vec2Model(cfg), audio(2, 400, 0, 0), audio(3, 480, 1, 2)


BUILDERS = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "vit": _vit, "t5": _t5, "clip": _clip, "whisper": _whisper,
            "wav2vec2": _wav2vec2}
HEAVY = ("t5", "clip", "whisper")  # the same checks on more families: in the slow run



@functools.cache
def _converted(name):
    torch.manual_seed(0)
    module, trace, fresh = BUILDERS[name]()
    module.eval()
    model, params, state = interop.convert(module, **trace)
    return name, module, model, params, state, fresh


def _rel(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), theirs.detach().numpy().astype(np.float64)
    assert ours.shape == theirs.shape
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


def _jax(inputs):
    return {k: jnp.asarray(v.numpy()) for k, v in inputs.items()}


# Wav2Vec2 in the slow run too: tests/test_convert_static.py checks its weight norm and bool-mask write in a tiny model
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in (*HEAVY, "wav2vec2") else n
                                  for n in BUILDERS])
def test_eval_forward_matches_torch_on_a_fresh_input(name):
    name, module, model, params, state, fresh = _converted(name)
    with torch.no_grad():
        want = module(**fresh)
    got = jax.jit(lambda p, x: model.apply(p, **x))(params, _jax(fresh))
    keys = [k for k, v in want.items() if isinstance(v, torch.Tensor)]
    assert set(keys) <= set(got), (keys, list(got))
    if name in ("gpt2", "t5"):
        assert "loss" in keys
    # float32 through 2 layers of 32-64 wide matmuls, softmax and layer norms: a few ulps, well under 1e-5
    errors = {k: _rel(got[k], want[k]) for k in keys}
    assert max(errors.values()) <= 1e-5, errors


@pytest.mark.parametrize("name", ["gpt2", "llama", *(pytest.param(n, marks=pytest.mark.slow)
                                                     for n in ("bert", "vit", *HEAVY))])
def test_gradients_match_torch_on_a_fresh_input(name):
    name, module, model, params, state, fresh = _converted(name)
    first = "loss" if name in ("gpt2", "t5") else next(iter(module(**fresh).keys()))
    module.zero_grad()
    out = module(**fresh)[first]
    (out if first == "loss" else out.pow(2).mean()).backward()

    def loss(p, x):
        y = model.apply(p, **x)[first]
        return y if first == "loss" else jnp.mean(y ** 2)

    grads = funcnet.state_dict(jax.jit(jax.grad(loss))(params, _jax(fresh)))
    theirs = {k: p.grad for k, p in module.named_parameters() if p.grad is not None}
    assert theirs and set(theirs) <= set(grads)
    scale = max(float(g.abs().max()) for g in theirs.values())
    # relative to the largest gradient: a gradient that is zero in exact arithmetic is rounding noise in both
    errors = {k: float(np.max(np.abs(np.asarray(grads[k], np.float64) - g.numpy()))) / scale for k, g in theirs.items()}
    assert max(errors.values()) <= 1e-4, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


# Wav2Vec2's float32 gradients are checked in float64 below: its positional conv's bias gets a near-cancelling sum
# (0.03% of the largest gradient), which float32 rounds differently in torch and XLA (1.3e-4 of the largest)


@pytest.mark.slow
def test_three_models_match_torch_in_float64_after_3_sgd_steps():
    # BERT, ViT and Wav2Vec2 (its weight norm): forward, loss, gradients and the parameters after 3 SGD steps on
    # both sides, every dropout at 0; in float64 the two differ by rounding alone (tests/convert_check.py).
    # GPT-2 with labels and Llama are not here: transformers computes their loss (logits.float()) and rotary
    # angles (inv_freq.float()) in float32 even in a float64 model, which bounds the agreement at ~1e-7
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(__file__)
    env = dict(os.environ, JAX_ENABLE_X64="1", XLA_FLAGS="--xla_backend_optimization_level=0")
    run = subprocess.run([sys.executable, os.path.join(here, "convert_check.py"), "float64", "--transformers", "bert",
                          "vit", "wav2vec2"], env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(errors) == {"bert", "vit", "wav2vec2"}
    bad = {name: err for name, err in errors.items() if max(err.values()) >= 1e-10}
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDERS))
def test_to_source_runs_and_matches_torch_on_a_fresh_input(name):
    # the written module, with torch's state_dict loaded strictly, against torch's eval forward
    torch.manual_seed(0)
    module, trace, fresh = BUILDERS[name]()
    module.eval()
    scope: dict = {}
    exec(compile(interop.to_source(module, **trace), f"<port of {name}>", "exec"), scope)
    model = scope[type(module).__name__]()
    params = jax.eval_shape(model.init, jax.random.key(0))
    if model.has_state:
        params, state = funcnet.load_state_dict(params, module.state_dict(),
                                                state=jax.eval_shape(lambda: funcnet.nn.initial_state(model)))
    else:
        params, state = funcnet.load_state_dict(params, module.state_dict()), {}
    with torch.no_grad():
        want = module(**fresh)
    got = jax.jit(lambda p, s, x: funcnet.nn.call(model, p, s, train=False, **x)[0])(params, state, _jax(fresh))
    errors = {k: _rel(got[k], v) for k, v in want.items() if isinstance(v, torch.Tensor)}
    assert errors and max(errors.values()) <= 1e-5, errors  # as the converted model: float32, 2 narrow layers


def test_a_resnet_runs_its_wide_3x3_convolutions_by_winograd_at_another_size(monkeypatch):
    """transformers' ResNet (tiny config, 128 and 256 channels) traced at batch 2, 32 px and run
    at batch 3, 48 px: its 128-channel 3x3 convolutions (12x12 there) go through Winograd's
    F(2x2, 3x3) (``conv_strategy``'s rule) and the float32 output matches torch's float64 one.
    Bound: float32 rounding adds along the longest path, each convolution at most 2 n 2^-24 of
    its outputs' scale, n the products an output sums (the 7x7 stem 147, three 3x3 over 128
    channels 1152 each, one over 256 channels 2304), eval BatchNorm with fresh statistics an
    affine map of scale ~1."""
    from funcnet.nn.functional import conv_strategy

    cfg = transformers.ResNetConfig(embedding_size=128, hidden_sizes=[128, 256], depths=[1, 1], layer_type="basic")
    torch.manual_seed(0)
    module = transformers.ResNetModel(cfg).eval()
    model, params, state = interop.convert(module, pixel_values=torch.randn(2, 3, 32, 32))
    calls, winograd = [], conv_strategy.winograd_conv
    monkeypatch.setattr(conv_strategy, "winograd_conv", lambda x, *a: calls.append(x.shape) or winograd(x, *a))
    fresh = torch.randn(3, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    got, _ = jax.jit(lambda p, s, x: model.apply(p, pixel_values=x, state=s, train=False))(
        params, state, jnp.asarray(fresh.numpy()))
    assert calls == [(3, 128, 12, 12)] * 2, calls  # the first stage's two convolutions, at the new size
    with torch.no_grad():
        want = module.double()(pixel_values=fresh.double())["last_hidden_state"]
    assert got["last_hidden_state"].shape == want.shape
    assert _rel(got["last_hidden_state"], want) <= 2 * (147 + 3 * 1152 + 2304) * 2.0 ** -24


def test_a_kv_cache_argument_is_refused_with_the_setting_that_removes_it():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)  # use_cache left at its default, True
    with pytest.raises(interop.ConversionError, match=r"DynamicCache.*use_cache=False"):
        interop.convert(transformers.GPT2LMHeadModel(cfg).eval(), torch.randint(0, VOCAB, (2, 5)))
