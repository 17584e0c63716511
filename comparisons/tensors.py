"""Tensors: creation, attributes, operations, storage and views, in-place updates, the NumPy bridge.

torch: a Tensor is a view (shape, stride, offset) onto a mutable storage, so views
alias, in-place ops write through them, and ``.numpy()`` / ``torch.from_numpy``
share memory. Randomness comes from a global generator (``torch.manual_seed``).

JAX: an Array is an immutable value. An "update" (``x.at[i].set(v)``) returns a new
array; reusing the input's memory is asked for explicitly (``donate_argnums``); NumPy
data is copied in and seen read-only out; randomness takes an explicit key.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
import torch

from comparisons._core import Options, Result, Side, close, dtypes, equal, expect, raises, run_sections, source

__all__ = ["TITLE", "run"]

TITLE = "Tensors: creation, attributes, ops, strides and views, in-place updates, NumPy bridge"


# ---------------------------------------------------------------- PyTorch


def torch_creation(dtype):
    x_data = torch.tensor([[1, 2, 3], [4, 5, 6]])
    zeros = torch.zeros(3, 4, dtype=dtype)
    arange = torch.arange(10)
    ones = torch.ones_like(x_data)  # shape and dtype (int64) of x_data
    torch.manual_seed(0)
    randn = torch.randn(3, 4, dtype=dtype)
    rand = torch.rand_like(x_data, dtype=dtype)  # x_data's shape, dtype overridden
    torch.manual_seed(0)
    again = torch.randn(3, 4, dtype=dtype)  # same seed, same numbers
    moved_on = torch.randn(3, 4, dtype=dtype)  # the global generator has advanced
    sample = torch.randn(100_000, dtype=dtype)
    print(f"tensor(data) {x_data.dtype}, ones_like {ones.dtype}, arange(10) {arange.tolist()}")
    print(f"randn(3, 4)[0] = {[round(v, 4) for v in randn[0].tolist()]}")
    print(f"reseeded: equal {torch.equal(randn, again)}; next draw: equal {torch.equal(randn, moved_on)}")
    print(f"randn(100000): mean {sample.mean():.4f}, std {sample.std():.4f}")
    return dict(x_data=x_data, zeros=zeros, arange=arange, ones=ones, randn=randn, rand=rand,
                again=again, moved_on=moved_on, sample=sample)


def torch_attributes(dtype):
    x = torch.tensor([1.0, 2.0, 3.0], dtype=dtype)
    w = torch.tensor([0.5, -1.0, 2.0], dtype=dtype, requires_grad=True)
    print(f"x.dtype {x.dtype}, x.device {x.device}, x.shape {tuple(x.shape)}, x.requires_grad {x.requires_grad}")
    (w * x).sum().backward()  # records a graph because w requires grad
    print(f"w.grad {w.grad.tolist()}, x.grad {x.grad}")
    return dict(x=x, w=w)


def torch_ops(t):
    out = {"T": t.T, "t[1, 2]": t[1, 2], "t[:2, 1:]": t[:2, 1:], "t + 1": t + 1, "mul": t.mul(t),
           "matmul": t.matmul(t.T), "@": t @ t.T, "mean": t.mean(), "cat": torch.cat((t, t), dim=0)}
    print(", ".join(f"{k} {tuple(v.shape)}" for k, v in out.items()))
    print(f"t[1, 2] = {t[1, 2]:.6f}, t.mean() = {t.mean():.6f}")
    return out


def torch_storage():
    x = torch.arange(12)
    a = x.view(3, 4)  # no copy: new shape and strides over x's storage
    b = a.T  # swaps the strides, still no copy
    print(f"a.stride() {a.stride()}, b = a.T: b.stride() {b.stride()}, contiguous {b.is_contiguous()}")
    b[0, 0] = 99  # writes into the storage a and x share
    print(f"after b[0, 0] = 99: a[0, 0] = {a[0, 0].item()}, x[0] = {x[0].item()}")
    try:
        b.view(12)
    except RuntimeError as e:
        print(f"b.view(12): RuntimeError: {str(e)[:40]}...")
    c = b.contiguous()  # a row-major copy
    same = c.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    print(f"c = b.contiguous(): stride {c.stride()}, shares a's storage {same}")
    return dict(x=x, a=a, b=b, c=c)


def torch_inplace(t):
    t = t.clone()
    alias, ptr = t, t.data_ptr()
    t.add_(1)
    t += 1  # also in place: same object, same memory
    row = t[0]  # a view of the first row
    row.mul_(10)  # writes through into t
    print(f"after add_(1), += 1, t[0].mul_(10): same memory {t.data_ptr() == ptr}, alias is t {alias is t}")
    print(f"t[0] = {[round(v, 4) for v in t[0].tolist()]}")
    return dict(t=t, alias=alias, same_memory=t.data_ptr() == ptr)


def torch_numpy_bridge(dtype):
    tensor = torch.arange(12, dtype=dtype).reshape(3, 4)
    np_array = tensor.numpy()  # shares tensor's memory
    tensor.add_(1)
    print(f"np_array[0] after tensor.add_(1): {np_array[0]}")
    n = np.array([1, 2, 3])
    t = torch.from_numpy(n)  # shares n's memory
    np.add(n, 1, out=n)
    print(f"torch.from_numpy(n) after np.add(n, 1, out=n): {t}")
    return dict(tensor=tensor, np_array=np_array, n=n, t=t)


# ---------------------------------------------------------------- JAX


def jax_creation(dtype):
    x_data = jnp.array([[1, 2, 3], [4, 5, 6]])
    zeros = jnp.zeros((3, 4), dtype)
    arange = jnp.arange(10)
    ones = jnp.ones_like(x_data)
    key = jax.random.key(0)
    same_key = jax.random.clone(key)  # the same key, reused on purpose
    k_rand, k_next, k_sample = jax.random.split(jax.random.key(1), 3)
    randn = jax.random.normal(key, (3, 4), dtype)
    again = jax.random.normal(same_key, (3, 4), dtype)  # same key, same numbers
    next_draw = jax.random.normal(k_next, (3, 4), dtype)  # a split key, new numbers
    rand = jax.random.uniform(k_rand, x_data.shape, dtype)
    sample = jax.random.normal(k_sample, (100_000,), dtype)
    print(f"array(data) {x_data.dtype}, ones_like {ones.dtype}, arange(10) {arange.tolist()}")
    print(f"normal(key, (3, 4))[0] = {[round(v, 4) for v in randn[0].tolist()]}")
    print(f"same key: equal {bool((randn == again).all())}; split key: equal {bool((randn == next_draw).all())}")
    print(f"normal(100000): mean {sample.mean():.4f}, std {sample.std(ddof=1):.4f}")
    return dict(x_data=x_data, zeros=zeros, arange=arange, ones=ones, randn=randn, rand=rand,
                again=again, next_draw=next_draw, sample=sample)


def jax_attributes(dtype):
    x = jnp.array([1.0, 2.0, 3.0], dtype)
    w = jnp.array([0.5, -1.0, 2.0], dtype)
    print(f"x.dtype {x.dtype}, x.devices() {x.devices()}, x.shape {x.shape}  (no requires_grad)")

    def f(w, x):
        return jnp.sum(w * x)

    dw = jax.grad(f)(w, x)  # argnums=0: differentiate with respect to w only
    dw_dx = jax.grad(f, argnums=(0, 1))(w, x)
    print(f"grad(f)(w, x) {dw.tolist()}; argnums=(0, 1): {[g.tolist() for g in dw_dx]}")
    return dict(x=x, w=w, dw=dw, dw_dx=dw_dx)


def jax_ops(t):
    out = {"T": t.T, "t[1, 2]": t[1, 2], "t[:2, 1:]": t[:2, 1:], "t + 1": t + 1, "mul": jnp.multiply(t, t),
           "matmul": jnp.matmul(t, t.T), "@": t @ t.T, "mean": t.mean(), "cat": jnp.concatenate((t, t), axis=0)}
    print(", ".join(f"{k} {v.shape}" for k, v in out.items()))
    print(f"t[1, 2] = {t[1, 2]:.6f}, t.mean() = {t.mean():.6f}")
    return out


def jax_storage():
    a = jnp.arange(12).reshape(3, 4)
    host = np.asarray(a)  # the host NumPy array reports byte strides; jax.Array has no .stride()
    print(f"np.asarray(a).strides {host.strides} bytes = {tuple(s // host.itemsize for s in host.strides)} items")
    b = a.T
    b2 = b.at[0, 0].set(99)  # a new array; a and b are values and stay as they were
    print(f"b2 = b.at[0, 0].set(99): b2[0, 0] = {b2[0, 0]}, b[0, 0] = {b[0, 0]}, a[0, 0] = {a[0, 0]}")
    try:
        b[0, 0] = 99
    except TypeError as e:
        print(f"b[0, 0] = 99: TypeError: {str(e)[:40]}...")
    flat = b2.reshape(12)  # always allowed: layout is the compiler's business
    return dict(a=a, b=b, b2=b2, host=host, flat=flat)


def jax_inplace(t):
    alias = t
    t = t + 1
    t += 1  # rebinds the name to a new array; alias still holds the input
    scale_first_row = jax.jit(lambda x: x.at[0].multiply(10), donate_argnums=0)
    donated = t
    t = scale_first_row(t)  # XLA may write the result into the donated buffer
    print(f"alias is t {alias is t}; donated input deleted {donated.is_deleted()}")
    print(f"t[0] = {[round(v, 4) for v in t[0].tolist()]}")
    return dict(t=t, alias=alias, donated=donated)


def jax_numpy_bridge(dtype):
    n = np.array([1, 2, 3])
    j = jnp.asarray(n)  # copied onto the device
    np.add(n, 1, out=n)
    print(f"jnp.asarray(n) after np.add(n, 1, out=n): {j}")
    a = jnp.arange(12, dtype=dtype).reshape(3, 4) + 1
    view = np.asarray(a)
    print(f"np.asarray(a).flags.writeable {view.flags.writeable}")
    try:
        view[0, 0] = -1
    except ValueError as e:
        print(f"view[0, 0] = -1: ValueError: {e}")
    return dict(n=n, j=j, a=a, view=view)


# ---------------------------------------------------------------- checks


def run(opts: Options = Options()) -> Result:
    tdt, jdt = dtypes(opts)
    tol = opts.tol
    torch.manual_seed(1)
    shared = torch.rand(3, 4, dtype=tdt)  # both sides compute on these numbers
    j_shared = jnp.asarray(shared.numpy()).at[0, 0].add(opts.perturb)

    torch_fns = (torch_creation, torch_attributes, torch_ops, torch_storage, torch_inplace, torch_numpy_bridge)
    jax_fns = (jax_creation, jax_attributes, jax_ops, jax_storage, jax_inplace, jax_numpy_bridge)
    (tc, ta, to, ts, ti, tn), t_text, t_sec = run_sections(torch_fns, [(tdt,), (tdt,), (shared,), (), (shared,), (tdt,)])
    # float32 matmuls in full precision, as torch's CPU kernels (GPUs would otherwise use TF32)
    with jax.default_matmul_precision("highest"):
        (jc, ja, jo, js, ji, jn), j_text, j_sec = run_sections(
            jax_fns, [(jdt,), (jdt,), (j_shared,), (), (j_shared,), (jdt,)])

    int_default = "int64" if jax.config.jax_enable_x64 else "int32"
    ks = scipy.stats.ks_2samp(tc["sample"].numpy(), np.asarray(jc["sample"]))
    moments = [float(tc["sample"].mean()), float(tc["sample"].std()) - 1,
               float(jc["sample"].mean()), float(jc["sample"].std(ddof=1)) - 1]
    checks = [
        # creation: deterministic values equal; random ones by shape, dtype and distribution
        equal("creation: tensor(data) / zeros / arange / ones_like values",
              [tc[k].tolist() for k in ("x_data", "zeros", "arange", "ones")],
              [jc[k].tolist() for k in ("x_data", "zeros", "arange", "ones")]),
        equal("integer default dtype: torch int64, JAX int32 unless x64",
              (str(tc["x_data"].dtype), str(jc["x_data"].dtype)), ("torch.int64", int_default)),
        equal("randn / rand_like: shape and dtype",
              [(tuple(tc[k].shape), str(tc[k].dtype)[6:]) for k in ("randn", "rand")],
              [(jc[k].shape, str(jc[k].dtype)) for k in ("randn", "rand")]),
        expect("rand_like / uniform lie in [0, 1)",
               all(0 <= float(s["rand"].min()) and float(s["rand"].max()) < 1 for s in (tc, jc)),
               "min >= 0 and max < 1 on both sides"),
        expect("torch: reseeding repeats, the next draw differs",
               torch.equal(tc["randn"], tc["again"]) and not torch.equal(tc["randn"], tc["moved_on"]),
               "manual_seed(0) twice gives equal randn; the generator's next draw differs"),
        expect("JAX: same key repeats, a split key differs",
               bool((jc["randn"] == jc["again"]).all()) and not bool((jc["randn"] == jc["next_draw"]).any()),
               "normal(key) == normal(clone(key)); normal(split key) shares no element"),
        expect("randn(100000): same N(0, 1) distribution (two-sample KS)", ks.pvalue > 1e-3,
               f"KS statistic {ks.statistic:.4f}, p = {ks.pvalue:.3f} (> 1e-3); the two RNGs differ, so "
               f"values are not comparable, only their distribution"),
        expect("randn(100000): mean 0 and std 1 on both sides", all(abs(v) < 0.02 for v in moments),
               "mean, std - 1 (torch, JAX) = " + ", ".join(f"{v:+.4f}" for v in moments)
               + "; bound 0.02 is over 6 standard errors of a 100000-sample mean or std"),
        # attributes
        equal("attributes: dtype and shape", (str(ta["x"].dtype)[6:], tuple(ta["x"].shape)),
              (str(ja["x"].dtype), ja["x"].shape)),
        equal("device: torch defaults to the CPU, JAX to its first device",
              (ta["x"].device.type, ja["x"].devices()), ("cpu", {jax.devices()[0]})),
        expect("requires_grad vs argnums", not ta["x"].requires_grad and ta["x"].grad is None
               and not hasattr(ja["x"], "requires_grad"),
               "torch tracks tensors flagged requires_grad (x.grad is None); a JAX array has no such flag"),
        equal("d/dw sum(w * x): w.grad vs jax.grad(argnums=0)", ja["dw"], ta["w"].grad, why="= x exactly"),
        equal("jax.grad(argnums=(0, 1)) gives (x, w)", [g.tolist() for g in ja["dw_dx"]],
              [ta["x"].tolist(), ta["w"].tolist()]),
    ]
    # ops on the same numbers: elementwise results are exactly rounded in both; reductions may sum in another order
    for k in to:
        if k in ("matmul", "@", "mean"):
            checks.append(close(f"ops: {k}", jo[k], to[k], **tol, why="a reduction; summation order may differ"))
        else:
            checks.append(equal(f"ops: {k}", jo[k], to[k], why="no rounding or one correctly rounded op"))
    checks += [
        # storage, views and strides
        equal("strides: torch view(3, 4) vs NumPy's byte strides / itemsize", ts["a"].stride(),
              tuple(s // js["host"].itemsize for s in js["host"].strides)),
        expect("torch: a.T has strides (1, 4), is not contiguous, shares a's storage",
               ts["b"].stride() == (1, 4) and not ts["b"].is_contiguous()
               and ts["b"].untyped_storage().data_ptr() == ts["a"].untyped_storage().data_ptr(), "as stated"),
        equal("torch: writing b[0, 0] changed a[0, 0] and x[0]", (ts["a"][0, 0].item(), ts["x"][0].item()), (99, 99)),
        raises("torch: view() of a transposed tensor", lambda: ts["b"].view(12), RuntimeError, "view size"),
        expect("torch: contiguous() copies", ts["c"].is_contiguous() and ts["c"].untyped_storage().data_ptr()
               != ts["a"].untyped_storage().data_ptr(), "new storage, row-major strides"),
        expect("JAX: no strides exposed; .at[].set left a and b unchanged", not hasattr(js["a"], "stride")
               and int(js["a"][0, 0]) == 0 and int(js["b"][0, 0]) == 0 and int(js["b2"][0, 0]) == 99,
               "a[0, 0] == b[0, 0] == 0, b2[0, 0] == 99"),
        raises("JAX: item assignment", lambda: js["b"].__setitem__((0, 0), 99), TypeError, "immutable"),
        equal("same values: torch b.contiguous().view(12) vs JAX b2.reshape(12)", js["flat"], ts["c"].view(12)),
        # in-place updates vs functional updates and donation
        expect("torch: add_, += and a view's mul_ kept one object and one buffer",
               ti["same_memory"] and ti["alias"] is ti["t"], "data_ptr unchanged, alias is t"),
        expect("JAX: += rebinds; the old array is unchanged", ji["alias"] is not ji["t"], "alias is not t"),
        equal("JAX: alias still holds the input", ji["alias"], j_shared),
        equal("in-place result vs functional result", ji["t"], ti["t"],
              why="adds of 1 and a multiply by 10 round identically"),
        expect(f"JAX: donated input deleted ({jax.default_backend()})", ji["donated"].is_deleted(),
               "jit(..., donate_argnums=0) handed the input buffer to the output"),
        raises("JAX: reading a donated array", lambda: np.asarray(ji["donated"]), RuntimeError, "deleted"),
        # the NumPy bridge
        equal("torch: .numpy() shares memory (tensor.add_ shows in the array)", tn["np_array"], tn["tensor"]),
        equal("torch: from_numpy shares memory (np.add(out=n) shows in the tensor)", tn["t"], [2, 3, 4]),
        equal("JAX: jnp.asarray copied (a later NumPy write is not seen)", (jn["j"].tolist(), jn["n"].tolist()),
              ([1, 2, 3], [2, 3, 4])),
        expect("JAX: np.asarray(jax array) is read-only", not jn["view"].flags.writeable, "flags.writeable False"),
        raises("JAX: writing the read-only view", lambda: jn["view"].__setitem__((0, 0), -1), ValueError, "read-only"),
        equal("bridge values: torch np_array vs np.asarray(jax array)", jn["view"], tn["np_array"]),
    ]
    return Result(
        name="tensors", title=TITLE,
        torch=Side(source(*torch_fns), t_text, t_sec),
        jax=Side(source(*jax_fns), j_text, j_sec),
        checks=checks,
        notes="Both sides compute on torch.rand(3, 4) (seed 1) for ops and in-place updates; perturb is added to "
              "the JAX copy's [0, 0]. Random draws are compared by shape, dtype and distribution, since the two "
              "RNGs (torch's Mersenne Twister on CPU, JAX's threefry) give different numbers for the same seed. "
              "The JAX time is mostly XLA compiling each eager op on its first use; a second run in the same "
              "process reuses them.",
    )
