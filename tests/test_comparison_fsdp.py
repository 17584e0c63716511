"""comparisons.fsdp on 1 and 2 devices (the full 1/2/4/8 table runs in `python -m comparisons fsdp`):
torch FSDP2 in 2 gloo processes, ZeRO-3 equal to one device and to torch."""


from comparisons import fsdp
from comparisons._core import Options


def test_fsdp_comparison_passes():
    result = fsdp.run(Options(), devices=(1, 2), zeros=(0, 3))
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    assert "losses per step: JAX ZeRO-3 (2 devices) == torch fully_shard (2 processes)" in names
    assert "ZeRO-3 on 2 device(s): per-device argument bytes == each array's shard + batch/N" in names
    torch_line = next(c for c in result.checks if c.name.startswith("final params: JAX ZeRO-3 == torch"))
    assert "max |diff|" in torch_line.detail
    _guide_table_matches(result)
    # in the same process, so the perturbed run reuses torch's results and the compiled JAX programs
    # (fsdp._REUSED) and costs only its training steps
    _a_perturbed_jax_weight_fails_the_torch_checks_only()


def _a_perturbed_jax_weight_fails_the_torch_checks_only():
    result = fsdp.run(Options(perturb=1e-2), devices=(1, 2), zeros=(0, 3))
    failed = {c.name for c in result.checks if not c.ok}
    assert {"losses per step: JAX ZeRO-3 (2 devices) == torch fully_shard (2 processes)",
            "final params: JAX ZeRO-3 == torch FSDP2 (full_tensor)"} <= failed, failed
    # the perturbation is on the JAX side's initial weights, so 2 devices' losses still equal one device's (the
    # final params may not: Adam's first steps are lr x sign of near-zero gradients, which the new weights move)
    assert "ZeRO-3 on 2 devices: losses == one device" not in failed
    assert not result.ok


def _guide_table_matches(result):
    """The parallel guide's per-device memory table (arguments + temps) holds the bytes this run printed, for the
    device counts and ZeRO levels it ran (the full table: python -m comparisons fsdp)."""
    import re
    from pathlib import Path

    printed = {}
    for line in result.jax.output.splitlines():
        m = re.fullmatch(r"\s*(\d+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)(?:\s+\d+){3}", line)
        if m:
            printed[int(m[1]), int(m[2])] = int(m[3].replace(",", "")) + int(m[4].replace(",", ""))
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "parallel.md").read_text()
    table = guide.split("| devices | replicated (DDP) | ZeRO-1 | ZeRO-3 |", 1)[1]
    rows = {int(m[1]): (int(m[2].replace(",", "")), int(m[4].replace(",", "")))
            for m in re.finditer(r"^\| (\d+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$", table.split("\n\n")[0], re.M)}
    assert {(1, 0), (2, 0), (1, 3), (2, 3)} <= set(printed), printed
    for n in (1, 2):
        assert rows[n] == (printed[n, 0], printed[n, 3]), (n, rows[n], printed)
