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


def _check(model, params, stages, kind, micro=4, seed=1, split_points=None):
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
        plan = st.split(model, losses.cross_entropy, params, x, y, 4)
        assert plan.split_points == ("h.1", "h.2", "h.3")
        # the tied wte/lm_head is read by stage 0 and 3: shared; every other array has one stage
        assert plan.owner.count(-1) == 1
        assert all(c == (((2, BLOCK, WIDTH), jnp.dtype("float64")),) for c in plan.cuts)  # the residual stream


def _mlp():
    return nn.Sequential(nn.Linear(5, 37, dtype=jnp.float64), nn.Tanh(), nn.Linear(37, 111, dtype=jnp.float64),
                         nn.Tanh(), nn.Linear(111, 3, dtype=jnp.float64))


@pytest.mark.parametrize(("stages", "kind", "points"), [(2, "1f1b", ("2",)), (3, "gpipe", ("1", "4"))])
def test_an_mlp_by_split_points_equals_one_device(stages, kind, points):
    """Stages whose activations differ in shape: (2, 37) and (2, 111) cross the cuts of the 3-stage split."""
    with jax.enable_x64(True):
        model = _mlp()
        params = model.init(jax.random.key(2))
        rng = np.random.default_rng(3)
        x, y = rng.normal(size=(8, 5)), rng.integers(0, 3, size=8)
        want, want_g = jax.value_and_grad(lambda p: losses.cross_entropy(model.apply(p, x), y))(params)
        plan = st.split(model, losses.cross_entropy, params, x[:2], y[:2], stages, points)
        if stages == 3:
            assert plan.cuts == ((((2, 37), jnp.dtype("float64")),), (((2, 111), jnp.dtype("float64")),))
        loss, grads = jax.jit(st.make_value_and_grad(plan, pp.mesh(stages), 4, kind))(
            plan.pack(params), x, y, jax.random.key(0))
        np.testing.assert_allclose(loss, want, rtol=1e-12, atol=0)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14), plan.unpack(grads), want_g)
