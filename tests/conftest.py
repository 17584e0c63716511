"""Strict JAX settings for the whole suite.

- 8 simulated CPU devices (XLA reads the flag once, before JAX starts), so the
  data-parallel tests run on a laptop.
- jax_debug_key_reuse: using a PRNG key twice raises, so randomness bugs fail loudly.
- Machine code without LLVM's optimizations (``--xla_backend_optimization_level=0``):
  the suite's programs are tiny and compiled once or twice each, so most of its time is
  XLA:CPU's compile, about half of it LLVM's. XLA's own passes (fusion, layout, buffer
  assignment, collectives) are those of a default compile (``tests/test_memory.py``
  checks the HLO and the buffers), and every result is checked against torch or a
  second JAX program built the same way. Measured on 147 tests of CLI training, the
  training loop, the GPT comparison and BatchNorm: 127 CPU-s against 164. The examples
  (``tests/test_examples.py``) run with the default flags, as a user runs them.
"""

import os
import signal

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_debug_key_reuse", True)

# A shell starts a background job (``.ci/run &``, ``nohup``) with SIGINT ignored, and every
# process it starts inherits that: the tests that press Ctrl-C on a training command would
# see it ignored (the run went on to its last epoch and exited 0). Python's own handler is
# reset to the default by exec, so children start as from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """No result depends on torch's thread count; on a small shared CPU its spinning
    intra-op threads make the comparisons' tiny ops tens of times slower."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# No test writes into the user's compilation cache folder (funcnet.compile_cache, which
# funcnet train, the comparisons and the examples turn on); inherited by subprocesses.
os.environ["FUNCNET_NO_COMPILE_CACHE"] = "1"
