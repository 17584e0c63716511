"""What every comparison returns, and the checks it is built from.

A comparison module ``comparisons/NAME.py`` defines ``TITLE`` (one line) and
``run(opts: Options) -> Result``. ``run`` executes the PyTorch form and the JAX
form of one idea on the same numbers and returns both sources, both outputs,
both timings and a list of ``Check``s; the verdict passes only if every check
passes (and there is at least one).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["Options", "Check", "Side", "Result", "Seconds", "TOL", "close", "equal", "expect", "raises", "timed",
           "source", "require_x64", "dtypes", "run_sections", "fmt_seconds", "progress", "showing_progress",
           "side_by_side", "torch_processes"]

# torch.testing.assert_close defaults for float32 (rtol 1.3e-6, atol 1e-5); in float64
# both frameworks run the same IEEE operations in (possibly) different orders, so
# agreement is limited by reassociation of sums, far below 1e-10.
TOL = {
    "float32": {"rtol": 1.3e-6, "atol": 1e-5},
    "float64": {"rtol": 1e-10, "atol": 1e-12},
}


@dataclass(frozen=True)
class Options:
    """dtype: "float32" or "float64" (float64 needs JAX_ENABLE_X64=1 before JAX starts;
    the runner does that in its own process). perturb: added to one JAX-side weight
    where the comparison has weights, to show that the verdict can fail."""

    dtype: str = "float32"
    perturb: float = 0.0

    @property
    def tol(self) -> dict:
        return TOL[self.dtype]


@dataclass
class Check:
    """detail: what was measured, the tolerance and why, in one line. tolerance and why
    repeat those two parts on their own (``close`` and ``equal`` fill them) for the page."""

    name: str
    ok: bool
    detail: str
    tolerance: str = ""
    why: str = ""


class Seconds(float):
    """Wall seconds of a first call (``timed`` returns one), carrying ``compile``: the part
    of them spent tracing, lowering and compiling (JAX's compile events, torch.compile's),
    and ``steady``: the seconds of a repeat call once everything is compiled (None where
    unknown).

    A plain float where a float is expected; ``Side`` reads the two off it, so a
    comparison that passes ``timed``'s seconds to ``Side`` reports the split unchanged."""

    compile: float
    steady: float | None

    def __new__(cls, seconds: float, compile: float = 0.0, steady: float | None = None):
        self = super().__new__(cls, seconds)
        self.compile, self.steady = float(compile), (None if steady is None else float(steady))
        return self

    def __add__(self, other):
        if isinstance(other, Seconds):
            steady = None if self.steady is None or other.steady is None else self.steady + other.steady
            return Seconds(float(self) + float(other), self.compile + other.compile, steady)
        return float(self) + other

    __radd__ = __add__


@dataclass
class Side:
    """One framework's form of the idea: its source, what it printed, and its timing.

    seconds: the first call of the timed work, tracing and compilation included (what a
    user waits for the first time). compile_seconds: the part of it spent tracing and
    compiling (0 for torch eager). steady_seconds: the same work called again, once
    compiled. The last two are read off a ``Seconds`` (from ``timed``); a comparison that
    measured its steady state apart passes ``steady_seconds=`` (and may leave seconds None
    when it compiled outside its timing)."""

    source: str
    output: str
    seconds: float | None = None
    compile_seconds: float | None = None
    steady_seconds: float | None = None

    def __post_init__(self):
        if self.compile_seconds is None:
            self.compile_seconds = getattr(self.seconds, "compile", None)
        if self.steady_seconds is None:
            self.steady_seconds = getattr(self.seconds, "steady", None)
        if self.seconds is not None:
            self.seconds = float(self.seconds)

    def timing_json(self) -> dict:
        return {"seconds": self.seconds, "first_call_seconds": self.seconds,
                "compile_seconds": self.compile_seconds, "steady_seconds": self.steady_seconds}


