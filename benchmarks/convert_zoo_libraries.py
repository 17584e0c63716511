"""interop.convert on models of timm, torchvision and transformers, each checked against torch.

Needs timm and torchvision beside torch (their own venv: PyPI's torchvision needs its own torch
build; see docs/design.md, "Converting library models"). Every model is built with random
weights (``pretrained=False``, tiny transformers configs; nothing is downloaded), converted on
one input, then compared with torch on a FRESH input (other values, one more in the batch):

- ``fwd``: the eval forward, largest difference relative to the output's largest value
  (float32: passes at <= 1e-5);
- ``grad``: the gradients of the mean square of the train-mode outputs, relative to the
  largest gradient (<= 1e-4);
- ``state``: every buffer after that train step (BatchNorm's running statistics and count),
  relative to each buffer's largest value (<= 1e-4);
- ``src``: ``to_source``'s written model, executed, torch's state_dict loaded strictly, its eval
  forward on the fresh input (<= 1e-5).

Every all-zero weight (a zero-initialised head: timm's Mixer, torchvision's ViT; a residual
branch's zeroed norm scale) is drawn again before anything runs, so no figure compares zeros with
zeros; the row keeps their names (``reinit``), and a row whose output or gradients are still
zeros (``fwd_scale``/``grad_scale`` <= 1e-20) is ``vacuous``, not a match.

Each model ends as ``match``, ``match (f32 rounding)``, ``refused`` (a ConversionError; the first
line of its message is shown), ``WRONG`` (converted, but a figure above its bound: silently
wrong), ``vacuous`` or ``CRASH`` (any other exception, or a ConversionError that reports a funcnet
bug). Dropout and stochastic depth are set to 0 so the train step is deterministic on both sides.

The float32 rule (``classify``) and its reasons are in benchmarks/convert_zoo_rule.py: a figure
past its bound is ``match (f32 rounding)`` only when float64 shows no logic error and ours is
as near the exact answer as torch's float32; otherwise ``WRONG``.

``--lengths`` checks each model again, the same figures, at inputs of other shapes than the one
it was converted on (the converted model records the torch module again per input signature):
each text model at three sequence lengths, each vision model at two image sizes (``LENGTHS``,
``SIZES`` and ``other_inputs`` in benchmarks/convert_zoo_models.py), each from the module's
original weights. ``to_source``'s model, written once from the traced input, runs at each of
them: a port refusing another signature in its one line (its shape guard) is ``refused`` there,
a wrong number makes the input WRONG. Where torch itself raises at an input (a model built for
one image size), the converted model must raise too: refused, or WRONG if it returns a number.
A model's ``status_all`` is the worst over its inputs; the counts are per input.

The model list was fixed before the first run: ``NAMED`` are the models the converter is required
to match, ``HELD_OUT`` the others; ``LENGTHS_HELD_OUT`` was fixed before the first ``--lengths``
run. Each model runs in its own process (``--timeout`` seconds).

    python benchmarks/convert_zoo_libraries.py [--lengths] [--models NAME ...] [--json out.json] [--timeout 900] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from convert_zoo_models import HELD_OUT, LENGTHS_HELD_OUT, MODELS, NAMED, build, other_inputs, reinit_zeros  # noqa: E402
from convert_zoo_rule import GRAD_TOL, SRC_TOL, TOLS, classify  # noqa: E402


def _out_rel(ours, theirs) -> float:
    """tree_rel, with dicts (a ModelOutput, an OrderedDict of heads) matched by key, not by order."""
    from convert_check import tree_rel

    if isinstance(theirs, dict) and isinstance(ours, dict):
        keys = [k for k, v in theirs.items() if v is not None]
        return max([_out_rel(ours[k], theirs[k]) if k in ours else float("inf") for k in keys] + [0.0])
    return tree_rel(ours, theirs)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


def _outcome(e: BaseException) -> tuple[str, str]:
    from funcnet.interop import ConversionError

    if isinstance(e, ConversionError) and "funcnet bug" not in str(e) and "bug in funcnet" not in str(e):
        return "refused", _first_line(e)
    return "CRASH", f"{type(e).__name__}: {_first_line(e)}"


def _largest(tree) -> float:
    """The largest magnitude of a tree of torch tensors (outputs, gradients): 0.0 if none."""
    import torch

    if isinstance(tree, dict):
        return max([_largest(v) for v in tree.values()] + [0.0])
    if isinstance(tree, (tuple, list)):
        return max([_largest(v) for v in tree] + [0.0])
    if isinstance(tree, torch.Tensor) and tree.is_floating_point() and tree.numel():
        return float(tree.detach().abs().max())
    return 0.0


def check(name: str, lengths: bool = False) -> dict:
    """One model: convert, then the figures above on the fresh input; with ``lengths``, the same
    figures again at each of ``other_inputs`` (``sizes``: one row each). The row's ``status`` and
    ``why`` are the fresh input's; ``status_all`` is the worst over every input checked."""

    sys.path.insert(0, os.path.join(ROOT, "tests"))

    from funcnet import interop

    row: dict = {"model": name}
    module, trace, fresh = build(name)
    row["reinit"] = reinit_zeros(module)
    pristine = copy.deepcopy(module)  # to_source reads the weights before the train step changes any buffer
    module.eval()
    start = time.perf_counter()
    try:
        model, params, state = interop.convert(module, **trace)
    except Exception as e:  # noqa: BLE001 (classified: refused or crash)
        row["status"], row["why"] = _outcome(e)
        if row["status"] == "CRASH":
            row["trace"] = traceback.format_exc()[-2000:]
        row["status_all"] = row["status"]
        return row
    row["convert_s"] = round(time.perf_counter() - start, 1)
    written = _written(pristine, trace)
    row.update(_compare(module, pristine, model, params, state, trace, fresh, written))
    if lengths:
        row["sizes"] = []
        for label, inputs in other_inputs(name, module):
            module.load_state_dict(pristine.state_dict())  # the train step above moved the buffers
            module.zero_grad(set_to_none=True)
            module.eval()
            row["sizes"].append({"size": label, **_compare(module, pristine, model, params, state, trace, inputs,
                                                          written)})
    row["status_all"] = worst([row["status"]] + [r["status"] for r in row.get("sizes", [])])
    return row


