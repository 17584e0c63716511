"""Policy parsing/casting and loss scaling, checked against torch.amp.GradScaler on CPU."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet.precision import (
    DynamicLossScale,
    NoOpLossScale,
    Policy,
    StaticLossScale,
    all_finite,
    cast_floating,
    get_policy,
    select_tree,
)

LR = 0.125  # a power of two: the SGD update of a unit gradient is exact on both sides


# ---------------------------------------------------------------- the oracle

def torch_run(finite_pattern, **hyper):
    """Drive the real GradScaler: Linear(3, 1), loss = sum(out), an inf loss on the
    steps marked False. Returns (scale after each update(), growth tracker after each
    update(), whether optimizer.step ran, the weight after each step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():  # start where the JAX side starts, so the weights compare exactly
        model.weight.zero_()
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ran = []
    opt.register_step_post_hook(lambda *_: ran.append(True))
    scaler = torch.amp.GradScaler("cpu", **hyper)
    x = torch.ones(1, 3)
    scales, trackers, stepped, weights = [], [], [], []
    for finite in finite_pattern:
        opt.zero_grad()
        loss = model(x).sum() * (1.0 if finite else float("inf"))
        before = len(ran)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler.state_dict()["_growth_tracker"])
        stepped.append(len(ran) > before)
        weights.append(model.weight.detach().numpy().copy())
    return (np.asarray(scales, np.float32), np.asarray(trackers), np.asarray(stepped), np.stack(weights))


def jax_run(finite_pattern, loss_scale):
    """The same loop in one jitted lax.scan: gradient of the scaled loss, all_finite,
    unscale, an SGD step kept only when finite, adjust."""
    params = {"weight": jnp.zeros((1, 3)), "bias": jnp.zeros((1,))}
    x = jnp.ones((1, 3))

    def body(carry, finite):
        params, ls = carry

        def loss_fn(p):
            loss = jnp.sum(x @ p["weight"].T + p["bias"]) * jnp.where(finite, 1.0, jnp.inf)
            return ls.scale(loss)

        scaled = jax.grad(loss_fn)(params)
        ok = all_finite(scaled)
        grads = ls.unscale(scaled)
        stepped = jax.tree.map(lambda p, g: p - LR * g, params, grads)
        params = select_tree(ok, stepped, params)
        ls = ls.adjust(ok)
        return (params, ls), (ls.loss_scale, ls.counter, ok, params["weight"])

    @jax.jit
    def run(params, ls, pattern):
        return jax.lax.scan(body, (params, ls), pattern)[1]

    scales, counters, ok, weights = run(params, loss_scale, jnp.asarray(finite_pattern))
    return np.asarray(scales), np.asarray(counters), np.asarray(ok), np.asarray(weights)


def assert_same_as_torch(pattern, **hyper):
    t_scale, t_tracker, t_stepped, t_weight = torch_run(pattern, **hyper)
    j_scale, j_counter, j_stepped, j_weight = jax_run(pattern, DynamicLossScale(**hyper))
    assert j_scale.dtype == np.float32
    np.testing.assert_array_equal(j_stepped, t_stepped)
    np.testing.assert_array_equal(j_scale, t_scale)  # bit-identical, not merely close
    np.testing.assert_array_equal(j_counter, t_tracker)
    # every kept step moves the weight by exactly -LR, every skipped one leaves it
    np.testing.assert_array_equal(j_weight, t_weight)
    return t_scale, t_stepped


def random_pattern(seed, segments):
    """segments: [(steps, probability of a non-finite step), ...]"""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.random(n) >= p for n, p in segments])


# ---------------------------------------------------------------- dynamic scale vs torch

