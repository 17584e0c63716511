"""The package contract: torch stays out of `import funcnet`, and the public names exist."""

import subprocess
import sys

import funcnet


def test_import_funcnet_does_not_import_torch():
    code = "import sys, funcnet, funcnet.interop, funcnet.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_public_names_are_exported():
    for name in funcnet.__all__:
        assert hasattr(funcnet, name), name
    for name in ("state_dict", "load_state_dict", "make_step", "run_epoch", "TrainState", "nn", "interop",
                 "precision", "parallel", "memory", "profile", "autodiff", "checkpoint", "data"):
        assert name in funcnet.__all__, name


def test_readme_quick_start_runs():
    import re
    from pathlib import Path

    import jax
    import numpy as np
    import torch

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", readme, re.S).group(1)
    torch.manual_seed(0)
    names = {"x": np.ones((4, 64), np.float32), "k": jax.random.key(9),
             "torch_model": torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))}
    exec(compile(block, "README.md quick start", "exec"), names)
    params = names["params"]
    for key, tensor in names["torch_model"].state_dict().items():  # load_state_dict took torch's weights
        np.testing.assert_array_equal(np.asarray(names["funcnet"].state_dict(params)[key]), tensor.numpy())
    assert names["logits"].shape == (4, 10)
    assert names["metrics"]["loss"].shape == (len(names["x_tr"]) // 32,)
