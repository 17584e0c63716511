"""Timing that waits for the result, a benchmark helper, and traces.

JAX dispatches work asynchronously: ``f(x)`` returns as soon as the computation
is queued, so a clock read right after it measures the dispatch, not the work.
``jax.block_until_ready`` waits, as ``torch.cuda.synchronize()`` does after
``torch.cuda.Event.record()``; every timer here blocks on the result.

torch counterpart:

```python
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record(); out = model(x); end.record(); torch.cuda.synchronize()
ms = start.elapsed_time(end)
```

is ``out, seconds = timed(model_apply, params, x)`` here.

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import profile
    >>> profile.flops(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 4)))  # 2 * 8 * 16 * 4
    1024.0
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["Timer", "timed", "Benchmark", "benchmark", "trace", "flops", "matmul_peak", "one_core", "reuse_host_memory"]


class Timer:
    """Wall-clock timer for a block of code that waits on the results it is handed.

    ``with Timer() as t: out = t.block(f(x))`` then ``t.seconds``. Without a call
    to ``block`` inside the block, ``seconds`` is the dispatch time only
    (``t.blocked`` says which).
    """

    def __init__(self) -> None:
        self.seconds: float | None = None
        self.blocked = False
        self._start: float | None = None

    def block(self, x: Any) -> Any:
        """``jax.block_until_ready(x)``; returns ``x``."""
        jax.block_until_ready(x)
        self.blocked = True
        return x

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start


def timed(fn: Callable, *args, block: bool = True, **kwargs) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), seconds)``, waiting for the result unless ``block=False``.

    ``block=False`` times only the dispatch: the mistake of timing JAX (or CUDA)
    without synchronizing, kept so it can be measured.
    """
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    if block:
        jax.block_until_ready(out)
    return out, time.perf_counter() - start


class Benchmark(NamedTuple):
    """Seconds per call: ``median``, ``min``, ``mean`` over ``samples`` (one per repeat,
    each the mean of ``number`` calls); ``first``: the first warm-up call, compile
    included (None without warm-up)."""

    median: float
    min: float
    mean: float
    samples: tuple[float, ...]
    number: int
    first: float | None


def _positive(where: str, name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def benchmark(fn: Callable, *args, warmup: int = 1, repeat: int = 5, number: int = 1, **kwargs) -> Benchmark:
    """Time ``fn(*args, **kwargs)`` the way ``timeit`` does, waiting for the results.

    ``warmup`` calls run first and are not counted (the first one compiles a jitted
    ``fn``; with ``warmup=0`` the compile lands in the first sample). Then
    ``repeat`` samples of ``number`` calls each; the ``number`` results are kept
    and waited for together, so calls may overlap as they would in a loop.
    """
    _positive("benchmark", "warmup", warmup, 0)
    _positive("benchmark", "repeat", repeat, 1)
    _positive("benchmark", "number", number, 1)
    first = None
    for i in range(warmup):
        _, seconds = timed(fn, *args, **kwargs)
        first = seconds if i == 0 else first
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready([fn(*args, **kwargs) for _ in range(number)])
        samples.append((time.perf_counter() - start) / number)
    return Benchmark(
        median=statistics.median(samples),
        min=min(samples),
        mean=statistics.fmean(samples),
        samples=tuple(samples),
        number=number,
        first=first,
    )


@contextlib.contextmanager
def trace(logdir: str | Path, *, create_perfetto_link: bool = False) -> Iterator[Path]:
    """Record a profiler trace of the block into ``logdir`` (``jax.profiler.trace``).

    Writes ``logdir/plugins/profile/<run>/*.xplane.pb`` (TensorBoard / XProf) and a
    ``*.trace.json.gz`` (Perfetto, chrome://tracing). torch counterpart:
    ``torch.profiler.profile(on_trace_ready=tensorboard_trace_handler(logdir))``.
    Block on the results inside the block, or the work may finish after the trace.
    """
    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"trace: logdir {str(path)!r} exists and is not a directory; pass a directory path")
    path.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(path), create_perfetto_link=create_perfetto_link):
        yield path