def test_scale_sequence_matches_gradscaler_small_interval():
    # a rarely-overflowing stretch drives the scale to float32's ceiling (where growth must
    # stop), an often-overflowing one brings it back down; 700 steps in all
    pattern = random_pattern(0, [(450, 0.04), (150, 0.55), (100, 0.2)])
    scales, stepped = assert_same_as_torch(pattern, growth_interval=3)
    assert (~stepped).sum() > 50 and stepped.sum() > 400
    assert scales.max() == np.float32(2.0**127), "the run should reach the float32 ceiling"
    assert len(np.unique(scales)) > 40


def test_scale_sequence_matches_gradscaler_defaults():
    # one finite stretch longer than the default growth_interval of 2000, overflows around it
    pattern = np.ones(2600, bool)
    pattern[[0, 1, 2300, 2301, 2550]] = False
    scales, _ = assert_same_as_torch(pattern)
    assert (np.diff(scales) > 0).sum() == 1, "the 2000-step finite stretch grows the scale once"


@pytest.mark.parametrize("hyper", [
    dict(init_scale=1.0, growth_factor=1.1, backoff_factor=0.3, growth_interval=2),  # not exact in float32
    dict(init_scale=3.0, growth_factor=1.5, backoff_factor=0.75, growth_interval=1),
    dict(init_scale=2.0**127, growth_interval=1),  # growth would overflow: scale stays, tracker resets
])
def test_edge_hyperparameters_match_gradscaler(hyper):
    # frequent overflows, then rare ones: the scale falls and climbs again
    pattern = random_pattern(2, [(100, 0.3), (200, 0.03)])
    pattern[0] = False  # overflow on the very first step
    scales, _ = assert_same_as_torch(pattern, **hyper)
    assert len(np.unique(scales)) >= 5


def test_subnormal_scale_is_flushed_to_zero():
    # the one documented difference: XLA flushes float32 subnormals, torch's CPU kernel keeps them
    t_scale, *_ = torch_run([False, False], init_scale=2.0**-125)
    j_scale, *_ = jax_run(np.array([False, False]), DynamicLossScale(init_scale=2.0**-125))
    assert t_scale.tolist() == [2.0**-126, 2.0**-127] and j_scale.tolist() == [2.0**-126, 0.0]


def test_unscale_matches_torch_reciprocal():
    rng = np.random.default_rng(3)
    # up to float32's top, where torch's reciprocal is a subnormal XLA would flush to zero
    scales = (rng.uniform(1, 2, 3000) * 2.0 ** rng.integers(-20, 128, 3000)).astype(np.float32)
    scales[:3] = [2.0**127, 1.5 * 2.0**126, np.finfo(np.float32).max]
    scaled_grads = (scales * rng.uniform(-1, 1, 3000)).astype(np.float32)  # what a scaled backward yields
    got = np.asarray(jax.vmap(
        lambda s, g: DynamicLossScale(loss_scale=s, counter=jnp.int32(0)).unscale(g))(scales, scaled_grads))
    inv = torch.from_numpy(scales).double().reciprocal().float()  # GradScaler.unscale_'s inv_scale
    np.testing.assert_array_equal(got, (torch.from_numpy(scaled_grads) * inv).numpy())


def test_scale_and_unscale_dtypes():
    ls = DynamicLossScale(init_scale=1024.0)
    assert ls.scale(jnp.float32(0.5)) == 512.0
    assert ls.scale(jnp.bfloat16(0.5)).dtype == jnp.bfloat16
    grads = {"w": jnp.full((2,), 2048.0, jnp.bfloat16), "n": jnp.arange(2)}
    out = ls.unscale(grads)
    assert out["w"].dtype == jnp.float32 and np.all(np.asarray(out["w"]) == 2.0)
    assert out["n"].dtype == grads["n"].dtype
    static = StaticLossScale(8.0)
    assert static.adjust(jnp.asarray(False)) is static and static.scale(jnp.float32(2.0)) == 16.0
    noop = NoOpLossScale()
    assert noop.loss_scale == 1.0 and noop.unscale({"w": jnp.ones(1, jnp.float16)})["w"].dtype == jnp.float32


# ---------------------------------------------------------------- pytree behaviour

def _fields(state):
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


