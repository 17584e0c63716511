"""The recurrent comparison: an LSTM language model trained with truncated BPTT in torch and
funcnet, step by step; loop vs lax.scan; compile time as the sequence grows; a perturbed weight fails."""

import pytest

from comparisons import recurrent
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return recurrent.run(steps=12)


def test_recurrent_agrees(result):
    assert result.name == "recurrent" and result.title == recurrent.TITLE
    assert result.ok, result.report()


def test_every_topic_is_checked(result):
    names = " | ".join(c.name for c in result.checks)
    for topic in ("state_dict keys", "first batch log-probabilities", "final hidden h_n", "final cell state c_n",
                  "stop_gradient == hidden.detach()", "no cut (backprop through both)", "the cut changes the gradient",
                  "without repackage_hidden", "training loss per TBPTT step", "final rnn.weight_hh_l1",
                  "Python loop of LSTMCell == fused nn.LSTM", "unrolled by jit) == nn.LSTM (one lax.scan)",
                  "compile time of the unrolled loop grows"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    assert "repackage_hidden" in result.torch.source and "stop_gradient" in result.jax.source
    assert "x1.00" in result.torch.output and "fused nn.LSTM" in result.torch.output
    curves = result.series["compile seconds of one LSTM layer's forward by sequence length"]
    assert len(curves["lax.scan"]) == len(curves["Python loop (unrolled)"]) == 3


def test_perturbed_weight_fails_the_output_checks():
    result = recurrent.run(Options(perturb=1e-3), steps=4, compile_lengths=(2, 3, 4))
    failed = result.failed()
    assert "training loss per TBPTT step (4 steps): funcnet == torch" in failed, failed
    assert "first batch log-probabilities (T*B, vocab): funcnet == torch" in failed, failed
    assert "torch: Python loop of LSTMCell == fused nn.LSTM (3 steps)" not in failed, result.report()


def test_float64_without_x64_is_refused():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        recurrent.run(Options(dtype="float64"))
