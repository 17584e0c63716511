"""comparisons.activation_checkpointing on a 2-layer GPT: gradients equal to torch's
checkpointed ones, torch's saved bytes equal to the Korthikanti estimate within 10%, XLA's
remat in a scan frees memory, remat in a Python loop does not (XLA:CPU)."""

from comparisons import activation_checkpointing as ac
from comparisons._core import Options
from funcnet import gpt

SMALL = gpt.GPTConfig(block_size=32, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def test_passes_on_a_two_layer_gpt():
    result = ac.run(Options(), config=SMALL, batch=4)
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = {c.name for c in result.checks}
    assert "torch saved bytes with checkpoint: the block inputs (recompute='full')" in names
    assert "XLA:CPU: remat in a Python loop of blocks frees (almost) nothing" in names
