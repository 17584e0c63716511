"""funcnet.compile_cache: JAX's persistent compilation cache in a folder of our choosing, off by
an environment variable, and turned off (said once) when JAX rejects its entries."""

import os
import warnings

import jax
import jax.numpy as jnp
import pytest

from funcnet import compile_cache

SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes", "jax_enable_compilation_cache")


@pytest.fixture
def restore(monkeypatch):
    """Whatever a test turns on is put back: JAX's settings, the environment, the cache's
    state, the warnings hook; FUNCNET_NO_COMPILE_CACHE (set for the suite) is lifted."""
    before = {name: getattr(jax.config, name) for name in SETTINGS}
    env = {name.upper(): os.environ.get(name.upper()) for name in SETTINGS}
    monkeypatch.delenv(compile_cache.OFF)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    events = []
    listener = lambda name, **kw: events.append(name)  # noqa: E731
    jax.monitoring.register_event_listener(listener)
    yield events
    jax.monitoring.unregister_event_listener(listener)
    for name, value in before.items():
        jax.config.update(name, value)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    compile_cache._reset()


def _compile(scale):
    # a new function object each call: a fresh trace and lowering, so the persistent cache is asked
    return jax.jit(lambda x: jnp.sin(x) * scale + 1.0)(jnp.ones((5, 3))).block_until_ready()


def test_off_by_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.OFF, "1")
    before = jax.config.jax_compilation_cache_dir
    assert compile_cache.enable(tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists() and jax.config.jax_compilation_cache_dir == before


def test_default_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path / "funcnet" / "jax"
    monkeypatch.setenv(compile_cache.DIR, str(tmp_path / "elsewhere"))
    assert compile_cache.cache_dir() == tmp_path / "elsewhere"


def test_a_second_compile_is_read_from_disk(restore, tmp_path):
    folder = compile_cache.enable(tmp_path / "cache", min_compile_seconds=0)
    assert folder == tmp_path / "cache" and os.environ["JAX_COMPILATION_CACHE_DIR"] == str(folder)
    _compile(2.125)
    assert any(f.name.endswith("-cache") for f in folder.iterdir())
    restore.clear()
    _compile(2.125)  # the same program from a new trace: JAX's own disk lookup, as a new process does
    assert "/jax/compilation_cache/cache_hits" in restore


def test_rejected_entries_are_said_once_and_turn_the_cache_off(restore, tmp_path, monkeypatch, capsys):
    from jax._src import compilation_cache as jax_cache

    folder = compile_cache.enable(tmp_path / "cache", min_compile_seconds=0)
    _compile(3.25)

    def rejected(*args, **kwargs):  # what jax-ml/jax#38445's machines get back for every entry
        raise RuntimeError("Target machine feature +prefer-no-gather is not supported on the host machine.")

    monkeypatch.setattr(jax_cache, "get_executable_and_time", rejected)
    _compile(3.25)
    _compile(3.25)
    err = capsys.readouterr().err
    assert err.count("rejects its own entries") == 1 and "38445" in err
    assert jax.config.jax_enable_compilation_cache is False
    assert compile_cache.enable(folder) is None  # later runs with this jax leave it off


def test_paused_compiles_without_reading_or_writing_then_resumes(restore, tmp_path):
    folder = compile_cache.enable(tmp_path / "cache", min_compile_seconds=0)
    _compile(4.5)
    written = set(folder.iterdir())
    restore.clear()
    with compile_cache.paused():
        _compile(4.5)  # in the cache, but a measurement of compile time must compile
        _compile(5.75)  # new: nothing written
    assert "/jax/compilation_cache/cache_hits" not in restore
    assert set(folder.iterdir()) == written
    restore.clear()
    _compile(4.5)
    assert "/jax/compilation_cache/cache_hits" in restore  # on again after the block
