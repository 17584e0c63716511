"""A converted model is specialised per input signature, as jax.jit is: a size read while tracing
(``range(x.shape[1])``, a positional table cut to the traced length) makes the recording a program for
that shape alone, so a call of another signature records the torch module again. A ``to_source`` port,
which cannot record again, writes such a loop as a loop again where it can (the 7-line loop module,
Mamba's scan) and otherwise refuses another signature in one line. Compared with torch in float64 at
three lengths (one of them the traced one) for the loop module and transformers' Funnel (and in the slow
run Pegasus, Marian and Mamba's slow path; Mamba's greedy generation is tests/test_convert_hf.py's)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from funcnet import interop  # noqa: E402

EPS64 = float(np.finfo(np.float64).eps)


class Decay(torch.nn.Module):
    """A running sum over positions: the loop count is the input's length."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        acc, out = torch.zeros_like(x[:, 0]), []
        for i in range(x.shape[1]):
            acc = 0.5 * acc + self.lin(x[:, i])
            out.append(acc)
        return torch.stack(out, 1)


def _x(batch, length, seed):
    return torch.randn(batch, length, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@functools.cache
def _decay():
    torch.manual_seed(0)
    module = Decay().double()
    with jax.enable_x64(True):
        model, params, _ = interop.convert(module, _x(2, 5, 0))
    return module, model, params


def test_the_loop_module_equals_torch_at_three_lengths_under_jit_and_records_each_signature_once():
    module, model, params = _decay()
    with jax.enable_x64(True):
        forward = jax.jit(model.apply)
        for batch, length in ((3, 3), (2, 5), (1, 9), (3, 3)):  # the traced length 5 among them; 3 again: reused
            x = _x(batch, length, length)
            got = np.asarray(forward(params, jnp.asarray(x.numpy())))
            want = module(x).detach().numpy()
            assert got.shape == want.shape
            # a chain of `length` 4-wide affine maps halving the sum: a few float64 ulps of values near 1
            assert np.abs(got - want).max() <= 64 * EPS64 * max(1.0, np.abs(want).max()), (length, got - want)
    assert model.signatures[0] == "x: float64[2,5,4]"  # the traced one first, then each new one once
    assert model.signatures[1:] == ["x: float64[3,3,4]", "x: float64[1,9,4]"], model.signatures
    assert "recorded for 3 input signatures" in repr(model) and "#   x: float64[1,9,4]" in repr(model)


def test_gradients_at_a_new_length_equal_torch():
    module, model, params = _decay()
    x = _x(2, 7, 3)
    module.zero_grad()
    module(x).pow(2).sum().backward()
    with jax.enable_x64(True):
        grads = jax.jit(jax.grad(lambda p: (model.apply(p, jnp.asarray(x.numpy())) ** 2).sum()))(params)
    for name, p in module.named_parameters():
        got = np.asarray(grads["lin"][name.split(".")[1]])
        want = p.grad.numpy()
        assert np.abs(got - want).max() <= 1e-12 * max(1.0, np.abs(want).max()), name


def _exec(source, name):
    scope: dict = {}
    exec(compile(source, f"<port of {name}>", "exec"), scope)  # noqa: S102 (the written module)
    return scope[name]()


def test_a_to_source_port_writes_the_loop_over_positions_as_a_loop_and_equals_torch_at_three_lengths():
    module, _, _ = _decay()
    with jax.enable_x64(True):
        source = interop.to_source(module, _x(2, 5, 0))
        assert "shape_guard" not in source and "for i in range(x.shape[1]):" in source, source
        model = _exec(source, "Decay")
        params = interop.from_torch(module)
        forward = jax.jit(model.apply)
        for batch, length in ((3, 3), (2, 5), (1, 9)):  # the traced length 5 among them
            x = _x(batch, length, length)
            got = np.asarray(forward(params, jnp.asarray(x.numpy())))
            want = module(x).detach().numpy()
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= 64 * EPS64 * max(1.0, np.abs(want).max()), (length, got - want)


class Last(torch.nn.Module):
    """The running sum's last value alone: no list of the steps' values, so the port cannot write the loop again."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        acc = torch.zeros_like(x[:, 0])
        for i in range(x.shape[1]):
            acc = 0.5 * acc + self.lin(x[:, i])
        return acc


def test_a_to_source_port_of_a_loop_it_cannot_write_refuses_another_length_in_one_line_and_takes_another_batch():
    torch.manual_seed(0)
    module = Last().double()
    with jax.enable_x64(True):
        source = interop.to_source(module, _x(2, 5, 0))
        assert "@shape_guard('x: float64[*,5,*]', names=('x',))\ndef Last():" in source, source
        model = _exec(source, "Last")
        params = interop.from_torch(module)
        x = _x(3, 5, 4)  # another batch size: the batch axis was shown generic
        got = np.asarray(model.apply(params, jnp.asarray(x.numpy())))
        assert np.abs(got - module(x).detach().numpy()).max() <= 1e-13
        with pytest.raises(ValueError) as err:
            model.apply(params, jnp.ones((2, 7, 4)))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("Last: this port was written at input signature (x: float64[*,5,*])")
    assert "called with (x: float64[2,7,4])" in message and "interop.convert(module, x)" in message


class Windows(torch.nn.Module):
    """Pads the length to whole windows of 4, then branches on the padded length (as Swin compares its
    window with the feature map): lengths 3 and 4 take the first branch, 5 to 8 the second. Recorded one
    larger than the traced 3 the program is the same, so only the comparison itself can tell."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        length = x.shape[1]
        x = torch.nn.functional.pad(x, (0, 0, 0, (4 - length % 4) % 4))
        if 4 >= x.shape[1]:
            x = x * 2
        else:
            x = x.roll(1, 1)
        return self.lin(x)[:, :length]


def test_a_comparison_of_sizes_is_checked_on_every_call_by_convert_and_by_the_port():
    torch.manual_seed(0)
    module = Windows().double()
    with jax.enable_x64(True):
        model, params, _ = interop.convert(module, _x(2, 3, 0))
        for length in (3, 4, 5, 9):  # 5 and 9 take the other branch: recorded again, so torch's numbers
            x = _x(2, length, length)
            got = np.asarray(model.apply(params, jnp.asarray(x.numpy())))
            assert np.abs(got - module(x).detach().numpy()).max() <= 1e-13, length
        source = interop.to_source(module, _x(2, 3, 0))
        # the branch taken is written with its condition, checked where the torch code made it
        assert "size_check(x.shape[1] <= 4, 'x.shape[1] <= 4', 'test_convert_shapes.py:" in source, source
        port = _exec(source, "Windows")
        params = interop.from_torch(module)
        for length in (3, 4):  # the condition holds: torch's numbers on fresh inputs
            x = _x(3, length, 10 + length)
            got = np.asarray(port.apply(params, jnp.asarray(x.numpy())))
            assert np.abs(got - module(x).detach().numpy()).max() <= 1e-13, length
        for length in (5, 9):  # it does not: refused in one line, never the first branch's numbers
            with pytest.raises(ValueError) as err:
                port.apply(params, jnp.asarray(_x(2, length, 0).numpy()))
            message = str(err.value)
            assert "\n" not in message and "where x.shape[1] <= 4" in message and "interop.convert" in message


class Branch(torch.nn.Module):
    """Takes one path for short inputs and another for long ones."""

    def forward(self, x):
        if x.shape[1] > 4:
            return x.roll(1, 1)
        return x * 2


class Shared(torch.nn.Module):
    """One child called on a short and a long slice in the same forward: two recordings of it."""

    def __init__(self):
        super().__init__()
        self.block = Branch()

    def forward(self, x):
        return self.block(x[:, :3]).sum(1) + self.block(x).mean(1)


def test_a_size_compared_with_a_float_is_checked_too():
    class Half(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[1] > 4.5 else x - 1  # a float threshold (0.5 * a length, say)

    module = Half().double()
    with jax.enable_x64(True):
        source = interop.to_source(module, _x(2, 3, 0))
        assert "size_check(x.shape[1] <= 4.5, 'x.shape[1] <= 4.5'" in source, source
        port = _exec(source, "Half")
        x = _x(2, 4, 1)
        got = np.asarray(port.apply({}, jnp.asarray(x.numpy())))
        assert np.abs(got - module(x).numpy()).max() == 0
        with pytest.raises(ValueError, match="where x.shape"):
            port.apply({}, jnp.asarray(_x(2, 5, 2).numpy()))


def test_a_child_recorded_at_two_sizes_replays_the_recording_whose_comparisons_hold_at_each_call():
    # both recordings of the child take the same arguments: only its comparison of sizes tells them apart
    # (the first recording, replayed on the long input, gave numbers 0.6 off)
    module = Shared().double()
    with jax.enable_x64(True):
        model, params, _ = interop.convert(module, _x(2, 6, 0))
        for batch, length in ((2, 6), (3, 9)):  # fresh inputs: the traced signature, and one recorded when met
            x = _x(batch, length, 20 + length)
            got = np.asarray(model.apply(params, jnp.asarray(x.numpy())))
            assert np.abs(got - module(x).numpy()).max() <= 1e-14, (batch, length)


class FirstThree(torch.nn.Module):
    """A loop of a fixed 3 steps, traced at length 3: its count looks like the length there."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        scale = x.shape[1]  # a size read before the loop, 3 at the trace
        return torch.stack([self.lin(x[:, i]) for i in range(3)], 1) * scale


class Pair(torch.nn.Module):
    """The first two positions, each through the layer, stacked: two steps, as a loop of 2 would make."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        batch = x.shape[0]  # 2 at the trace, as the pair's count
        return torch.stack([self.lin(x[:, 0]), self.lin(x[:, 1])], 1).reshape(batch, -1)


@pytest.mark.parametrize("cls, length", [(FirstThree, 3), (Pair, 5)])
def test_steps_whose_count_matches_a_size_by_chance_are_written_as_recorded_and_stay_shape_generic(cls, length):
    # read as `for i in range(x.shape[1])` (or the batch) the port would hold at the traced size alone: recorded
    # one larger, the steps stay as many, so the loop is not written again, and the port holds at every shape
    torch.manual_seed(0)
    module = cls().double()
    with jax.enable_x64(True):
        source = interop.to_source(module, _x(2, length, 0))
        assert "shape_guard" not in source and "range(" not in source, source
        model = _exec(source, cls.__name__)
        x = _x(3, 6, 1)
        got = np.asarray(model.apply(interop.from_torch(module), jnp.asarray(x.numpy())))
        assert np.abs(got - module(x).detach().numpy()).max() <= 1e-13


def test_a_forward_whose_sizes_stay_sizes_is_written_shape_generic():
    class Generic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).cumsum(1)[:, : x.shape[1] - 1]  # the size stays x.shape[1]

    module = Generic()
    source = interop.to_source(module, torch.randn(2, 5, 4))
    assert "x.shape[1] - 1" in source and "shape_guard" not in source, source
    scope: dict = {}
    exec(compile(source, "<port of Generic>", "exec"), scope)
    model = scope["Generic"]()
    x = torch.randn(3, 8, 4)
    got = np.asarray(model.apply(interop.from_torch(module), jnp.asarray(x.numpy())))
    assert np.abs(got - module(x).detach().numpy()).max() <= 1e-5  # float32, 8 terms of size ~1


def test_a_torch_layer_with_no_counterpart_converts_by_its_traced_forward_and_equals_torch_at_another_length():
    # nn.TransformerDecoderLayer has no row in the converter's table: its forward is traced as a model's is;
    # reading its tensors once went through from_torch's refusal of such layers, said as an "internal error"
    torch.manual_seed(0)
    module = torch.nn.TransformerDecoderLayer(d_model=8, nhead=2, dim_feedforward=16).eval()
    model, params, _ = interop.convert(module, torch.randn(5, 2, 8), torch.randn(4, 2, 8), train=False)
    forward = jax.jit(model.apply)
    for tgt, memory, batch in ((5, 4, 2), (7, 3, 3)):  # the traced shapes and others
        x, y = torch.randn(tgt, batch, 8), torch.randn(memory, batch, 8)
        with torch.no_grad():
            want = module(x, y).numpy()
        got = np.asarray(forward(params, jnp.asarray(x.numpy()), jnp.asarray(y.numpy())))
        # float32 through two attentions and a 16-wide feed-forward, layer-normed: values of size ~1
        assert np.abs(got - want).max() <= 1e-5, (tgt, memory, np.abs(got - want).max())
    with pytest.raises(TypeError, match=r"no counterpart for <root> \(TransformerDecoderLayer"):
        interop.from_torch(module)  # from_torch, which builds nothing, still refuses it


# ---- transformers: built from tiny configs, no download

transformers = pytest.importorskip("transformers")
VOCAB = 50


def _ids(batch, length, seed):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _funnel():
    cfg = transformers.FunnelConfig(vocab_size=VOCAB, d_model=8, n_head=1, d_head=8, d_inner=16, block_sizes=[1, 1],
                                    num_decoder_layers=1)
    return transformers.FunnelModel(cfg), lambda b, t, s: {"input_ids": _ids(b, t, s)}


def _seq2seq(config, cls):
    def inputs(b, t, s):
        mask = torch.ones(b, t, dtype=torch.long)
        mask[0, -2:] = 0
        return {"input_ids": _ids(b, t, s), "attention_mask": mask, "decoder_input_ids": _ids(b, t - 1, s + 1)}

    cfg = config(vocab_size=VOCAB, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32,
                 use_cache=False, pad_token_id=0, decoder_start_token_id=0)
    return cls(cfg), inputs


def _mamba_config(layers=2):
    # use_associative_scan=False: the slow path's `for i in range(seq_len)` loop over positions
    return transformers.MambaConfig(vocab_size=VOCAB, hidden_size=8, state_size=4, num_hidden_layers=layers, expand=2,
                                    conv_kernel=3, use_cache=False, use_associative_scan=False, bos_token_id=None,
                                    eos_token_id=None, pad_token_id=None)


def _mamba(layers=2):
    module = transformers.MambaForCausalLM(_mamba_config(layers))
    with torch.no_grad():  # projections drawn wider than the default: greedy decoding then varies its tokens
        for name, p in module.named_parameters():
            if name.endswith("proj.weight"):
                p.normal_(0, 0.5)
    return module


MODELS = {
    "funnel": _funnel,
    "pegasus": lambda: _seq2seq(transformers.PegasusConfig, transformers.PegasusModel),
    "marian": lambda: _seq2seq(transformers.MarianConfig, transformers.MarianModel),
    "mamba": lambda: (_mamba(), lambda b, t, s: {"input_ids": _ids(b, t, s)}),
}


@pytest.mark.parametrize("name", [n if n == "funnel" else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_transformers_model_equals_torch_at_three_lengths(name):
    torch.manual_seed(0)
    module, inputs = MODELS[name]()
    module = module.double().eval()
    with jax.enable_x64(True):
        model, params, _ = interop.convert(module, train=False, **inputs(2, 6, 0))
        forward = jax.jit(lambda p, x: model.apply(p, **x))
        for batch, length in ((2, 6), (3, 9), (1, 4)):  # the traced (2, 6) and two others
            x = inputs(batch, length, length)
            with torch.no_grad():
                want = module(**x)
            got = forward(params, {k: jnp.asarray(v.numpy()) for k, v in x.items()})
            key = "logits" if "logits" in got else "last_hidden_state"
            error = float(np.abs(np.asarray(got[key]) - want[key].numpy()).max())
            print(f"{name} batch {batch} length {length}: max abs difference {error:.2e}")
            # float64 through 2-3 tiny layers: ulps; Mamba's slow path computes its scan in float32 (.float())
            assert error <= (1e-5 if name == "mamba" else 1e-12), (name, length, error)
    assert len(model.signatures) == 3


def test_a_mamba_port_writes_its_position_loop_and_equals_torch_at_other_lengths():
    # the slow path's `for i in range(seq_len)` written as a loop: no guard, so generation (which grows the
    # length) runs on the port; generating 20 tokens through `funcnet port --hf` and from_pretrained is
    # tests/test_convert_hf.py's slow run
    torch.manual_seed(0)
    module = _mamba(layers=1).eval()  # one layer: the written loop is what is checked, and it compiles per length
    ids = _ids(2, 6, 0)
    source = interop.to_source(module, input_ids=ids, attention_mask=torch.ones_like(ids))
    assert "shape_guard" not in source and "for i in range(seq_len):" in source, source
    model = _exec(source, "MambaForCausalLM")
    ids = _ids(3, 9, 9)  # another batch size and length than the traced (2, 6)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    with torch.no_grad():
        want = module(input_ids=ids, attention_mask=mask).logits.numpy()
    forward = jax.jit(lambda p, i, m: model.apply(p, input_ids=i, attention_mask=m)["logits"])  # one compile
    got = forward(interop.from_torch(module), jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy()))
    # float32 through one tiny layer (a 9-step scan of width 16 x 4); projections of scale 0.5: logits of size ~10
    assert np.abs(np.asarray(got) - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_a_recording_whose_parameters_differ_from_the_traced_ones_is_refused_in_one_line():
    class Grows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            if x.shape[1] > 5 and not hasattr(self, "extra"):  # a table made for long inputs, kept as a buffer
                self.register_buffer("extra", torch.zeros(4))
            return self.lin(x) + (self.extra if hasattr(self, "extra") else 0)

    model, params, _ = interop.convert(Grows(), torch.randn(2, 5, 4))
    with pytest.raises(interop.ConversionError) as err:
        model.apply(params, jnp.ones((2, 7, 4)))
    message = str(err.value)
    assert "\n" not in message and "recorded at the input signature (x: float32[2,7,4]) has other parameters" in message
    assert "traced one (x: float32[2,5,4])" in message