@pytest.mark.parametrize("make", [
    lambda: DynamicLossScale(init_scale=3.0, growth_factor=1.1, backoff_factor=0.3, growth_interval=7),
    lambda: StaticLossScale(512.0),
    lambda: NoOpLossScale(),
])
def test_jit_round_trip_keeps_every_field(make):
    state = make()
    if isinstance(state, DynamicLossScale):
        state = state.adjust(jnp.asarray(True)).adjust(jnp.asarray(True))  # counter 2, not the default 0
    back = jax.jit(lambda s: s)(state)
    assert type(back) is type(state)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    before, after = _fields(state), _fields(back)
    assert before.keys() == after.keys()
    for name in before:
        a, b = before[name], after[name]
        if hasattr(a, "dtype"):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        else:
            assert type(a) is type(b) and a == b, name
    leaves, treedef = jax.tree.flatten(state)
    assert _fields(jax.tree.unflatten(treedef, leaves)).keys() == before.keys()


def test_adjust_under_jit_and_scan_carry():
    ls = DynamicLossScale(growth_interval=2)
    out, _ = jax.lax.scan(lambda s, ok: (s.adjust(ok), None), ls, jnp.array([True, True, False, True]))
    # grow at step 2 (2**17), back off at step 3 (2**16), one finite step after
    assert float(out.loss_scale) == 2.0**16 and int(out.counter) == 1 and out.growth_interval == 2


def test_tree_map_passes_none_leaves_through():
    mapped = jax.tree.map(lambda _: None, DynamicLossScale())
    assert mapped.loss_scale is None and mapped.counter is None


# ---------------------------------------------------------------- helpers

def test_all_finite_and_select_tree():
    assert bool(all_finite({"a": jnp.ones(3), "b": (jnp.arange(2), jnp.zeros((), jnp.bfloat16))}))
    assert not bool(all_finite({"a": jnp.ones(3), "b": jnp.array([1.0, jnp.nan])}))
    assert not bool(all_finite([jnp.array([-jnp.inf], jnp.float16)]))
    assert bool(all_finite({}))
    new, old = {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}
    assert np.all(np.asarray(select_tree(jnp.asarray(False), new, old)["w"]) == 0)
    with pytest.raises(ValueError, match=r"scalar predicate, got shape \(2,\)"):
        select_tree(jnp.array([True, False]), new, old)


# ---------------------------------------------------------------- policy

@pytest.mark.parametrize("spec, expected", [
    ("fp32", ("float32", "float32", "float32")),
    ("bf16", ("float32", "bfloat16", "float32")),
    ("FP16", ("float32", "float16", "float32")),
    ("params=float32,compute=bfloat16,output=float32", ("float32", "bfloat16", "float32")),
    ("p=f32, c=half, o=bf16", ("float32", "float16", "bfloat16")),
    ("compute=bf16", ("float32", "bfloat16", "float32")),
])
def test_policy_parsing(spec, expected):
    p = get_policy(spec)
    assert (p.param_dtype.name, p.compute_dtype.name, p.output_dtype.name) == expected
    assert get_policy(str(p)) == p and get_policy(p) is p


def test_policy_is_a_static_argument():
    traces = []

    @functools.partial(jax.jit, static_argnums=1)
    def f(x, policy):
        traces.append(policy)
        return policy.cast_to_output(policy.cast_to_compute(x) * 2)

    assert f(jnp.ones(2), get_policy("bf16")).dtype == jnp.float32
    f(jnp.ones(2), Policy.from_string("params=float32,compute=bfloat16,output=float32"))
    assert len(traces) == 1  # an equal policy hashes equal: no retrace


