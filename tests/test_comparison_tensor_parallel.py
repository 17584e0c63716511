"""comparisons.tensor_parallel with TP 2 only (the TP 4 and FSDP x TP meshes run in
`python -m comparisons tensor_parallel`): torch DTensor in 2 gloo processes, JAX equal to one
device and to torch, Megatron's all-reduce count from the HLO."""

from comparisons import tensor_parallel
from comparisons._core import Options


def test_tensor_parallel_comparison_passes():
    result = tensor_parallel.run(Options(), meshes={"TP 2": (1, 1, 2)})
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    assert "losses per step: JAX TP 2 == torch parallelize_module (2 processes)" in names
    assert any(n.startswith("TP 2, 2 layer(s), embedding replicated: all-reduces") for n in names)
    torch_line = next(c for c in result.checks if c.name.startswith("final params: JAX TP 2 == torch"))
    assert "max |diff|" in torch_line.detail
