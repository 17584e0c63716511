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
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["Options", "Check", "Side", "Result", "TOL", "close", "equal", "expect", "raises", "timed", "source",
           "require_x64", "dtypes", "run_sections"]

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
    name: str
    ok: bool
    detail: str


@dataclass
class Side:
    source: str
    output: str
    seconds: float | None = None


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
            "torch": {"output": self.torch.output, "seconds": self.torch.seconds},
            "jax": {"output": self.jax.output, "seconds": self.jax.seconds},
            "notes": self.notes,
        }


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
    rel = diff / np.maximum(np.abs(b.astype(np.float64)), np.finfo(np.float64).tiny)
    max_rel = float(rel.max()) if rel.size else 0.0
    detail = f"max |diff| {max_abs:.2e}, max rel {max_rel:.2e} (rtol {rtol:g}, atol {atol:g})"
    if why:
        detail += f"; {why}"
    return Check(name, ok, detail)


def equal(name: str, got: Any, expected: Any, why: str = "") -> Check:
    """Exact equality (values, or arrays elementwise with equal shapes)."""
    if isinstance(got, (str, bool, int, tuple, list, dict, type(None))) and not hasattr(got, "shape"):
        ok = got == expected
    else:
        a, b = np.asarray(_np(got)), np.asarray(_np(expected))
        ok = a.shape == b.shape and bool(np.array_equal(a, b))
    detail = f"{_short(got)} == {_short(expected)}" if ok else f"{_short(got)} != {_short(expected)}"
    return Check(name, bool(ok), detail + (f"; {why}" if why else ""))


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


def timed(fn: Callable[..., Any], *args, repeat: int = 1, **kwargs) -> tuple[Any, float]:
    """(result of the last call, median seconds per call); JAX results are waited for."""
    times, out = [], None
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        out = _block(fn(*args, **kwargs))
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times))


def source(*objs) -> str:
    """The source text of functions/classes, dedented and joined by a blank line."""
    return "\n\n".join(textwrap.dedent(inspect.getsource(o)).rstrip() for o in objs)


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


def run_sections(fns, args):
    """Run each ``fn(*a)`` with its printed lines captured: (results, text, seconds).

    The text heads each section with the function's name after its first underscore
    (``torch_views`` -> ``# views``)."""
    results, text, seconds = [], [], 0.0
    for fn, a in zip(fns, args):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            out, s = timed(fn, *a)
        results.append(out)
        text.append(f"# {fn.__name__.split('_', 1)[1]}\n{buf.getvalue().rstrip()}")
        seconds += s
    return results, "\n".join(text), seconds