def test_policy_casts_floating_leaves_only_and_grads_stay_in_param_dtype():
    p = get_policy("p=f32,c=bf16,o=f16")
    tree = {"w": jnp.ones((2, 2)), "idx": jnp.arange(3), "mask": jnp.ones(2, bool), "lr": 0.1}
    c = p.cast_to_compute(tree)
    assert c["w"].dtype == jnp.bfloat16 and c["idx"].dtype == tree["idx"].dtype
    assert c["mask"].dtype == jnp.bool_ and c["lr"] == 0.1
    assert p.cast_to_output(c)["w"].dtype == jnp.float16 and p.cast_to_param(c)["w"].dtype == jnp.float32
    assert cast_floating(np.ones(2, np.float64), jnp.bfloat16).dtype == jnp.bfloat16
    master = {"w": jnp.full((3,), 1.0 + 2.0**-12)}  # not representable in bfloat16
    grads = jax.grad(lambda m: jnp.sum(p.cast_to_compute(m)["w"].astype(jnp.float32) ** 2))(master)
    assert grads["w"].dtype == jnp.float32  # the gradient reaches the float32 master copy
    assert master["w"].dtype == jnp.float32 and float(master["w"][0]) == 1.0 + 2.0**-12


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("spec, match", [
    ("fp8", r"unknown precision policy 'fp8'; expected one of \['bf16', 'fp16', 'fp32'\]"),
    ("params=float32,compute=bfloat17", r"unknown floating dtype 'bfloat17'; expected one of float32"),
    ("params=float32,weights=bfloat16", r"unknown entry 'weights=bfloat16'; expected params=<dtype>"),
    ("compute=bf16,compute=f16", r"'compute' is given twice"),
    ("params=int32", r"unknown floating dtype 'int32'"),
])
def test_bad_policy_strings(spec, match):
    with pytest.raises(ValueError, match=match):
        get_policy(spec)


