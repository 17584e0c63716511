"""Normalization layers against torch, through tests/torch_oracle.check_layer: forward, input
and parameter gradients and the updated state (BatchNorm's buffers) in train and eval mode,
float32 and float64, plus the clear errors of the layer author's contract."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P

import funcnet
from funcnet import nn
from torch_oracle import check_layer

T = torch.nn


def case(name, ours, theirs, shape):
    """A row: ``ours(dtype) -> funcnet layer`` and ``theirs() -> torch layer`` built alike."""
    return pytest.param(ours, theirs, shape, id=name)


TABLE = [
    case("ln_1_dim", lambda dt: nn.LayerNorm(5, dtype=dt), lambda: T.LayerNorm(5), (3, 4, 5)),
    case("ln_2_dims_eps", lambda dt: nn.LayerNorm((4, 5), eps=1e-3, dtype=dt),
         lambda: T.LayerNorm((4, 5), eps=1e-3), (3, 4, 5)),
    case("ln_no_bias", lambda dt: nn.LayerNorm(5, bias=False, dtype=dt), lambda: T.LayerNorm(5, bias=False), (2, 5)),
    case("ln_no_affine", lambda dt: nn.LayerNorm(5, elementwise_affine=False, dtype=dt),
         lambda: T.LayerNorm(5, elementwise_affine=False), (2, 3, 5)),
    case("gn_1_group", lambda dt: nn.GroupNorm(1, 4, dtype=dt), lambda: T.GroupNorm(1, 4), (3, 4, 5)),
    case("gn_2_groups_2d", lambda dt: nn.GroupNorm(2, 4, eps=1e-3, dtype=dt),
         lambda: T.GroupNorm(2, 4, eps=1e-3), (2, 4, 3, 3)),
    case("gn_C_groups", lambda dt: nn.GroupNorm(4, 4, dtype=dt), lambda: T.GroupNorm(4, 4), (2, 4, 6)),
    case("gn_no_affine_no_length", lambda dt: nn.GroupNorm(2, 4, affine=False, dtype=dt),
         lambda: T.GroupNorm(2, 4, affine=False), (3, 4)),
    case("gn_no_bias", lambda dt: nn.GroupNorm(2, 4, bias=False, dtype=dt),
         lambda: T.GroupNorm(2, 4, bias=False), (2, 4, 3)),
    case("bn1d_NC", lambda dt: nn.BatchNorm1d(3, dtype=dt), lambda: T.BatchNorm1d(3), (6, 3)),
    case("bn1d_NCL_momentum_half", lambda dt: nn.BatchNorm1d(3, momentum=0.5, dtype=dt),
         lambda: T.BatchNorm1d(3, momentum=0.5), (4, 3, 5)),
    case("bn1d_cumulative_eps", lambda dt: nn.BatchNorm1d(3, eps=1e-3, momentum=None, dtype=dt),
         lambda: T.BatchNorm1d(3, eps=1e-3, momentum=None), (5, 3)),
    case("bn1d_no_affine", lambda dt: nn.BatchNorm1d(3, affine=False, dtype=dt),
         lambda: T.BatchNorm1d(3, affine=False), (4, 3, 2)),
    case("bn1d_no_running_stats", lambda dt: nn.BatchNorm1d(3, track_running_stats=False, dtype=dt),
         lambda: T.BatchNorm1d(3, track_running_stats=False), (4, 3, 2)),
    case("bn2d", lambda dt: nn.BatchNorm2d(2, dtype=dt), lambda: T.BatchNorm2d(2), (3, 2, 4, 3)),
    case("bn2d_cumulative_no_bias", lambda dt: nn.BatchNorm2d(2, momentum=None, bias=False, dtype=dt),
         lambda: T.BatchNorm2d(2, momentum=None, bias=False), (2, 2, 3, 3)),
    case("bn2d_no_running_stats", lambda dt: nn.BatchNorm2d(2, momentum=0.5, track_running_stats=False, dtype=dt),
         lambda: T.BatchNorm2d(2, momentum=0.5, track_running_stats=False), (2, 2, 3, 2)),
    # outside a pmap/shard_map, SyncBatchNorm is BatchNorm of the local batch (torch without a process group)
    case("syncbn_local", lambda dt: nn.SyncBatchNorm(2, dtype=dt), lambda: T.BatchNorm2d(2), (3, 2, 2, 2)),
]


def _randomize(theirs, seed):
    # non-trivial affine parameters and running statistics, so a swapped or ignored one shows
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in theirs.state_dict().items():
            if name.endswith(("weight", "bias")):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("running_mean"):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("num_batches_tracked"):
                t.fill_(3)
    return theirs


def _run(ours, theirs, shape, train, dtype, seed=0):
    torch.manual_seed(seed)
    ours = ours(jnp.float64 if dtype == "float64" else jnp.float32)
    theirs = _randomize(theirs(), seed)
    assert ours.name == repr(theirs).replace("SyncBatchNorm", "BatchNorm2d") or "SyncBatchNorm" in ours.name
    x = np.random.default_rng(seed).standard_normal(shape) * 2.0 + 0.5
    terms = 0.0
    if isinstance(theirs, torch.nn.GroupNorm) and x[0].size // theirs.num_groups <= 2:
        # the input gradient subtracts terms |cot| |weight| / sigma per group; with 2 values a group's output is
        # +-1 and the difference is far smaller than them (|cot| < 4 for these few normal draws)
        sigma = np.sqrt(x.reshape(shape[0], theirs.num_groups, -1).var(-1) + theirs.eps)
        weight = theirs.weight.detach().abs().max().item() if theirs.affine else 1.0
        terms = 4.0 * weight / sigma.min()
    check_layer(ours, theirs, [x], train=train, dtype=dtype, terms=terms)


# LayerNorm and GroupNorm have no mode (train and eval are one computation): train only
MODES = [pytest.param(*row.values, train, id=f"{row.id}-{'train' if train else 'eval'}")
         for row in TABLE for train in (True, False) if train or "bn" in row.id]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ours,theirs,shape,train", MODES)
def test_layer_equals_torch(ours, theirs, shape, train, dtype):
    if dtype == "float64":
        with jax.enable_x64(True):
            _run(ours, theirs, shape, train, dtype)
    else:
        _run(ours, theirs, shape, train, dtype)


def test_batchnorm_train_derivatives_equal_autodiff_of_the_plain_formula():
    # BatchNorm in train mode has a hand-written derivative rule (torch's closed form, behind
    # jax.custom_jvp): forward mode, reverse mode and second order must equal jax's autodiff of
    # the plain formula, written here apart from the layer (float64)
    with jax.enable_x64(True):
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.standard_normal((4, 3, 5, 2)) * 2 + 1)
        params = {"weight": jnp.asarray(rng.standard_normal(3)), "bias": jnp.asarray(rng.standard_normal(3))}
        bn = nn.BatchNorm2d(3, dtype=jnp.float64)
        state = bn.init_state()

        def ours(p, x):
            return bn.apply(p, x, state=state, train=True)[0]

        def plain(p, x):
            mean = x.mean(axis=(0, 2, 3), keepdims=True)
            var = ((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
            return (x - mean) / jnp.sqrt(var + 1e-5) * p["weight"][:, None, None] + p["bias"][:, None, None]

        tx = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape)), (params, x))
        for f in (ours, plain):  # the oracle itself is right: it matches finite differences
            _, tan = jax.jvp(f, (params, x), tx)
            fd = (f(*jax.tree.map(lambda a, t: a + 1e-6 * t, (params, x), tx))
                  - f(*jax.tree.map(lambda a, t: a - 1e-6 * t, (params, x), tx))) / 2e-6
            np.testing.assert_allclose(tan, fd, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(jax.jvp(ours, (params, x), tx)[1], jax.jvp(plain, (params, x), tx)[1],
                                   rtol=1e-12, atol=1e-12)
        cot = jnp.asarray(rng.standard_normal(x.shape))
        for got, want in zip(jax.tree.leaves(jax.vjp(ours, params, x)[1](cot)),
                             jax.tree.leaves(jax.vjp(plain, params, x)[1](cot))):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        # second order: the gradient of a scalar of the input gradient
        def second(f):
            return jax.grad(lambda x: jnp.sum(jnp.sin(jax.grad(lambda x: jnp.sum(f(params, x) * cot))(x))))(x)

        np.testing.assert_allclose(second(ours), second(plain), rtol=1e-10, atol=1e-10)


def test_batchnorm_gradient_reads_the_input_in_two_reductions_and_the_cotangent_in_two():
    # the train-mode gradient is torch's hand-written backward: the statistics' two reductions
    # (mean, variance) and the backward's two (sum(g), sum(g * xhat), shared by the input, weight and
    # bias gradients). The tangent in torch's own form transposes to four backward reductions (six in
    # all), 1.6-2.3x the time on XLA:CPU
    bn = nn.BatchNorm2d(3)
    state, params = bn.init_state(), bn.init(jax.random.key(0))
    x = g = jnp.ones((4, 3, 5, 2))

    def full_size_sums(jaxpr):
        n = 0
        for eqn in jaxpr.eqns:
            n += eqn.primitive.name == "reduce_sum" and eqn.invars[0].aval.shape == x.shape
            for v in eqn.params.values():
                inner = getattr(v, "jaxpr", v)
                n += full_size_sums(inner) if hasattr(inner, "eqns") else 0
        return n

    loss = lambda p, x: jnp.vdot(jax.nn.relu(bn.apply(p, x, state=state, train=True)[0]), g)  # noqa: E731
    assert full_size_sums(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x).jaxpr) == 4


def test_batchnorm_state_is_torchs_buffers():
    bn = nn.BatchNorm2d(3)
    state = bn.init_state()
    assert list(state) == ["running_mean", "running_var", "num_batches_tracked"]
    np.testing.assert_array_equal(state["running_mean"], np.zeros(3))
    np.testing.assert_array_equal(state["running_var"], np.ones(3))
    assert state["running_mean"].dtype == jnp.float32 and state["num_batches_tracked"].dtype == jnp.int32
    with jax.enable_x64(True):
        assert bn.init_state()["num_batches_tracked"].dtype == jnp.int64
    assert nn.BatchNorm1d(3, track_running_stats=False).init_state is None
    params = bn.init(jax.random.key(0))
    assert list(funcnet.state_dict(params, state, model=bn)) == list(torch.nn.BatchNorm2d(3).state_dict())


def test_eval_mode_uses_running_stats_and_returns_state_unchanged():
    bn = nn.BatchNorm1d(2)
    params = bn.init(jax.random.key(0))
    state = {"running_mean": jnp.array([1.0, -2.0]), "running_var": jnp.array([4.0, 0.25]),
             "num_batches_tracked": jnp.array(7, jnp.int32)}
    x = jnp.array([[3.0, -1.0], [5.0, -2.5]])
    y, same = bn.apply(params, x, state=state, train=False)
    np.testing.assert_allclose(y, (x - state["running_mean"]) / np.sqrt(state["running_var"] + 1e-5), rtol=1e-6)
    assert same is state


def test_sync_batchnorm_uses_the_global_batch():
    """4 devices with 2 examples each under shard_map equal torch's BatchNorm on all 8: forward,
    gradients (taken outside the map) and the running statistics with the 8-example correction."""
    devices = jax.devices()[:4]
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    torch.manual_seed(0)
    theirs = _randomize(torch.nn.BatchNorm2d(3, momentum=0.3), 0)
    ours = nn.SyncBatchNorm(3, momentum=0.3)
    params, state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(),
                                            state=ours.init_state())
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 3, 2, 2)) * 3 + 1).astype(np.float32)
    cot = rng.standard_normal(x.shape).astype(np.float32)

    def per_device(p, s, xb):
        return ours.apply(p, xb, state=s, train=True)

    sharded = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P("data"), P()))

    def loss(p, xx):
        y, s = sharded(p, state, xx)
        return jnp.sum(y * cot), (y, s)

    (_, (y, new_state)), (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        params, jnp.asarray(x))
    tx = torch.from_numpy(x).requires_grad_(True)
    ty = theirs.train()(tx)
    (ty * torch.from_numpy(cot)).sum().backward()
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    np.testing.assert_allclose(g_x, tx.grad.numpy(), **tol)
    np.testing.assert_allclose(g_params["weight"], theirs.weight.grad.numpy(), **tol)
    np.testing.assert_allclose(g_params["bias"], theirs.bias.grad.numpy(), **tol)
    for k in ("running_mean", "running_var"):
        np.testing.assert_allclose(new_state[k], getattr(theirs, k).numpy(), err_msg=k, **tol)
    assert int(new_state["num_batches_tracked"]) == 4
    # the same layer outside any map is BatchNorm of the local batch: here, of the first shard
    y0, _ = ours.apply(params, jnp.asarray(x[:2]), state=state, train=True)
    assert not np.allclose(y0, y[:2], atol=1e-3)


def test_batchnorm_axis_name_must_be_bound():
    bn = nn.BatchNorm1d(2, axis_name="batch")
    with pytest.raises(NameError, match="axis_name='batch' is not bound"):
        bn.apply(bn.init(jax.random.key(0)), jnp.ones((4, 2)), state=bn.init_state(), train=True)


@pytest.mark.parametrize("low", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("layer", [
    lambda: nn.LayerNorm((3, 4)), lambda: nn.GroupNorm(3, 3), lambda: nn.BatchNorm2d(3),
    lambda: nn.BatchNorm2d(3, track_running_stats=False)], ids=["ln", "gn", "bn2d", "bn2d_no_stats"])
def test_low_precision_input_is_normalized_in_float32(layer, low):
    """A bf16/fp16 input gives the float32 result rounded once to its dtype, and a float32 state:
    the statistics are not computed in 8 (bf16) or 11 (fp16) bits."""
    layer = layer()
    params = jax.tree.map(lambda p: p + jnp.linspace(0.5, 1.5, p.size).reshape(p.shape),
                          layer.init(jax.random.key(0)))
    # a large common offset: a mean or variance taken in 16 bits would be off by far more than one rounding
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3, 3, 4)) + 40.0).astype(low)
    state = funcnet.nn.initial_state(layer) or None
    y32, s32 = nn.call(layer, params, state, x.astype(jnp.float32), train=True)
    y, s = nn.call(layer, params, state, x, train=True)
    assert y.dtype == low
    eps = float(jnp.finfo(low).eps)
    np.testing.assert_allclose(np.asarray(y, np.float32), y32, rtol=eps, atol=eps * 4)
    if state is not None:
        assert s["running_mean"].dtype == s["running_var"].dtype == jnp.float32
        for k in ("running_mean", "running_var"):
            np.testing.assert_allclose(s[k], s32[k], rtol=1e-6, err_msg=k)


def test_low_precision_params_are_applied_in_float32():
    # make_step's policy casts params to bf16 too; the affine step still runs in float32
    ln = nn.LayerNorm(4)
    params = {"weight": jnp.array([1.5, -2.0, 0.5, 3.0]), "bias": jnp.array([0.1, 0.2, -0.3, 0.4])}
    x = jnp.array([[1.0, 2.0, 3.0, 5.0]])
    low = ln.apply(jax.tree.map(lambda p: p.astype(jnp.bfloat16), params), x.astype(jnp.bfloat16))
    np.testing.assert_allclose(np.asarray(low, np.float32), ln.apply(params, x), rtol=2 ** -7)


def _err(layer, x, match, exc=ValueError, state="init", train=True):
    params = layer.init(jax.random.key(0))
    if layer.has_state:
        st = layer.init_state() if state == "init" else state
        with pytest.raises(exc, match=match):
            layer.apply(params, x, state=st, train=train)
    else:
        with pytest.raises(exc, match=match):
            layer.apply(params, x)


def test_input_errors_name_value_and_fix():
    _err(nn.BatchNorm1d(3), jnp.ones((4, 5)), r"has 5 channels in axis 1, expected 3 .*num_features=5")
    _err(nn.BatchNorm2d(3), jnp.ones((4, 3, 2)), r"expected 4D input \(N, C, H, W\), got 3D input of shape \(4, 3, 2\)")
    _err(nn.BatchNorm1d(3), jnp.ones((4, 3, 2, 2)), r"expected 2D or 3D input \(N, C\) or \(N, C, L\), got 4D")
    _err(nn.SyncBatchNorm(3), jnp.ones((4,)), r"has no channels in axis 1")
    _err(nn.GroupNorm(2, 4), jnp.ones((2, 6, 3)), r"\(2, 6, 3\) must be \(N, 4, \*\)")
    _err(nn.LayerNorm((2, 3)), jnp.ones((4, 3, 2)), r"does not end in normalized_shape \(2, 3\)")
    _err(nn.LayerNorm(3), jnp.ones((2, 3), jnp.int32), r"dtype int32, expected a floating dtype", TypeError)
    _err(nn.BatchNorm1d(3), jnp.ones((1, 3)), r"more than 1 value per channel when training")
    # one example per channel is fine in eval mode, as torch
    bn = nn.BatchNorm1d(3)
    bn.apply(bn.init(jax.random.key(0)), jnp.ones((1, 3)), state=bn.init_state(), train=False)


def test_state_missing_or_mismatched_is_refused():
    bn = nn.BatchNorm2d(3)
    params, x = bn.init(jax.random.key(0)), jnp.ones((2, 3, 2, 2))
    for train in (True, False):  # eval mode needs the running statistics too
        with pytest.raises(ValueError, match=r"keeps state .*model.init_state\(\)"):
            bn.apply(params, x, train=train)
    _err(bn, x, r"state does not match the model", state=nn.BatchNorm2d(4).init_state())
    _err(bn, x, r"state does not match the model", state={"running_mean": jnp.zeros(3)})
    with pytest.raises(ValueError, match=r"params has keys \['weight'\], expected \['bias', 'weight'\]"):
        bn.apply({"weight": jnp.ones(3)}, x, state=bn.init_state())


@pytest.mark.parametrize("build,match", [
    (lambda: nn.LayerNorm(0), "normalized_shape must be"),
    (lambda: nn.LayerNorm((3, -1)), "normalized_shape must be"),
    (lambda: nn.LayerNorm(3, eps=-1.0), "eps must be"),
    (lambda: nn.GroupNorm(3, 4), r"num_channels \(4\) must be divisible by num_groups \(3\)"),
    (lambda: nn.GroupNorm(0, 4), "num_groups must be a positive int"),
    (lambda: nn.BatchNorm1d(0), "num_features must be a positive int"),
    (lambda: nn.BatchNorm2d(3, momentum=1.5), r"momentum must be a float in \[0, 1\]"),
    (lambda: nn.BatchNorm2d(3.0), "num_features must be a positive int"),
])
def test_bad_constructor_arguments_fail_at_build_time(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_building_does_not_create_arrays():
    # a layer is built before JAX's backend may start (simulated device count is set then)
    import subprocess
    import sys
    code = ("import jax; from funcnet import nn; "
            "[nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.BatchNorm1d(3), nn.BatchNorm2d(3), nn.SyncBatchNorm(3)]; "
            "jax.config.update('jax_num_cpu_devices', 3); print(len(jax.devices()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert out.stdout.strip() == "3"


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.5])
def test_layernorm_eps_sets_the_output_scale_where_the_variance_is_comparable(eps):
    # the closed form written apart from the layer: y = (x - mean) / sqrt(var + eps), float64; with the
    # inputs' variance equal to eps the output's RMS is sqrt(1/2), so a wrong eps (10x, or the default)
    # moves every value by tens of percent, far outside rounding (1e-15 relative)
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((3, 8))
        x = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True) * np.sqrt(eps) + 7.0  # var == eps exactly
        want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
        model = nn.LayerNorm(8, eps=eps, elementwise_affine=False, dtype=jnp.float64)
        got = np.asarray(model.apply(model.init(jax.random.key(0)), jnp.asarray(x)))
        np.testing.assert_allclose(np.sqrt((got ** 2).mean(-1)), np.sqrt(0.5), rtol=1e-9)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