# the statuses from the best to the worst: a model's overall status is the worst of its inputs'
ORDER = ("match", "match (f32 rounding)", "refused", "vacuous", "WRONG", "CRASH")


def worst(statuses: list[str]) -> str:
    return max(statuses, key=ORDER.index)


def _compare(module, pristine, model, params, state, trace, fresh: dict, written) -> dict:
    """The figures of one input the model was not converted on: ``fwd``/``grad``/``state``
    (with the float64 figures of the rule where one is past its bound), ``src`` (to_source's
    model on this input), and ``status``/``why``. A written port that computes a wrong number
    (``src`` WRONG or CRASH) makes the input WRONG or CRASH: that is a silent error too. Where
    torch itself raises on the input (a model built for one image size), the converted model
    must raise as well: a ``ConversionError`` is ``refused``, a number ``WRONG``."""
    import jax
    import torch
    from convert_check import dict_rel, to_jax

    import funcnet
    from funcnet import nn

    row: dict = {}
    jfresh = to_jax(fresh)
    try:
        with torch.no_grad():
            module.eval()(**fresh)
    except Exception as torch_error:  # noqa: BLE001 - torch's own refusal of this input
        torch_says = f"torch raises too: {type(torch_error).__name__}: {_first_line(torch_error)}"
        try:
            jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0])(params, state, jfresh)
        except Exception as e:  # noqa: BLE001
            status, why = _outcome(e)
            return {"status": status, "why": f"{why} ({torch_says})"}
        return {"status": "WRONG", "why": f"a number where torch raises ({torch_says})"}
    try:
        want, got, named, grads, new_state = _both_steps(module, model, params, state, fresh, jfresh)
        row["fwd"], row["fwd_scale"] = _out_rel(got, want), _largest(want)
        ours_grad = funcnet.state_dict(grads)
        ours_grad = {k: ours_grad[k] for k in named} if set(named) <= set(ours_grad) else None
        row["grad"] = dict_rel(ours_grad, named) if ours_grad is not None else float("inf")
        row["grad_scale"] = _largest(named)
        row["zero_grads"] = sum(not bool(g.any()) for g in named.values())
        ours_state = funcnet.state_dict(params, new_state)
        buffers = dict(module.named_buffers())
        persistent = {k: v for k, v in module.state_dict().items() if k in buffers}
        row["state"] = max([_state_rel(ours_state, persistent, k) for k in persistent] + [0.0])
    except Exception as e:  # noqa: BLE001
        status, why = _outcome(e)
        row["status"], row["why"] = status, f"after convert: {why}"
        if status == "CRASH":
            row["trace"] = traceback.format_exc()[-2000:]
        return row
    row["src"], row["src_why"] = _source_at(written, pristine, fresh, jfresh)
    if any(not row[m] <= tol for m, tol in TOLS.items()):  # rounding or a logic error? see the docstring
        try:
            row.update(_in_float64(pristine, trace, fresh, ours={"fwd": got, "grad": ours_grad, "state": ours_state},
                                   torch32={"fwd": want, "grad": named, "state": persistent}))
        except Exception as e:  # noqa: BLE001 - without the float64 figures the row stays WRONG
            row["f64_error"] = f"{type(e).__name__}: {_first_line(e)}"
    row["status"], row["why"] = classify(row)
    if "grad_f32_bn" in row and row["grad"] > GRAD_TOL:
        row["why"] += f"; torch float32 with float32 BatchNorm sums against float64: {row['grad_f32_bn']:.1e}"
    if "f64_error" in row:
        row["why"] += f"; float64 figures failed: {row['f64_error']}"
    if row["src"] in ("WRONG", "CRASH") and ORDER.index(row["status"]) < ORDER.index(row["src"]):
        row["status"] = row["src"]
        row["why"] = "; ".join(w for w in (row["why"], f"to_source's model: {row['src_why']}") if w)
    return row