def test_bad_policy_types():
    with pytest.raises(TypeError, match=r"policy string is expected, got int 16"):
        get_policy(16)
    with pytest.raises(ValueError, match=r"unknown floating dtype <class 'numpy.int32'>; expected one of float32"):
        Policy(compute_dtype=np.int32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(init_scale=0.0), r"init_scale=0.0: expected a positive number.*use e.g. init_scale=2.0\*\*16"),
    (dict(init_scale=-1.0), r"init_scale=-1.0: expected a positive"),
    (dict(init_scale=1e39), r"init_scale=1e\+39: expected a positive number finite in float32"),
    (dict(growth_factor=1.0), r"growth_factor=1.0: expected a finite number > 1.*growth_factor=2.0"),
    (dict(growth_factor=0.5), r"growth_factor=0.5: expected"),
    (dict(backoff_factor=1.0), r"backoff_factor=1.0: expected a number in \(0, 1\).*backoff_factor=0.5"),
    (dict(backoff_factor=0.0), r"backoff_factor=0.0: expected a number in \(0, 1\)"),
    (dict(growth_interval=0), r"growth_interval=0: expected a positive int.*growth_interval=2000"),
    (dict(growth_interval=2.5), r"growth_interval=2.5: expected a positive int"),
    (dict(growth_interval=2**31), r"growth_interval=2147483648: expected a positive int \(at most 2147483647"),
])
def test_bad_dynamic_loss_scale(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScale(**kwargs)


def test_bad_static_scale_and_flags():
    with pytest.raises(ValueError, match=r"scale=-4.0: expected a positive number.*StaticLossScale\(1024.0\)"):
        StaticLossScale(-4.0)
    with pytest.raises(TypeError, match=r"init_scale must be a Python number, got str '1e4'"):
        DynamicLossScale(init_scale="1e4")
    with pytest.raises(ValueError, match=r"grads_finite must be a scalar bool, got dtype float32 shape \(\)"):
        DynamicLossScale().adjust(jnp.float32(1.0))


# ---------------------------------------------------------------- in the training step

def _tree_equal(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def digits():
    from funcnet import data

    return data.load("digits")


def test_non_finite_step_is_skipped_exactly(digits):
    import optax

    from funcnet import nn, train

    (x, y), _ = digits
    x, y = jnp.asarray(x[:32]), jnp.asarray(y[:32])
    model, tx = nn.MLP([64, 32, 10]), optax.adam(1e-2)
    step = train.make_step(model, tx, policy="fp16", donate=False)
    state = train.create_train_state(model, tx, jax.random.key(1), loss_scale=DynamicLossScale(growth_interval=3))
    state1, m1 = step(state, (x, y))
    assert bool(m1["grads_finite"]) and not _tree_equal(state1.params, state.params)
    state2, m2 = step(state1, (x.at[0, 0].set(jnp.inf), y))  # one bad input: NaN gradients everywhere
    assert not bool(m2["grads_finite"])
    assert _tree_equal(state2.params, state1.params) and _tree_equal(state2.opt_state, state1.opt_state)
    assert int(optax.tree_utils.tree_get(state2.opt_state, "count")) == 1  # adam's step count did not move
    assert float(state2.loss_scale.loss_scale) == 2.0**15 and int(state2.loss_scale.counter) == 0
    assert int(state2.step) == 2  # batches seen, skipped or not
    state3, m3 = step(state2, (x, y))
    assert bool(m3["grads_finite"]) and int(optax.tree_utils.tree_get(state3.opt_state, "count")) == 2
    assert float(m3["loss_scale"]) == 2.0**15 and not _tree_equal(state3.params, state2.params)


def test_power_of_two_loss_scale_leaves_float32_training_unchanged(digits):
    # oracle: the plain step. Scaling by 2**k and unscaling is exact in float32, so a
    # scaled run must produce the same bits as an unscaled one
    import optax

    from funcnet import nn, train

    (x, y), _ = digits
    model, tx = nn.MLP([64, 32, 10]), optax.sgd(0.1)
    step = train.make_step(model, tx, donate=False)
    plain = train.create_train_state(model, tx, jax.random.key(2))
    scaled = train.create_train_state(model, tx, jax.random.key(2),  # same seed, its own key object
                                      loss_scale=DynamicLossScale(init_scale=2.0**20, growth_interval=2))
    for i in range(6):
        batch = (jnp.asarray(x[32 * i:32 * (i + 1)]), jnp.asarray(y[32 * i:32 * (i + 1)]))
        plain, _ = step(plain, batch)
        scaled, m = step(scaled, batch)
        assert bool(m["grads_finite"])
    assert _tree_equal(scaled.params, plain.params) and float(scaled.loss_scale.loss_scale) == 2.0**23


def test_mixed_precision_training_matches_fp32_accuracy(digits):
    import optax

    from funcnet import nn, train

    train_data, (x_test, y_test) = digits
    model = nn.MLP([64, 128, 10])

    def accuracy_in(policy, params):  # evaluated in the compute dtype, as autocast inference would run
        p = get_policy(policy)
        logits = model.apply(p.cast_to_compute(params), p.cast_to_compute(jnp.asarray(x_test)))
        return float(np.mean(np.asarray(jnp.argmax(logits, -1)) == y_test))

    results = {}
    for policy, loss_scale in [("fp32", None), ("bf16", None),
                               # 2**24 overflows float16 at first: the scaler must back off and skip
                               ("fp16", DynamicLossScale(init_scale=2.0**24, growth_interval=100))]:
        state, history = train.fit(model, optax.adam(1e-3), train_data, epochs=8, batch_size=32,
                                   key=jax.random.key(0), progress=False, policy=policy, loss_scale=loss_scale)
        results[policy] = accuracy_in(policy, state.params), history
        assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.params))  # master weights
    fp32 = results["fp32"][0]
    assert fp32 > 0.9
    for policy in ("bf16", "fp16"):
        assert abs(results[policy][0] - fp32) <= 0.01, (policy, results[policy][0], fp32)
    fp16_history = results["fp16"][1]
    assert fp16_history[0]["skipped_steps"] >= 3  # 2**24 -> 2**21 or below before the first update
    assert sum(r["skipped_steps"] for r in fp16_history) < 0.05 * fp16_history[-1]["step"]