@dataclass
class Result:
    name: str
    title: str
    torch: Side
    jax: Side
    checks: list[Check]
    notes: str = ""
    # plot title -> {curve label -> values}; the report draws each as overlaid lines
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def failed(self) -> set[str]:
        """The names of the checks that failed."""
        return {c.name for c in self.checks if not c.ok}

    def report(self) -> str:
        """Every check on its own line, marked ok or FAIL, with its detail."""
        return "\n".join(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "ok": self.ok,
            "checks": [c.__dict__ for c in self.checks],
            "torch": {"output": self.torch.output, "source": self.torch.source, **self.torch.timing_json()},
            "jax": {"output": self.jax.output, "source": self.jax.source, **self.jax.timing_json()},
            "notes": self.notes,
            "series": self.series,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Result":
        """The Result that ``to_json`` wrote (``--from-json`` renders a saved run without re-running it)."""
        def side(s: dict) -> Side:
            return Side(s.get("source", ""), s["output"], s.get("first_call_seconds", s.get("seconds")),
                        s.get("compile_seconds"), s.get("steady_seconds"))

        checks = [Check(**c) for c in d["checks"]]
        return cls(d["name"], d["title"], side(d["torch"]), side(d["jax"]), checks, d.get("notes", ""),
                   d.get("series", {}))


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu()
        x = (x.float() if x.is_floating_point() and x.element_size() < 4 else x).numpy()
    a = np.asarray(x)
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16", "float16"):  # ml_dtypes' bfloat16 and half
        a = a.astype(np.float32)
    return a


def close(name: str, got: Any, expected: Any, *, rtol: float, atol: float, why: str = "") -> Check:
    """|got - expected| <= atol + rtol * |expected| elementwise (torch.testing.assert_close's rule)."""
    a, b = _np(got), _np(expected)
    if a.shape != b.shape:
        return Check(name, False, f"shapes differ: {a.shape} vs {b.shape}")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    ok = bool(np.all(diff <= atol + rtol * np.abs(b.astype(np.float64))))
    max_abs = float(diff.max()) if diff.size else 0.0
    # relative errors only where the reference is clear of zero (|expected| > atol): near zero a
    # rounding-sized difference divided by a tiny reference is a meaningless huge ratio
    ref = np.abs(b.astype(np.float64))
    away = ref > max(atol, np.finfo(np.float64).tiny)
    rel = (f"max rel {float((diff[away] / ref[away]).max()):.2e}" if away.any()
           else "max rel n/a (reference within atol of 0)")
    detail = f"max |diff| {max_abs:.2e}, {rel} (rtol {rtol:g}, atol {atol:g})"
    if why:
        detail += f"; {why}"
    return Check(name, ok, detail, tolerance=f"rtol {rtol:g}, atol {atol:g}", why=why)


def equal(name: str, got: Any, expected: Any, why: str = "") -> Check:
    """Exact equality (values, or arrays elementwise with equal shapes)."""
    if isinstance(got, (str, bool, int, tuple, list, dict, type(None))) and not hasattr(got, "shape"):
        ok = got == expected
    else:
        a, b = np.asarray(_np(got)), np.asarray(_np(expected))
        ok = a.shape == b.shape and bool(np.array_equal(a, b))
    detail = f"{_short(got)} == {_short(expected)}" if ok else f"{_short(got)} != {_short(expected)}"
    return Check(name, bool(ok), detail + (f"; {why}" if why else ""), tolerance="exact", why=why)


def expect(name: str, condition: bool, detail: str) -> Check:
    return Check(name, bool(condition), detail)


def raises(name: str, fn: Callable[[], Any], exc_type: type | tuple, match: str | None = None) -> Check:
    """fn() must raise exc_type (whose message contains ``match``)."""
    try:
        fn()
    except exc_type as e:  # noqa: PERF203
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if match is not None and match not in str(e):
            return Check(name, False, f"raised {type(e).__name__} without {match!r}: {msg[:160]}")
        return Check(name, True, f"raised {type(e).__name__}: {msg[:160]}")
    except Exception as e:  # the wrong error is a failed check, not a crash
        return Check(name, False, f"raised {type(e).__name__} instead of {exc_type}: {str(e)[:160]}")
    return Check(name, False, f"did not raise {exc_type}")


def _block(x):
    try:
        import jax

        jax.block_until_ready(x)
    except Exception:
        pass
    return x


class _CompileClock:
    """The wall time spent tracing and compiling while it is open, from JAX's compile
    events (``/jax/core/compile/...``: trace, lowering, XLA compile) and torch.compile's
    start/end callbacks. Events nest (a jit traced inside another's trace), so the
    time is the length of the union of their intervals, not the sum of durations."""

    _open: list["_CompileClock"] = []
    _lock = threading.Lock()
    _jax_hooked = False
    _torch_hooked = False

    def __init__(self):
        self.spans: list[tuple[float, float]] = []
        self.opened = time.time()

    @classmethod
    def _record(cls, start: float, end: float) -> None:
        with cls._lock:
            for clock in cls._open:
                clock.spans.append((start, end))

    @classmethod
    def _hook(cls) -> None:
        if not cls._jax_hooked and "jax" in sys.modules:
            import jax.monitoring

            def on_span(event, start, end, **_):  # time.time() stamps
                if event.startswith("/jax/core/compile/"):
                    cls._record(start, end)

            jax.monitoring.register_event_time_span_listener(on_span)
            cls._jax_hooked = True
        # torch.compile(...) imports torch._dynamo when the wrapper is made, before it is timed
        if not cls._torch_hooked and "torch._dynamo" in sys.modules:
            from torch._dynamo import callback

            started = threading.local()
            callback.on_compile_start(lambda *_: setattr(started, "t", time.time()))
            callback.on_compile_end(lambda *_: cls._record(getattr(started, "t", time.time()), time.time()))
            cls._torch_hooked = True

    def __enter__(self):
        self._hook()
        with self._lock:
            self._open.append(self)
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._open.remove(self)

    @property
    def seconds(self) -> float:
        total, reach = 0.0, float("-inf")
        for start, end in sorted((max(s, self.opened), e) for s, e in self.spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


def timed(fn: Callable[..., Any], *args, repeat: int = 1, steady: bool = True, **kwargs) -> tuple[Any, float]:
    """(result of the last call, median seconds per call); JAX results are waited for.

    With ``repeat=1`` the seconds are a ``Seconds``: the first call's wall time, the part
    of it spent tracing and compiling (``.compile``) and the steady state (``.steady``).
    A call that compiled nothing (torch eager, JAX already warm) is its own steady state.
    A call that compiled is called once more, its output and printing discarded, to time
    a warm call: the first call's result is the one returned, so ``fn`` must give the
    same checks when called twice (pure, as JAX functions are, or idempotent). Pass
    ``steady=False`` where a second call would change what is checked (it counts
    compilations, say); the steady state is then unknown (None). A first compiled run
    also pays one-off costs the compile events miss (XLA:CPU prepares kernels on the
    first execution), so first - compile is not the steady state: only a repeat is."""
    times, out = [], None
    _stage(getattr(fn, '__name__', type(fn).__name__))
    with _CompileClock() as clock:
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            out = _block(fn(*args, **kwargs))
            times.append(time.perf_counter() - t0)
    if repeat > 1:
        return out, float(np.median(times))
    first, compiled = times[0], min(clock.seconds, times[0])
    if not compiled:
        return out, Seconds(first, 0.0, first)
    again = None
    if steady:
        with contextlib.redirect_stdout(io.StringIO()), _CompileClock() as reclock:
            try:
                t0 = time.perf_counter()
                _block(fn(*args, **kwargs))
                again = time.perf_counter() - t0
            except Exception:  # a donated input, say: the steady state stays unknown
                again = None
        if again is not None:  # fn makes new jitted functions on each call: their compile is no steady cost
            again = max(again - reclock.seconds, 0.0)
    return out, Seconds(first, compiled, again)


def source(*objs) -> str:
    """The source text of functions/classes, dedented and joined by a blank line."""
    return "\n\n".join(textwrap.dedent(inspect.getsource(o)).rstrip() for o in objs)


def fmt_seconds(seconds: float | None) -> str:
    """At most 7 characters, three significant digits: "0.42 ms", "15.2 ms", "153 ms", "2.45 s"; "-" if unknown."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"
    ms = seconds * 1e3
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _short(x, limit: int = 80) -> str:
    s = repr(x) if not hasattr(x, "shape") else np.array2string(np.asarray(_np(x)), threshold=8, precision=6)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def require_x64(opts: Options) -> None:
    """float64 runs need 64-bit JAX, a process-wide setting fixed at start-up."""
    import jax

    if opts.dtype not in TOL:
        raise ValueError(f"Options.dtype is {opts.dtype!r}, expected one of {sorted(TOL)}")
    if opts.dtype == "float64" and not jax.config.jax_enable_x64:
        raise RuntimeError("Options(dtype='float64') needs 64-bit JAX, which is off in this process; "
                           "start Python with JAX_ENABLE_X64=1 (python -m comparisons --float64 does that)")


def dtypes(opts: Options):
    """(torch dtype, jnp dtype) for ``opts.dtype``, after ``require_x64``."""
    import jax.numpy as jnp
    import torch

    require_x64(opts)
    return getattr(torch, opts.dtype), jnp.dtype(opts.dtype)


def run_sections(fns, args, *, steady: bool = True):
    """Run each ``fn(*a)`` with its printed lines captured: (results, text, seconds).

    seconds: the sum of the sections' ``Seconds`` (see ``timed`` for ``steady``).

    The text heads each section with the function's name after its first underscore
    (``torch_views`` -> ``# views``)."""
    results, text, seconds = [], [], Seconds(0.0, 0.0, 0.0)
    for fn, a in zip(fns, args):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            out, s = timed(fn, *a, steady=steady)
        results.append(out)
        text.append(f"# {fn.__name__.split('_', 1)[1]}\n{buf.getvalue().rstrip()}")
        seconds += s
    return results, "\n".join(text), seconds


# ----------------------------------------------------------------------------- progress
_progress_shown: Callable[[str, int, int | None], None] | None = None


def progress(items, description: str, *, total: int | None = None):
    """Iterate over ``items`` (configurations, steps) while the runner shows ``description``
    and a bar of the items done; outside the runner (a test, ``run()`` called by hand)
    nothing is shown. ``total`` defaults to ``len(items)``."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    show = _progress_shown
    if show is not None:
        show(description, 0, total)
    for done, item in enumerate(items, 1):
        yield item
        if show is not None:
            show(description, done, total)


def _stage(description: str) -> None:
    """Tell the runner a new stage began (one of ``timed``'s calls, say); nothing outside it."""
    if _progress_shown is not None:
        _progress_shown(description, 0, None)


@contextlib.contextmanager
def showing_progress(show: Callable[[str, int, int | None], None]):
    """Inside, ``progress`` reports to ``show(description, done, total)`` (the runner's bar)."""
    global _progress_shown
    before, _progress_shown = _progress_shown, show
    try:
        yield
    finally:
        _progress_shown = before


def side_by_side(jobs: dict, description: str) -> dict:
    """``{name: job()}`` for independent jobs (``{name: callable}``), run one thread per core
    while the runner shows ``description`` and a bar of the jobs done. For jobs that compile:
    XLA's compile releases the GIL, so their programs compile side by side."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        for _ in progress(as_completed(futures.values()), description, total=len(futures)):
            pass
    return {name: future.result() for name, future in futures.items()}


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread inside (restored after): on these tiny ops extra OpenMP threads only
    wait on each other (the gpt comparison: 26 s with two threads on a busy machine, 1 s with one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- torch processes
# what every torch worker of the parallel comparisons imports: loaded once, in the fork server
_WORKER_IMPORTS = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
                   "torch.nn.parallel", "comparisons._torch_gpt"]


def torch_processes(worker: Callable[..., Any], args: tuple, nprocs: int):
    """``torch.multiprocessing`` processes running ``worker(rank, *args)``, not joined (the
    caller joins the returned context while its JAX side runs).

    Started from a fork server that imported torch and torch.distributed once: a spawned
    process imports them again (about 3.5 CPU-s each, 7 s of wall to start 4 on 2 cores),
    a process forked from the server starts in milliseconds, and the server serves every
    comparison of the run. The server holds no JAX and runs no torch op before it forks, so
    the fork copies no threads. Where fork servers do not exist (Windows), processes are
    spawned."""
    import multiprocessing

    import torch.multiprocessing as mp

    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(_WORKER_IMPORTS)  # read when the server starts: the first call
    return mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method=method)


def jax_in_child(module: str, workdir, *args: str, devices: int = 8, x64: bool = False, xla_flags: str = "",
                 timeout: float = 1800) -> None:
    """Run ``python -m module workdir *args`` with ``devices`` simulated CPU devices and ``xla_flags``
    added to XLA_FLAGS (JAX fixes its device count when it starts, so a JAX side that needs more than
    this process has runs in a child); the child writes its results into ``workdir``. Its stderr's
    tail is raised if it fails."""
    import subprocess

    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices} {xla_flags}"
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1" if x64 else "0")
    done = subprocess.run([sys.executable, "-m", module, str(workdir), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode:
        raise RuntimeError(f"the JAX part ({module}) failed in its child process:\n{done.stderr[-3000:]}")
