"""comparisons.fsdp on 1 and 2 devices (the full 1/2/4/8 table runs in `python -m comparisons fsdp`):
torch FSDP2 in 2 gloo processes, ZeRO-3 equal to one device and to torch."""

from comparisons import fsdp
from comparisons._core import Options


def test_fsdp_comparison_passes_and_a_perturbed_weight_fails():
    result = fsdp.run(Options(), devices=(1, 2), zeros=(0, 3))
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    assert "losses per step: JAX ZeRO-3 (2 devices) == torch fully_shard (2 processes)" in names
    assert "ZeRO-3 on 2 device(s): per-device argument bytes == each array's shard + batch/N" in names
    torch_line = next(c for c in result.checks if c.name.startswith("final params: JAX ZeRO-3 == torch"))
    assert "max |diff|" in torch_line.detail
