"""The acceptance rule of benchmarks/convert_zoo_libraries.py: a pure function of a row's figures
(no torch, timm or jax), so tests/test_convert_zoo_rule.py checks it on synthetic rows.

The float32 rule (``classify``, a pure function of the figures). A figure past its float32 bound
is float32 rounding that the model amplifies, not a difference in what is computed, when both:

1. the model converted in float64 agrees with torch in float64 (``<m>64``) within
   ``4 * e * 2**-29`` (and never above 1e-8), ``e`` the sum of the two float32 results' distances
   from torch in float64 (ours + torch's, condition 2's figures; at least ``x``, the float32 figure):
   rounding scales with the eps, and float64's is 2**-29 of float32's, so the same amplification
   leaves each float64 result that fraction of its float32 distance from the exact answer, and
   the two float64 results at most the sum apart (the 4 is slack: the amplification is not
   exactly linear). The gap ``x`` alone is no such bound: two float32 runs whose errors land on
   the same side are nearer each other than either is to the answer (timm's ReXNet at 96 px:
   6.2e-4 apart, each 1.8e-3 from float64), while their float64 runs need not be. A logic error
   (a misplaced eps, a wrong axis, a missed branch) does not shrink with the precision; a cap
   1000x below the tightest float32 bound (1e-5) keeps any it could produce from passing, and
   condition 2 refuses ours far from the answer;
2. funcnet's float32 result is as near the exact answer as torch's own: against torch in
   float64, ours within 4x of torch's float32 (or within the float32 bound itself); the
   script gives for gradients the farthest of torch at one thread, at two (torch's float32
   gradients move with its thread count: its reductions split by thread) and on inputs one
   float apart (a gradient jumps at a ReLU kink or a max pool's tie, where float32 lands on
   either side by its rounding, for an input float32 cannot tell from this one). Two correct
   float32 computations that sum in different orders (XLA's fusions and tree reductions, oneDNN's
   blocked loops) are off by similar amounts, and the largest of many such errors varies between
   them by a small factor; 4 (two bits) admits that and no more: an implementation that loses
   more precision than torch's is WRONG even when float64 agrees.

Otherwise the row is ``WRONG``. The rule applies to ``fwd``, ``grad`` and ``state`` alike; the
float64 figures are measured only for a row with a figure past its bound.
"""

from __future__ import annotations

__all__ = ["FWD_TOL", "GRAD_TOL", "STATE_TOL", "SRC_TOL", "TOLS", "EPS_RATIO", "FACTOR", "F64_CAP", "VACUOUS",
           "classify"]

FWD_TOL, GRAD_TOL, STATE_TOL, SRC_TOL = 1e-5, 1e-4, 1e-4, 1e-5
TOLS = {"fwd": FWD_TOL, "grad": GRAD_TOL, "state": STATE_TOL}
EPS_RATIO = 2.0 ** -52 / 2.0 ** -23  # float64's eps over float32's: 2**-29 = 1.9e-9
FACTOR = 4  # how much further from the exact answer than torch's float32 ours may be, and float64's slack
F64_CAP = 1e-8  # the float64 bound never exceeds this: 1000x below the tightest float32 bound
VACUOUS = 1e-20  # a compared output or gradient no larger than this is zeros: the comparison cannot fail


def _rounding(x: float, tol: float, exact, x64) -> bool:
    """Whether a float32 figure ``x`` past ``tol`` is float32 rounding the model amplifies (the rule
    of the module docstring): ``exact`` is (ours in float32, torch in float32), each against torch in
    float64; ``x64`` the float64 conversion against torch in float64."""
    if exact is None or x64 is None:
        return False
    ours, theirs = exact
    as_rounding = x64 <= min(F64_CAP, FACTOR * max(x, ours + theirs) * EPS_RATIO)  # (1) shrinks with eps
    as_close = ours <= max(tol, FACTOR * theirs)  # (2) as near the exact answer as torch's float32
    return as_rounding and as_close


def classify(row: dict) -> tuple[str, str]:
    """``(status, why)`` of a converted model's row from its figures alone (no torch, no timm).

    ``row`` holds ``fwd``/``grad``/``state`` (float32, ours against torch; None: not measured),
    optionally ``fwd_scale``/``grad_scale`` (torch's largest output and gradient), and for a
    figure past its bound ``<m>_exact`` = [ours, torch's float32] against torch in float64 and
    ``<m>64`` (the float64 conversion against torch in float64). ``WRONG``: a figure past its
    bound that is not float32 rounding; ``vacuous``: otherwise within bounds, but an output or
    gradient compared is zeros; ``match (f32 rounding)``: a figure past its float32 bound that the
    rule accepts; else ``match``."""
    bad, rounding, notes = [], [], []
    for m, tol in TOLS.items():
        x = row.get(m)
        if x is None or x <= tol:
            continue
        exact, x64 = row.get(m + "_exact"), row.get(m + "64")
        (rounding if _rounding(x, tol, exact, x64) else bad).append(m)
        note = f"{m} {x:.1e}"
        if exact is not None:
            note += f" (against torch float64: ours {exact[0]:.1e}, torch's float32 {exact[1]:.1e}"
            note += f"; float64 conversion {x64:.1e})" if x64 is not None else ")"
        notes.append(note)
    vacuous = [m for m in ("fwd", "grad") if row.get(m + "_scale") is not None and row[m + "_scale"] <= VACUOUS]
    notes += [f"{m} compares zeros" for m in vacuous]
    if bad:
        status = "WRONG"
    elif vacuous:
        status = "vacuous"
    else:
        status = "match (f32 rounding)" if rounding else "match"
    return status, "; ".join(notes)