def _both_steps(module, model, params, state, fresh: dict, jfresh: dict):
    """The eval forward and one train-mode gradient on both sides, from the same weights and input:
    ``(torch's output, ours, torch's named gradients, our gradients, our new state)``; ``module``
    is left in train mode with its ``.grad`` set."""
    import jax
    import jax.numpy as jnp
    import torch
    from convert_check import loss_of

    from funcnet import nn

    with torch.no_grad():
        want = module.eval()(**fresh)
    got = jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0])(params, state, jfresh)
    module.train()
    module.zero_grad()
    loss_of(module(**fresh), torch).backward()

    def f(p):
        y, s = nn.call(model, p, state, train=True, key=jax.random.key(0), **jfresh)
        return loss_of(y, jnp), s

    grads, new_state = jax.jit(jax.grad(f, has_aux=True))(params)
    named = {k: p.grad for k, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}
    return want, got, named, grads, new_state


def _torch_grads(pristine, fresh: dict) -> dict:
    """torch's train-mode gradients of a copy of ``pristine`` on ``fresh``, as float64 numpy."""
    import numpy as np
    import torch
    from convert_check import loss_of

    module = copy.deepcopy(pristine).train()
    loss_of(module(**fresh), torch).backward()
    return {k: np.asarray(p.grad.detach().double().numpy())
            for k, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}


def _in_float64(pristine, trace, fresh, ours: dict, torch32: dict) -> dict:
    """The float64 figures of the rule: the model converted in float64 against torch in float64
    (``fwd64``, ``grad64``, ``state64``), and ``<m>_exact`` = [ours, torch's float32], each
    against torch in float64 from the same weights and input, measured as the float32 figures."""
    import jax
    import numpy as np
    import torch
    from convert_check import _cast, dict_rel, to_jax

    import funcnet
    from funcnet import interop

    jax.config.update("jax_enable_x64", True)
    try:
        module = copy.deepcopy(pristine).double().eval()
        model, params, state = interop.convert(module, **_cast(trace, torch.float64))
        fresh64 = _cast(fresh, torch.float64)
        want, got, named, grads, new_state = _both_steps(module, model, params, state, fresh64, to_jax(fresh64))
        grads = funcnet.state_dict(grads)
        buffers = dict(module.named_buffers())
        persistent = {k: v for k, v in module.state_dict().items() if k in buffers}
        as_np = lambda d: {k: np.asarray(v.detach().double().numpy()) for k, v in d.items()}  # noqa: E731
        new = funcnet.state_dict(params, new_state)
        out = {
            "fwd64": _out_rel(got, want),
            "grad64": dict_rel({k: grads[k] for k in named}, named) if set(named) <= set(grads) else float("inf"),
            "state64": max([_state_rel(new, persistent, k) for k in persistent] + [0.0]),
            "fwd_exact": [_out_rel(ours["fwd"], want), _out_rel(_cast(torch32["fwd"], torch.float64), want)],
            "state_exact": [max([_state_rel(d, persistent, k) for k in persistent] + [0.0])
                            for d in (ours["state"], as_np(torch32["state"]))],
        }
        if ours["grad"] is not None:
            # torch's own float32 moves with its thread count (its reductions split by thread): the
            # bound of the rule is the farther of torch at one thread (the check's) and at two
            # (torch's default on a 2-core machine); at a kink, one value within float32's error
            # of zero lands on either side (densenet121: 3.4e-5 at one thread, 4.5e-3 at two)
            torch_threads = [dict_rel(as_np(torch32["grad"]), named), _torch_grad_rel(pristine, fresh, named, 2)]
            out["grad_torch_threads"] = torch_threads
            # a gradient is discontinuous at a kink or a tie (a max pool's two near-equal values), the
            # output is not: which side float32 lands on is rounding's toss, and torch's float32 on
            # an input one float apart (each element its next float up or down) is as valid a float32
            # answer; the bound also takes the farthest of PERTURBED such inputs (googlenet: two
            # pooled values 1.1e-6 apart that torch's float32 happens to round to one)
            perturbed = [_torch_grad_rel(pristine, _one_rounding_away(fresh, seed), named, 1)
                         for seed in range(PERTURBED)]
            out["grad_torch_perturbed"] = perturbed
            out["grad_exact"] = [dict_rel(ours["grad"], named), max(torch_threads + perturbed)]
            out["grad_f32_bn"] = dict_rel(_float32_batchnorm_grads(pristine, fresh), named)
        return out
    finally:
        jax.config.update("jax_enable_x64", False)


