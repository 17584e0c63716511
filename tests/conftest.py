"""Strict JAX settings for the whole suite.

- 8 simulated CPU devices (XLA reads the flag once, before JAX starts), so the
  data-parallel tests run on a laptop.
- jax_debug_key_reuse: using a PRNG key twice raises, so randomness bugs fail loudly.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_debug_key_reuse", True)
