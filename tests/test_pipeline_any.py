"""funcnet.parallel.stages: any model pipelined by split points, each checked against its own loss and
gradients on one device (jax.value_and_grad of the unsplit model) in float64: three torch GPTs converted
with interop.convert (their losses differ, so a pipeline that trains another model fails), an MLP whose
stages pass activations of different widths, and the refusals, each one line naming the fix."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import interop, losses, nn
from funcnet.parallel import pipeline as pp
from funcnet.parallel import stages as st

torch = pytest.importorskip("torch")
tnn = torch.nn
F = torch.nn.functional

VOCAB, BLOCK, WIDTH, LAYERS, HEADS = 32, 8, 16, 2, 2


class Block(tnn.Module):
    def __init__(self, gelu, causal):
        super().__init__()
        self.ln_1, self.ln_2 = tnn.LayerNorm(WIDTH), tnn.LayerNorm(WIDTH)
        self.c_attn, self.c_proj = tnn.Linear(WIDTH, 3 * WIDTH), tnn.Linear(WIDTH, WIDTH)
        self.c_fc, self.mlp_proj = tnn.Linear(WIDTH, 4 * WIDTH), tnn.Linear(4 * WIDTH, WIDTH)
        self.gelu, self.causal = gelu, causal

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
        if self.causal:
            att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate=self.gelu))


class TorchGPT(tnn.Module):
    def __init__(self, gelu="none", causal=True):
        super().__init__()
        self.wte, self.wpe = tnn.Embedding(VOCAB, WIDTH), tnn.Embedding(BLOCK, WIDTH)
        self.h = tnn.ModuleList([Block(gelu, causal) for _ in range(LAYERS)])
        self.ln_f = tnn.LayerNorm(WIDTH)
        self.lm_head = tnn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: a parameter the first and the last stage share

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


VARIANTS = {"standard": dict(), "tanh_gelu": dict(gelu="tanh"), "no_causal_mask": dict(causal=False)}
_CACHE = {}


def _converted(variant):
    if variant not in _CACHE:
        torch.manual_seed(0)  # the same weights for every variant: only the forward differs
        net = TorchGPT(**VARIANTS[variant]).double()
        model, params, _ = interop.convert(net, torch.zeros(2, BLOCK, dtype=torch.long))
        _CACHE[variant] = model, params
    return _CACHE[variant]


def _tokens(n, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, VOCAB, size=(n, BLOCK)).astype(np.int32) for _ in range(2))


def _one_device(model, params, x, y):
    return jax.jit(jax.value_and_grad(lambda p: losses.cross_entropy(model.apply(p, x), y)))(params)


# 4 stages of a 2-block GPT: the embeddings, a block each, the final LayerNorm with the head and loss
FOUR = ("h.0", "h.1", "ln_f")


def _check(model, params, stages, kind, micro=4, seed=1):
    split_points = None if stages == 2 else FOUR
    x, y = _tokens(2 * micro, seed)
    want, want_g = _one_device(model, params, x, y)
    plan = st.split(model, losses.cross_entropy, params, x[:2], y[:2], stages, split_points)
    vg = jax.jit(st.make_value_and_grad(plan, pp.mesh(stages), micro, kind))
    loss, grads = vg(plan.pack(params), x, y, jax.random.key(0))
    # float64, the same operations with the batch's sums regrouped by microbatch: ~1e-16 relative
    np.testing.assert_allclose(loss, want, rtol=1e-12, atol=0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13), plan.unpack(grads), want_g)
    return float(loss), plan


def test_the_three_converted_gpts_each_pipeline_to_their_own_loss():
    """Default run: each variant on one schedule and stage count (the grid is the slow test below)."""
    with jax.enable_x64(True):
        got = {v: _check(*_converted(v), stages, kind)[0]
               for v, (stages, kind) in zip(VARIANTS, [(2, "gpipe"), (4, "1f1b"), (2, "1f1b")])}
    assert len({round(v, 12) for v in got.values()}) == 3  # three models, three losses


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", pp.KINDS)
@pytest.mark.parametrize("stages", [2, 4])
def test_converted_gpt_grid(variant, kind, stages):
    with jax.enable_x64(True):
        _check(*_converted(variant), stages, kind)


def test_even_split_cuts_the_blocks_and_shares_the_tied_embedding():
    with jax.enable_x64(True):
        model, params = _converted("standard")
        x, y = _tokens(2, 0)
        assert st.split(model, losses.cross_entropy, params, x, y, 2).split_points == ("h.1",)
        plan = st.split(model, losses.cross_entropy, params, x, y, 4, FOUR)
        # the tied wte/lm_head is read by stage 0 and 3: shared; every other array has one stage
        assert plan.owner.count(-1) == 1 and plan.sizes[0] == BLOCK * WIDTH  # stage 0: wpe (wte is shared)
        assert all(c == (((2, BLOCK, WIDTH), jnp.dtype("float64")),) for c in plan.cuts)  # the residual stream


def _mlp():
    return nn.Sequential(nn.Linear(5, 37, dtype=jnp.float64), nn.Tanh(), nn.Linear(37, 111, dtype=jnp.float64),
                         nn.Tanh(), nn.Linear(111, 3, dtype=jnp.float64))


def _masked_mlp():
    """A Composite MLP whose forward makes a scale and a mask up front (from no input or param) and
    uses them two stages later: a stage recomputes such values rather than receiving them (the
    bool mask could not cross)."""

    def forward(self, x):
        scale = jnp.arange(1, 38, dtype=x.dtype) / 37.0
        odd = (jnp.arange(111) % 2).astype(bool)
        h = jnp.tanh(self.a(x))
        h = jnp.tanh(self.b(h * scale))
        return self.c(jnp.where(odd, h, 0.0))

    f64 = jnp.float64
    return nn.Composite(forward, a=nn.Linear(5, 37, dtype=f64), b=nn.Linear(37, 111, dtype=f64),
                        c=nn.Linear(111, 3, dtype=f64))


def test_a_composite_by_split_points_equals_one_device():
    """Stages whose activations differ in shape: (2, 37) and (2, 111) cross the two cuts; split points
    are torch's SplitPoint.BEGINNING: stage 1 begins where the child "b" runs, stage 2 at "c"."""
    with jax.enable_x64(True):
        model = _masked_mlp()
        params = model.init(jax.random.key(2))
        rng = np.random.default_rng(3)
        x, y = rng.normal(size=(8, 5)), rng.integers(0, 3, size=8)
        want, want_g = jax.jit(jax.value_and_grad(lambda p: losses.cross_entropy(model.apply(p, x), y)))(params)
        plan = st.split(model, losses.cross_entropy, params, x[:2], y[:2], 3, ("b", "c"))
        assert plan.cuts == ((((2, 37), jnp.dtype("float64")),), (((2, 111), jnp.dtype("float64")),))
        loss, grads = jax.jit(st.make_value_and_grad(plan, pp.mesh(3), 4, "gpipe"))(
            plan.pack(params), x, y, jax.random.key(0))
        np.testing.assert_allclose(loss, want, rtol=1e-12, atol=0)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14), plan.unpack(grads), want_g)