def _torch_grad_rel(pristine, fresh, exact: dict, threads: int) -> float:
    """torch's float32 gradients at ``threads`` threads against ``exact`` (torch in float64)."""
    import torch
    from convert_check import dict_rel

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return dict_rel(_torch_grads(pristine, fresh), exact)
    finally:
        torch.set_num_threads(before)


# torch float32 runs on inputs one rounding away that the gradient bound of the rule takes
PERTURBED = 4


def _one_rounding_away(fresh: dict, seed: int) -> dict:
    """``fresh`` with every floating element moved to its next float up or down (the direction
    drawn with ``seed``): an input float32 cannot tell from this one within its storing error."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in fresh.items():
        if torch.is_tensor(v) and v.is_floating_point():
            up = torch.randint(0, 2, v.shape, generator=g).bool()
            v = torch.nextafter(v, torch.where(up, torch.tensor(float("inf")), torch.tensor(float("-inf"))).to(v.dtype))
        out[k] = v
    return out


def _float32_batchnorm_grads(pristine, fresh) -> dict:
    """Diagnosis only, not part of the rule: torch's float32 gradients with every training-mode
    ``F.batch_norm`` computed in float32 arithmetic (autograd of its mean and variance). torch's
    CPU kernel accumulates a float32 BatchNorm's sums in float64 (``acc_type<float>`` is double
    on CPU, float on CUDA); funcnet's sums are float32, measured as close to exact as torch's per
    layer (docs/design.md). A figure near funcnet's ``grad_exact`` is not proof that the sums cause
    it: on densenet121 both land on the same side of one pre-ReLU value within float32's error of
    zero (a kink), where torch's own float32 on two threads is as far off."""
    import torch
    import torch.nn.functional as F

    kernel = F.batch_norm

    def float32_bn(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        if not training or x.dtype != torch.float32:
            return kernel(x, running_mean, running_var, weight, bias, training, momentum, eps)
        dims, shape = [0, *range(2, x.ndim)], [1, -1] + [1] * (x.ndim - 2)
        mean = x.mean(dims, keepdim=True)
        var = (x - mean).square().mean(dims, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + eps)
        return y if weight is None else y * weight.reshape(shape) + (0 if bias is None else bias.reshape(shape))

    F.batch_norm = float32_bn
    try:
        return _torch_grads(pristine, fresh)
    finally:
        F.batch_norm = kernel


def _state_rel(ours: dict, theirs: dict, key: str) -> float:
    """A buffer's difference from torch's relative to its scale. A running mean is measured against
    the spread of the data it averages (the square root of its running variance): after a
    BatchNorm whose input is another BatchNorm's output through a bias-free linear map (ShuffleNetV2's
    branches, at initialisation) the mean is zero in exact arithmetic, and both frameworks hold
    float32 rounding noise (1e-9) whose ratio to itself means nothing."""
    import numpy as np

    if key not in ours:
        return float("inf")
    a = np.asarray(ours[key], dtype=np.float64)
    b = theirs[key].detach().double().numpy()
    if a.shape != b.shape:
        return float("inf")
    if b.size == 0:
        return 0.0
    scale = float(np.max(np.abs(b)))
    var = key[: -len("running_mean")] + "running_var" if key.endswith("running_mean") else None
    if var in theirs:
        scale = max(scale, float(np.max(np.sqrt(np.abs(theirs[var].detach().double().numpy())))))
    return float(np.max(np.abs(a - b))) / (scale + 1e-30)


def _written(module, trace):
    """to_source's model, written from ``trace``, executed and loaded strictly with torch's
    weights: ``(forward, params, state)``, or ``(status, why)`` where writing or loading failed."""
    import jax

    import funcnet
    from funcnet import interop, nn

    module.eval()
    try:
        source = interop.to_source(module, **trace)
    except Exception as e:  # noqa: BLE001
        return _outcome(e)
    try:
        scope: dict = {}
        exec(compile(source, "<to_source>", "exec"), scope)  # noqa: S102 (the source just written)
        model = scope[type(module).__name__]()
        params = jax.eval_shape(model.init, jax.random.key(0))
        state = jax.eval_shape(lambda: nn.initial_state(model)) if model.has_state else None
        loaded = funcnet.load_state_dict(params, module.state_dict(), state=state) if state is not None else (
            funcnet.load_state_dict(params, module.state_dict()), None)
    except Exception as e:  # noqa: BLE001
        return "CRASH", f"{type(e).__name__}: {_first_line(e)}"
    return jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0]), *loaded


