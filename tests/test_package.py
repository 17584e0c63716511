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


def test_getting_started_quick_start_runs():
    import re
    from pathlib import Path

    import jax
    import numpy as np
    import torch

    page = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text()
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", page, re.S).group(1)
    torch.manual_seed(0)
    names = {"x": np.ones((4, 64), np.float32), "k": jax.random.key(9),
             "torch_model": torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))}
    exec(compile(block, "getting-started.md quick start", "exec"), names)
    params = names["params"]
    for key, tensor in names["torch_model"].state_dict().items():  # load_state_dict took torch's weights
        np.testing.assert_array_equal(np.asarray(names["funcnet"].state_dict(params)[key]), tensor.numpy())
    assert names["logits"].shape == (32, 10)  # the block's own batch of 32
    assert names["metrics"]["loss"].shape == (len(names["x_tr"]) // 32,)


def test_getting_started_state_and_composite_examples_run_as_written():
    """The Quick start's second and third blocks: a BatchNorm model with state against its torch
    twin's state_dict, and the BasicBlock Composite with torch's state_dict keys."""
    import re
    from pathlib import Path

    import numpy as np

    section = (Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text().split("## Quick start", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    names = {}  # the block sets up its own images and torch twin
    exec(compile("import jax, funcnet\nfrom funcnet import nn\n" + blocks[1], "README state block", "exec"), names)
    sd, torch_model = names["sd"], names["torch_model"]  # the block builds its own torch twin and loads it
    assert list(sd) == list(torch_model.state_dict())
    for key, tensor in torch_model.state_dict().items():  # weights and buffers, torch's values
        np.testing.assert_array_equal(np.asarray(sd[key]), tensor.numpy())
    exec(compile("import jax, funcnet\nfrom funcnet import nn\n" + blocks[2], "README composite block", "exec"), names)
    block = names["BasicBlock"](8, 16, stride=2)
    keys = list(funcnet_state_dict(block))
    assert keys[:2] == ["conv1.weight", "bn1.weight"] and "downsample.0.weight" in keys
    assert "downsample.1.num_batches_tracked" in keys


def funcnet_state_dict(model):
    import jax

    import funcnet

    return funcnet.state_dict(model.init(jax.random.key(0)), model.init_state(), model=model)
