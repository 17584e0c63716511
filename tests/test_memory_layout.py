"""funcnet.memory.layout.plan against closed forms written out here: Korthikanti et al.'s
table 2 (per-layer activations with tensor and sequence parallelism), the unsharded
estimate (memory.estimate), and shards that are 1/N of it."""

import pytest

from funcnet import memory
from funcnet.cli.memory_layout import parse_bytes
from funcnet.memory import layout as ml

SEVEN_B = ml.Shape(n_layer=32, n_embd=4096, n_head=32, vocab_size=32000, block_size=2048, batch=8, dropout=True)


def _layer_only(shape):
    return shape._replace(n_layer=1)


def test_one_device_is_the_unsharded_estimate():
    shape = SEVEN_B._replace(batch=1)
    plan = ml.plan(shape, ml.Layout(precision="bf16"))
    est = memory.estimate(layers=32, hidden=4096, heads=32, vocab=32000, seq=2048, batch=1, optimizer="adam",
                          **memory.PRECISIONS["bf16"], compute_dtype="bfloat16", dropout=True)
    for part in ("params", "grads", "master", "optimizer", "activations"):
        assert getattr(plan, part) == pytest.approx(getattr(est, part), rel=1e-9), part


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_and_sequence_parallel_activations_are_korthikantis_table_2(t):
    s, b, h, a = 2048, 1, 4096, 32
    one, sp = (ml.plan(SEVEN_B._replace(batch=1), ml.Layout(tp=t, sp=v, precision="bf16")) for v in (False, True))
    two = ml.plan(SEVEN_B._replace(batch=1, n_layer=64), ml.Layout(tp=t, precision="bf16"))
    per_layer = (two.activations - one.activations) / 32
    assert per_layer == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))  # TP, no SP
    two_sp = ml.plan(SEVEN_B._replace(batch=1, n_layer=64), ml.Layout(tp=t, sp=True, precision="bf16"))
    assert (two_sp.activations - sp.activations) / 32 == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t)
    sel = [ml.plan(SEVEN_B._replace(batch=1, n_layer=n), ml.Layout(tp=t, sp=True, remat="selective",
                                                                     precision="bf16")) for n in (32, 64)]
    assert (sel[1].activations - sel[0].activations) / 32 == pytest.approx(s * b * h * 34 / t)


def test_fsdp_and_tp_split_the_matrices_and_the_state():
    one = ml.plan(SEVEN_B, ml.Layout(dp=8, precision="bf16"))
    sharded = ml.plan(SEVEN_B, ml.Layout(fsdp=4, tp=2, precision="bf16"))
    # not split 8 ways: LayerNorms and row-parallel biases (whole), the position embedding (fsdp only),
    # 1.8M of 6.6e9 parameters
    assert sharded.optimizer == pytest.approx(one.optimizer / 8, rel=3e-3)
    assert sharded.params == pytest.approx(one.params / 8, rel=3e-3)
    assert one.optimizer == 8 * memory.transformer_params(32, 4096, 32000, 2048)


def test_a_data_axis_holds_the_gradients_twice_at_their_all_reduce_unless_in_place():
    # DDP's buckets / XLA's combined all-reduce: one more copy of each device's gradient shard, only with dp > 1
    for dp, fsdp, tp in [(8, 1, 1), (2, 2, 2), (4, 1, 2)]:
        p = ml.plan(SEVEN_B, ml.Layout(dp, fsdp, tp, precision="bf16"))
        assert p.reduce_buffer == p.grads > 0
        assert p.total == p.params + p.grads + p.reduce_buffer + p.master + p.optimizer + p.activations
        in_place = ml.plan(SEVEN_B, ml.Layout(dp, fsdp, tp, precision="bf16", reduce_in_place=True))
        assert in_place.reduce_buffer == 0 and in_place.total == p.total - p.grads
    for fsdp, tp in [(8, 1), (4, 2), (1, 8)]:  # no data axis: FSDP reduce-scatters layer by layer, TP reduces none
        assert ml.plan(SEVEN_B, ml.Layout(1, fsdp, tp, precision="bf16")).reduce_buffer == 0


def test_the_7b_does_not_fit_replicated_on_80gb_and_the_smallest_fitting_layout():
    assert ml.plan(SEVEN_B, ml.Layout(dp=8, precision="bf16"), device_memory=80 * 10**9).fits is False
    best = ml.smallest_fitting(8, SEVEN_B, 80 * 10**9)
    assert best.fits and best.layout.fsdp * best.layout.tp == 2  # 2-way sharding is the least that fits
    assert ml.plan(SEVEN_B, best.layout._replace(fsdp=1, dp=8 // best.layout.tp)).total > 80 * 10**9


def test_bad_layouts_and_sizes_are_refused():
    with pytest.raises(ValueError, match="tp=3 must divide the 32 heads"):
        ml.plan(SEVEN_B, ml.Layout(tp=3))
    with pytest.raises(ValueError, match="global batch 8 must split"):
        ml.plan(SEVEN_B, ml.Layout(dp=16))
    assert parse_bytes("80GB") == 80 * 10**9 and parse_bytes("16GiB") == 16 * 2**30
    with pytest.raises(ValueError, match="80 gigs"):
        parse_bytes("80 gigs")


def test_cli_prints_a_layout_and_whether_it_fits(capsys):
    from funcnet.cli import memory as memory_command

    seven = ["--transformer", "--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq",
             "2048", "--batch", "8", "--precision", "bf16"]
    assert memory_command.main(seven + ["--fsdp", "4", "--tp", "2", "--remat", "selective",
                                        "--device-memory", "80GB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    plan = ml.plan(SEVEN_B._replace(dropout=True), ml.Layout(1, 4, 2, remat="selective", precision="bf16"))
    assert f"fits: {plan.total / 1e9:.1f} GB of 80 GB per device on 8 devices" in out
    assert memory_command.main(seven + ["--layouts", "8", "--device-memory", "80GB"]) == 0
    assert "smallest fitting layout: dp4 x fsdp2 x tp1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        memory_command.main(["--params", "7B", "--tp", "2"])
    assert "need --transformer" in capsys.readouterr().err


def test_xla_holds_every_gradient_twice_at_a_data_axis_all_reduce():
    # the premise of reduce_buffer, measured: benchmarks/layout_memory.py's GPT on a (2, 1, 1) mesh
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "layout_memory.py"
    spec = importlib.util.spec_from_file_location("layout_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (row,) = bench.measure([(2, 1, 1)])
    plan = row["plan"]
    assert row["arguments"] == pytest.approx(plan["params"] + plan["optimizer"], abs=512)  # step, key, count
    assert row["all-reduce"]["bytes"] >= plan["grads"]  # all the gradients reduced (in one combined all-reduce)
    assert row["temps"] >= plan["grads"] + plan["reduce_buffer"]  # operands and results both live
    assert abs((row["arguments"] + row["temps"]) / plan["total"] - 1) <= 0.10