def _source_at(written, module, fresh, jfresh):
    """to_source's model (``_written``) against torch's eval forward on ``fresh``: a port that
    refuses another input signature in its one line (its shape guard, or a size_check where the
    torch code compared sizes and took another branch) is ``refused``."""
    import torch

    if len(written) == 2:
        return written
    forward, params, state = written
    try:
        got = forward(params, state, jfresh)
    except Exception as e:  # noqa: BLE001
        if isinstance(e, ValueError) and ("this port was written at input signature" in str(e)  # shape_guard
                                          or "this port was written where" in str(e)):  # size_check
            return "refused", _first_line(e)
        return "CRASH", f"{type(e).__name__}: {_first_line(e)}"
    try:
        with torch.no_grad():
            err = _out_rel(got, module.eval()(**fresh))
    except Exception as e:  # noqa: BLE001
        return "CRASH", f"{type(e).__name__}: {_first_line(e)}"
    return ("match", f"{err:.1e}") if err <= SRC_TOL else ("WRONG", f"{err:.1e}")


def _child(name: str, timeout: int, lengths: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", name] + ["--lengths"] * lengths,
                              capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"model": name, "status": "CRASH", "status_all": "CRASH", "why": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "status": "CRASH", "status_all": "CRASH",
                "why": f"process exited {proc.returncode}: {tail[:160]}"}
    row = json.loads(lines[-1])
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


def _fmt(x) -> str:
    return "" if x is None else f"{x:.1e}"


def _group(name: str) -> str:
    return "named" if name in NAMED else "held-out" if name in HELD_OUT else "lengths held-out"


def _print(r: dict) -> None:
    for label, x in [("fresh batch", r)] + [(s["size"], s) for s in r.get("sizes", [])]:
        src = x.get("src_why", "") if x.get("src") not in (None, "match") else ""
        name = r["model"] if x is r else f"  {label}"
        group = _group(r["model"]) if x is r else ""
        print(f"{name:<36}{group:<17}{x['status']:<21}{_fmt(x.get('fwd')):>9}{_fmt(x.get('grad')):>9}"
              f"{_fmt(x.get('state')):>9}  {x.get('src', ''):<8}{x.get('why', '')} {src}", flush=True)


