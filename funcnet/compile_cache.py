"""JAX's persistent compilation cache for funcnet's commands: a second run reads its compiled
programs from disk instead of compiling them again.

torch counterpart: eager mode compiles nothing; ``torch.compile``'s Inductor keeps its own
on-disk cache (``/tmp/torchinductor_$USER``), on by default.

``enable()`` is called by ``funcnet train``, ``python -m comparisons`` and the examples
before their first computation. It points ``jax_compilation_cache_dir`` at the user's cache
folder (``$FUNCNET_COMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/funcnet/jax``, else
``~/.cache/funcnet/jax``) and lowers JAX's thresholds: by default JAX keeps only programs
that took a second or more to compile, which on CPU leaves out almost every program these
commands compile. The same settings go into the environment (``JAX_COMPILATION_CACHE_DIR``
...), so child processes (the data-parallel comparisons' workers) share the cache.

``FUNCNET_NO_COMPILE_CACHE=1`` turns it off (the test suite sets it, so tests never write
into the user's folder). Library code never calls ``enable()``: a program that imports
funcnet decides for itself (``funcnet.compile_cache.enable()`` or JAX's own settings).

Some x86 CPUs reject every cache entry on reload with jax 0.9.1-0.10.1 (jax-ml/jax#38445:
XLA:CPU's loader takes LLVM tuning flags for missing CPU features); JAX then warns once per
program and compiles it again. ``enable()`` watches for that warning: at the first one it
says so once, turns the cache off for the rest of the run, and leaves a marker in the cache
folder so that later runs with the same jax do not write entries that would be rejected.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path

__all__ = ["enable", "cache_dir", "OFF", "DIR"]

OFF = "FUNCNET_NO_COMPILE_CACHE"
DIR = "FUNCNET_COMPILE_CACHE_DIR"
# Programs that compile faster than this are not worth a file: reading one back costs a few ms.
MIN_COMPILE_SECONDS = 0.05
_REJECTED = "Error reading persistent compilation cache entry"
_watching: list = []


def cache_dir() -> Path:
    """Where ``enable()`` keeps the cache: ``$FUNCNET_COMPILE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/funcnet/jax``, else ``~/.cache/funcnet/jax``."""
    if os.environ.get(DIR):
        return Path(os.environ[DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "funcnet" / "jax"


def _off() -> bool:
    return os.environ.get(OFF, "").strip().lower() not in ("", "0", "false", "no")


def _marker(path: Path) -> Path:
    import jax

    return path / f"rejected-by-jax-{jax.__version__}"


def enable(path: str | os.PathLike | None = None, *, min_compile_seconds: float = MIN_COMPILE_SECONDS) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default ``cache_dir()``) for
    programs that take at least ``min_compile_seconds`` to compile. Returns the folder, or
    None when it stays off: ``FUNCNET_NO_COMPILE_CACHE`` is set, the folder cannot be
    created, or an earlier run found this jax's entries rejected on this machine.

    It holds from the next compile on (programs already compiled stay in memory as they
    are). Nothing here starts JAX's backend.
    """
    if _off():
        return None
    import jax

    path = Path(path).expanduser() if path is not None else cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: run without the cache rather than fail
    if _marker(path).exists():
        return None
    settings = {"jax_compilation_cache_dir": str(path),
                "jax_persistent_cache_min_compile_time_secs": float(min_compile_seconds),
                "jax_persistent_cache_min_entry_size_bytes": 0}
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)  # inherited by child processes
    _reset()
    _watch_rejections(path)
    return path


@contextlib.contextmanager
def paused():
    """Inside, every compile is a compile: the persistent cache is neither read nor written
    (restored on exit). For code that measures how long XLA takes to compile: a warm cache
    answers in milliseconds whatever the program, and the measurement would say nothing."""
    import jax

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    _reset()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        _reset()


def _reset() -> None:
    # JAX decides at its first compile whether the cache is used, and keeps that answer:
    # start over, so the settings above (or turning it off) hold from the next compile on
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


def _watch_rejections(path: Path) -> None:
    _watching[:] = [path]
    if getattr(warnings.showwarning, "_funcnet_cache_watch", False):
        return
    previous = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not str(message).startswith(_REJECTED):
            return previous(message, category, filename, lineno, file, line)
        if not _watching or _watching[0] is None:  # said already; the cache is off
            return None
        import jax

        where = _watching[0]
        _watching[0] = None
        jax.config.update("jax_enable_compilation_cache", False)
        os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "False"
        _reset()
        try:
            _marker(where).write_text(f"{message}\n")
        except OSError:
            pass
        print(f"funcnet: JAX's compilation cache in {where} rejects its own entries on this machine (jax "
              f"{jax.__version__}; jax-ml/jax#38445: {str(message)[len(_REJECTED):].strip()[:160]}); it is off "
              f"from now on for this jax version. Every run compiles from scratch; delete {_marker(where).name} "
              f"there after upgrading jax, or set {OFF}=1 to skip the cache.", file=sys.stderr)
        return None

    showwarning._funcnet_cache_watch = True
    warnings.showwarning = showwarning