# ---------------------------------------------------------------- the funcnet command

def test_cli_fp16_run_resumes_exactly_with_its_loss_scale(tmp_path):
    import json

    import optax

    from funcnet import checkpoint, cli, nn, train

    base = ["train", "--precision", "fp16", "--hidden", "16", "--batch-size", "64", "--quiet"]
    assert cli.main(base + ["--epochs", "2", "--out", str(tmp_path / "a")]) == 0
    ck = str(tmp_path / "ck")
    assert cli.main(base + ["--epochs", "1", "--out", str(tmp_path / "b"), "--checkpoint-dir", ck]) == 0
    # the checkpoint holds the loss-scale state: 22 finite steps (1437 // 64) on the growth counter
    template = train.create_train_state(nn.MLP([64, 16, 10]), optax.adam(1e-3), jax.random.key(0),
                                        loss_scale=DynamicLossScale())
    saved = checkpoint.restore(ck, template, checkpoint.latest_step(ck))
    assert int(saved.loss_scale.counter) == 22 and float(saved.loss_scale.loss_scale) == 2.0**16
    assert cli.main(base + ["--epochs", "2", "--out", str(tmp_path / "b"), "--checkpoint-dir", ck, "--resume"]) == 0
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("a", "b"))
    assert a == b and a["config"]["precision"] == "fp16"
    assert [r["skipped_steps"] for r in a["history"]] == [0, 0] and a["history"][-1]["loss_scale"] == 2.0**16
    pa, pb = (np.load(tmp_path / d / "params.npz") for d in ("a", "b"))
    assert all(np.array_equal(pa[k], pb[k]) for k in pa.files)


@pytest.mark.parametrize("kind", ["shard_map", "pmap"])
def test_fp16_with_loss_scaling_on_two_devices_matches_one_device(kind):
    """The one fit drives data-parallel steps with the policy and the loss scale. Each device
    differentiates its half batch in float16, so a step at the edge of overflow may overflow
    on one device and not on the whole batch (as in torch DDP + GradScaler): the scale backs
    off at most one extra time, and training ends at the same loss."""
    import optax

    from funcnet import data, nn, train

    (x, y), _ = data.load("digits")
    x, y = x[:512], y[:512]
    model, tx = nn.MLP([64, 32, 10]), optax.sgd(0.1)
    runs = []
    for devices in (None, 2):
        runs.append(train.fit(model, tx, (x, y), epochs=2, batch_size=64, key=jax.random.key(0), progress=False,
                              policy="fp16", loss_scale=DynamicLossScale(init_scale=2.0 ** 24),
                              devices=devices, parallel=kind if devices else None))
    (one, h1), (two, h2) = runs
    skipped = [sum(r["skipped_steps"] for r in h) for h in (h1, h2)]
    assert skipped[0] > 0 and abs(skipped[0] - skipped[1]) <= 1, skipped
    assert h2[-1]["loss_scale"] in (h1[-1]["loss_scale"], h1[-1]["loss_scale"] / 2)
    assert h2[-1]["train_loss"] == pytest.approx(h1[-1]["train_loss"], abs=0.05)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(two.params))


def test_float32_fallback_for_tpu_is_exact_for_power_of_two_scales(monkeypatch):
    # TPUs have no float64; the fallback must give the same numbers on GradScaler's default path
    from funcnet import precision as prec

    scales = [jnp.float32(2.0 ** e) for e in (-20, 0, 16, 24, 100)]
    exact = [prec._inverse(s) for s in scales]
    monkeypatch.setattr(prec, "_has_float64", lambda: False)
    for s, (w, post) in zip(scales, exact):
        w32, post32 = prec._inverse(s)
        assert float(w32) * float(post32) == float(w) * float(post) == 1.0 / float(s)
        assert float(prec._times(s, 2.0)) == 2.0 * float(s)
        assert float(prec._times(s, 0.5)) == 0.5 * float(s)