def counts(rows: list[dict]) -> dict:
    """``{check: {status: n, "models": n}}`` over ``rows``: ``fresh batch`` (every model); with
    --lengths, ``input 1``/``input 2`` (each model's first and second other input: a text model's
    first two lengths, a vision model's two sizes), ``input 3`` (the text models' third length) and
    ``all inputs`` (each model's worst). A model refused or crashed at convert counts as such at
    each of its inputs."""
    checks: dict = {"fresh batch": [r["status"] for r in rows]}
    if any("sizes" in r for r in rows):
        for i in range(3):
            checks[f"input {i + 1}"] = [
                r["sizes"][i]["status"] if "sizes" in r else r["status"] for r in rows
                if i < len(r.get("sizes", [])) or "sizes" not in r and (i < 2 or MODELS[r["model"]][3] == 0)]
        checks["all inputs"] = [r.get("status_all", r["status"]) for r in rows]
    return {c: {**{s: sum(x == s for x in v) for s in ORDER}, "models": len(v)} for c, v in checks.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="names from MODELS (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows here as JSON")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per model")
    parser.add_argument("--jobs", type=int, default=1, help="models run at once")
    parser.add_argument("--resume", help="the --json file (or the saved run) of an interrupted run: its models' rows are kept, the "
                                         "others run")
    parser.add_argument("--lengths", action="store_true",
                        help="also check each text model at three sequence lengths and each vision model at two "
                             "image sizes (LENGTHS, SIZES in convert_zoo_models.py)")
    opts = parser.parse_args(argv)
    unknown = [n for n in opts.models or [] if n not in MODELS]
    if unknown:
        parser.error(f"--models: {unknown} are not in MODELS; pick from benchmarks/convert_zoo_models.py's lists, "
                     f"e.g. {list(MODELS)[:3]}")
    if opts.one:
        # XLA's default compile, as a user runs the model: at --xla_backend_optimization_level=0 (this script's
        # setting until 2026-12-07, for compile time) float32 rounds otherwise, and a model that amplifies
        # rounding 10^4-fold (torchvision's MNASNet: train-mode BatchNorm over 12 values per channel) lands
        # elsewhere (its gradients 3.1e-3 from float64 there, 6.4e-5 at the default; torch's 1.0e-4)
        import torch
        torch.set_num_threads(1)
        print(json.dumps(check(opts.one, lengths=opts.lengths)))
        return 0
    names = opts.models or list(MODELS)
    rows, start = [], time.perf_counter()
    if opts.resume:  # an interrupted run's rows kept: only the models it had not finished run now
        with open(opts.resume) as f:
            before = json.load(f)
        before = before.get("result", before)  # a saved run (docs/data/bench_convert_zoo_libraries.json) or a --json file
        if before.get("lengths") != opts.lengths:
            parser.error(f"--resume {opts.resume}: that run was made with lengths={before.get('lengths')}, this one "
                         f"with {opts.lengths}; resume it with the same --lengths")
        rows = [r for r in before["rows"] if r["model"] in names]
        print(f"kept from {opts.resume}: {', '.join(r['model'] for r in rows)}", flush=True)
    resumed = [r["model"] for r in rows]
    print(f"{'model':<36}{'set':<17}{'status':<21}{'fwd':>9}{'grad':>9}{'state':>9}  {'source':<8}why", flush=True)
    with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
        futures = {pool.submit(_child, n, opts.timeout, opts.lengths): n
                   for n in sorted((n for n in names if n not in resumed), key=_schedule)}
        for done in concurrent.futures.as_completed(futures):  # printed as they finish, then in list order
            r = done.result()
            rows.append(r)
            _print(r)
            if opts.json:
                _write(opts.json, rows, opts.lengths, resumed)
    rows.sort(key=lambda r: names.index(r["model"]))
    print("\nin list order:")
    for r in rows:
        _print(r)
    for group, members in GROUPS.items():
        sel = [r for r in rows if r["model"] in members]
        if sel:
            src = sum(r.get("src") == "match" for r in sel)
            print(f"{group}: {len(sel)} models; to_source matches on the fresh batch for {src}")
            for check_name, c in counts(sel).items():
                print(f"  {check_name:<12} {c['models']:>3}: " + ", ".join(f"{c[s]} {s}" for s in ORDER))
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s with --jobs {opts.jobs}")
    if opts.json:
        _write(opts.json, rows, opts.lengths, resumed)
    return 0


GROUPS = {"named": NAMED, "held-out": HELD_OUT, "lengths held-out": LENGTHS_HELD_OUT, "every model": MODELS}


def _schedule(name: str) -> tuple:
    """The order models start in: the text models first (their lengths are where a size read as a
    constant shows soonest), then the --lengths held-out models, transformers' vision models, the rest."""
    return MODELS[name][3] != 0, name not in LENGTHS_HELD_OUT, not name.startswith("hf/")


def _write(path: str, rows: list[dict], lengths: bool, resumed: list[str]) -> None:
    """The run as JSON: its rows (each with its ``set``), the counts of each group and input, and
    the models whose rows were kept from an interrupted run (``--resume``)."""
    for r in rows:
        r["set"] = _group(r["model"])
    groups = {g: counts([r for r in rows if r["model"] in members]) for g, members in GROUPS.items()
              if any(r["model"] in members for r in rows)}
    with open(path, "w") as f:
        json.dump({"lengths": lengths, "rows": rows, "counts": groups, "resumed": resumed}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