def test_fit_pipelines_the_model_passed_and_equals_one_device():
    """fit(strategy='pipe') on an MLP (where the GPT-only pipeline raised KeyError: 'transformer'): the same
    batches and Adam steps as one device, the params back in the model's own layout."""
    from funcnet import train
    from funcnet.parallel.strategy import Strategy

    with jax.enable_x64(True):
        model = _mlp()
        rng = np.random.default_rng(4)
        data = rng.normal(size=(16, 5)), rng.integers(0, 3, size=16)
        run = lambda **kw: train.fit(model, optax.adam(1e-2), data, epochs=2, batch_size=8,  # noqa: E731
                                     key=jax.random.key(0), progress=False, **kw)
        one, hist_one = run()
        two, hist_two = run(devices=4, strategy=Strategy("pipe", pipeline=2, split_points=("2",), microbatches=2))
        assert [h["train_loss"] for h in hist_two] == pytest.approx([h["train_loss"] for h in hist_one], rel=1e-12)
        start = train.create_train_state(model, optax.adam(1e-2), jax.random.key(0)).params
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(one.params),
                                                                 jax.tree.leaves(start))) > 1e-3  # it trained
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13), two.params, one.params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13), two.opt_state,
                     one.opt_state)


def test_dropout_draws_each_microbatchs_mask_once_for_its_forward_and_backward():
    """Microbatch m runs under the key fold_in(key, m), in both stages and in the backward's rerun: the
    loss and gradients are those of the one-device model applied to each microbatch with that key."""
    with jax.enable_x64(True):
        f64 = jnp.float64
        model = nn.Sequential(nn.Linear(5, 16, dtype=f64), nn.Dropout(0.5), nn.Linear(16, 16, dtype=f64),
                              nn.Dropout(0.5), nn.Linear(16, 3, dtype=f64))
        params = model.init(jax.random.key(2))
        rng = np.random.default_rng(5)
        x, y = rng.normal(size=(4, 5)), rng.integers(0, 3, size=4)
        key = jax.random.key(7)

        def one_device(p):
            return sum(losses.cross_entropy(model.apply(p, x[2 * m:2 * m + 2], key=jax.random.fold_in(key, m),
                                                        train=True), y[2 * m:2 * m + 2]) for m in range(2)) / 2

        want, want_g = jax.jit(jax.value_and_grad(one_device))(params)
        plan = st.split(model, losses.cross_entropy, params, x[:2], y[:2], 2, ("2",))
        loss, grads = jax.jit(st.make_value_and_grad(plan, pp.mesh(2), 2, "1f1b"))(plan.pack(params), x, y, key)
        np.testing.assert_allclose(loss, want, rtol=1e-12, atol=0)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14), plan.unpack(grads), want_g)