def flops(fn: Callable, *args, optimized: bool = True, **kwargs) -> float:
    """Floating-point operations of one call, from XLA's cost analysis of ``fn`` (a
    ``jax.jit`` result or a plain function); nothing is executed.

    ``optimized=True`` analyses the compiled executable; ``optimized=False`` the lowered
    program before optimisation: no compile, and within a fraction of a percent for
    dense layers (fusion moves elementwise work, it does not remove matmuls).
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*args, **kwargs)
    cost = (lowered.compile() if optimized else lowered).cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax returned one dict per device
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        raise RuntimeError(f"XLA gave no flop count for {getattr(fn, '__name__', fn)!r} on {jax.default_backend()}")
    return float(cost["flops"])


def matmul_peak(n: int = 1024, dtype: Any = jnp.float32, *, repeat: int = 5, number: int = 4) -> float:
    """Measured throughput (FLOP/s) of an ``n x n`` by ``n x n`` matmul on the default
    device: ``2 * n**3`` FLOPs per call over the fastest sample (``benchmark``'s ``min``),
    the machine's practical ceiling for dense float work at that size."""
    n = _positive("matmul_peak", "n", n, 1)
    keys = jax.random.split(jax.random.key(n))
    a = jax.random.normal(keys[0], (n, n), dtype)
    b = jax.random.normal(keys[1], (n, n), dtype)
    result = benchmark(jax.jit(jnp.matmul), a, b, warmup=2, repeat=repeat, number=number)
    return 2.0 * n**3 / result.min


def one_core() -> int:
    """Confine this process (JAX, torch and every thread they start later) to one CPU core,
    for a one-core-a-side comparison; returns the core. Call it before JAX's first
    computation.

    ``--xla_cpu_multi_thread_eigen=false`` (also set here) does not make XLA:CPU single-threaded:
    its runtime still runs independent operations of a program side by side on a thread pool
    of one thread per core, and its convolution library waits for them on that pool. On a
    2-core machine a train step then takes about half its CPU time in wall time, and the CPU
    time includes the pool's waiting (MobileNetV3-Small's step at 224 px: 189-247 ms of CPU in
    104-140 ms of wall, 175 ms on one core), so neither clock says what one core does.
    torch's counterpart is ``torch.set_num_threads(1)``, which it still needs (its thread pool
    is not sized by the core count alone). Linux only (``os.sched_setaffinity``)."""
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError("one_core: this platform has no os.sched_setaffinity (Linux only); "
                           "run the benchmark without its one-core option here")
    _before_jax_starts("one_core")
    core = min(os.sched_getaffinity(0))
    # a thread started before this call (by an import) keeps its own mask: set every thread's
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:  # the thread has ended since the listing
            pass
    flag = "--xla_cpu_multi_thread_eigen=false"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    return core


def _before_jax_starts(name: str) -> None:
    from jax._src import xla_bridge

    if getattr(xla_bridge, "backends_are_initialized", lambda: False)():
        raise RuntimeError(f"{name}: JAX's CPU backend has already started its thread pool; call profile.{name}() before "
                           "the first JAX computation (before jax.devices(), jnp.ones(...), ...)")


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def reuse_host_memory() -> None:
    """Keep the host memory a compiled call frees for the next call, instead of handing it back to
    the operating system and taking it again, zero-filled page by page, in every call. Call it
    before JAX's first computation; glibc (Linux) only.

    XLA:CPU allocates each call's scratch memory (``compiled.memory_analysis().temp_size_in_bytes``:
    a train step's saved activations and gradients, 303 MiB for a ConvNeXt-style stack at 224 px,
    batch 8) as one block, from a worker thread, and frees it when the call ends. glibc serves a
    block that large from its own ``mmap`` and returns it with ``munmap``, so the next call faults
    in every page again: 77 500 page faults and 130 of 520 ms a step in the kernel on one core,
    where torch's allocations (one tensor at a time) stay in the heap. Here glibc serves every
    thread from its main heap (``M_ARENA_MAX`` 1: a worker thread's own arena would still ``mmap``
    a block larger than its 64 MiB heap), never by ``mmap`` (``M_MMAP_MAX`` 0), and never gives
    the free top of the heap back (``M_TRIM_THRESHOLD`` -1). The cost: the process keeps its peak
    memory until it exits, as torch's CUDA caching allocator does on a GPU, and that peak can hold
    two calls' scratch memory, a call starting before the last one's is freed (ResNet-18's train
    step at 224 px, batch 64, 1.7 GiB of it: 6.8 GiB resident at the peak against 5.0).

    The environment variables ``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1``
    set before Python starts do the same; an allocator that keeps freed memory (jemalloc,
    tcmalloc through ``LD_PRELOAD``) is another way."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        raise RuntimeError(f"reuse_host_memory: glibc's mallopt is needed (Linux with glibc), this is "
                           f"{platform.system()} {platform.libc_ver()[0] or 'without glibc'}; run without it here")
    _before_jax_starts("reuse_host_memory")
    libc = ctypes.CDLL(None)
    for name, param, value in (("M_ARENA_MAX", _M_ARENA_MAX, 1), ("M_MMAP_MAX", _M_MMAP_MAX, 0),
                               ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, -1)):
        if libc.mallopt(param, value) != 1:
            raise RuntimeError(f"reuse_host_memory: glibc's mallopt({name}, {value}) failed")
