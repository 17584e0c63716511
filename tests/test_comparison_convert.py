"""The convert comparison: nanoGPT's torch model converted by tracing, its port written by to_source,
its AdamW groups and schedulers converted; trained beside torch step by step; a perturbed weight fails."""

import pytest

from comparisons import convert
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return convert.run(steps=12)


def test_convert_agrees(result):
    assert result.name == "convert" and result.title == convert.TITLE
    assert result.ok, result.report()


def test_every_topic_is_checked(result):
    names = " | ".join(c.name for c in result.checks)
    for topic in ("state_dict keys", "the tie stays one array", "convert(net, x) == torch",
                  "the source to_source wrote", "gradients at step 0", "training loss per step (12 steps",
                  "final lm_head.weight", "a branch on a tensor's value is refused", "LambdaLR of math.cos",
                  "about as long as the torch source"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    # the right-hand side shows the written port, the left the torch classes
    assert "def CausalSelfAttention():" in result.jax.source and "nn.Composite(forward" in result.jax.source
    assert "class CausalSelfAttention" in result.torch.source


def test_perturbed_weight_fails_the_model_checks_only():
    result = convert.run(Options(perturb=1e-2), steps=3)
    failed = result.failed()
    assert "logits from the initial weights: convert(net, x) == torch" in failed, failed
    assert "training loss per step (3 steps, converted AdamW groups + SequentialLR): funcnet == torch" in failed
    assert not any("refused" in f or "to_source wrote" in f for f in failed), failed