def test_each_device_holds_its_own_stage():
    with jax.enable_x64(True):
        model = _mlp()
        params = model.init(jax.random.key(2))
        x, y = np.zeros((2, 5)), np.zeros(2, np.int32)
        plan = st.split(model, losses.cross_entropy, params, x, y, 2, ("2",))
        shared, bufs = plan.pack(params)
        assert shared == [] and plan.sizes == (5 * 37 + 37, 37 * 111 + 111 + 111 * 3 + 3)
        assert bufs["float64"].shape == (2, max(plan.sizes))
        placed = jax.device_put(bufs["float64"], jax.sharding.NamedSharding(pp.mesh(2), jax.sharding.PartitionSpec("pipe")))
        assert {s.data.shape for s in placed.addressable_shards} == {(1, max(plan.sizes))}
        jax.tree.map(np.testing.assert_array_equal, plan.unpack((shared, bufs)), params)


def _int_crossing():
    def forward(self, x):
        pick = jnp.argmax(self.a(x), axis=-1)  # an int made from stage 0's params, read by stage 1
        return self.b(x) + pick[:, None]

    return nn.Composite(forward, a=nn.Linear(5, 3), b=nn.Linear(5, 3))


@pytest.mark.parametrize(("model", "stages", "points", "match"), [
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)), 2, None, "keeps state"),
    (_mlp, 2, ("9",), r"split point '9' names no module the forward runs; modules at that depth: 0, 1, 2"),
    (_mlp, 3, ("4", "2"), "in the order the forward runs them"),
    (_mlp, 3, ("2",), "must be 2 dotted module paths"),
    (_mlp, 4, None, "3 layers\\) does not split into 4 stages"),
    (lambda: nn.Composite(lambda self, x: self.a(x), a=nn.Linear(5, 3)), 2, None, "no ModuleList or Sequential"),
    (_int_crossing, 2, ("b",), r"int(32|64)\[2\] made before split point 'b' is used after it"),
])
def test_models_the_pipeline_cannot_take_are_refused_in_one_line(model, stages, points, match):
    with jax.enable_x64(True):
        m = model()
        params = jax.eval_shape(m.init, jax.random.key(0))
        x, y = jax.ShapeDtypeStruct((2, 5), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32)
        with pytest.raises(ValueError, match=match) as e:
            st.split(m, losses.cross_entropy, params, x, y, stages, points)
    assert "\n" not in str(e.value)


def test_fit_refuses_tensor_parallel_inside_a_models_stages():
    from funcnet import train
    from funcnet.parallel.strategy import Strategy

    data = np.zeros((8, 5), np.float32), np.zeros(8, np.int32)
    with pytest.raises(ValueError, match="tensor_parallel and fsdp inside the stages are for funcnet.gpt.GPT"):
        train.fit(nn.MLP([5, 4, 3]), optax.sgd(0.1), data, epochs=1, batch_size=8, key=jax.random.key(0), progress=False,
                  strategy=Strategy("pipe", pipeline=2, tensor_parallel=2), devices=4)


def test_the_gpt_fast_path_is_taken_only_for_the_gpt_itself():
    """By the identity of the model's apply: a model with the GPT's name, params and config but another
    forward (a converted GPT, a wrapped one) is split by its own graph, never trained as funcnet's GPT."""
    from funcnet import gpt
    from funcnet.parallel import mesh as pm
    from funcnet.parallel.strategy import Strategy

    cfg = gpt.GPTConfig(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16)
    model = gpt.GPT(cfg)
    assert pm._gpt_config(model, Strategy("pipe", pipeline=2)) == cfg
    assert pm._gpt_config(model, Strategy("pipe", pipeline=2, config=cfg)) == cfg
    other = model._replace(apply=lambda p, x, **kw: model.apply(p, x, **kw) * 2.0)
    assert other.name == model.name and pm._gpt_config(other, Strategy("pipe", pipeline=2, config=cfg)) is None
    assert pm._gpt_config(nn.MLP([4, 3]), Strategy("pipe", pipeline=2, config=cfg)) is None
    assert pm._gpt_config(gpt.GPT(cfg._replace(dropout=0.1)), Strategy("pipe", pipeline=2)) is None
    with pytest.raises(ValueError, match="is not the model's GPTConfig"):
        pm._gpt_config(model, Strategy("pipe", pipeline=2, config=cfg._replace(n_layer=4)))
