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
