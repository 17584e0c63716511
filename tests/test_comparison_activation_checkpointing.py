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
    # in the same process, so the perturbed run reuses the compiled programs and the measured memory
    # (activation_checkpointing._REUSED) and costs only its gradient calls and torch's side
    _a_perturbed_jax_weight_fails_every_torch_check_and_no_other()


def _a_perturbed_jax_weight_fails_every_torch_check_and_no_other():
    result = ac.run(Options(perturb=1.0), config=SMALL, batch=4)  # 1e-2 moves this loss by < its 1e-4 tolerance
    cross = [c for c in result.checks if c.name.endswith(("== torch checkpoint", "== torch.utils.checkpoint"))]
    # the loss and the gradient of each parameter: wte, wpe, 12 per block, ln_f's 2 (lm_head is tied to wte)
    assert len(cross) == 1 + 2 + 12 * SMALL.n_layer + 2
    assert not any(c.ok for c in cross), [c.name for c in cross if c.ok]
    # JAX against JAX and torch against torch (the memory counts) do not see the perturbation
    others = [c for c in result.checks if c not in cross]
    assert others and all(c.ok for c in others), [(c.name, c.detail) for c in others if not c.ok]
