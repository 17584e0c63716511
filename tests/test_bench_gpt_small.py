"""benchmarks/gpt_small.py and benchmarks/bf16_dots.py: the GPT-2-small benchmark's weight mapping and
FLOP count against independent oracles (transformers' logits, the jaxpr's dots), its quick end-to-end
run (slow), and every bf16 dot form of bf16_dots against float32."""

import importlib.util
import json
import os
import re
import sys
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _script(name):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab": 97, "positions": 16}


def _tiny_gpt2():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gpt_small = _script("gpt_small")
    torch.manual_seed(0)
    import transformers

    module = transformers.GPT2LMHeadModel(gpt_small.hf_config(_TINY_GPT2)).eval()
    return gpt_small, module


def test_gpt_small_loads_transformers_weights_into_funcnets_gpt():
    """The benchmark's funcnet GPT (transformers' Conv1D weights transposed into Linear's) computes
    transformers' logits, on ids other than any it was built with."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    gpt_small, module = _tiny_gpt2()
    model, params, n_params = gpt_small.funcnet_gpt(_TINY_GPT2, module)
    ids = np.random.default_rng(3).integers(0, _TINY_GPT2["vocab"], (3, 11))
    with torch.no_grad():
        want = module(input_ids=torch.from_numpy(ids)).logits.numpy()
    got = np.asarray(model.apply(params, jnp.asarray(ids, jnp.int32)))
    # float32 through 2 blocks of sums over at most 4 * 32 products: a few ulps of the largest logit
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert n_params == sum(p.numel() for p in module.parameters()) - module.transformer.wpe.weight.numel()


def test_gpt_small_flops_formula_counts_the_models_matmuls():
    """nanoGPT's 2 N + 4 L T C per token (forward) and 6 N + 12 L T C (train step) against the
    multiply-adds of every dot_general in the traced forward and gradient, counted from the jaxpr:
    N also counts the biases and LayerNorms, which do no matmul, and nothing else differs."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from funcnet import losses

    gpt_small, module = _tiny_gpt2()
    model, params, n_params = gpt_small.funcnet_gpt(_TINY_GPT2, module)
    batch, seq = 3, 12
    idx = jnp.zeros((batch, seq), jnp.int32)

    def dot_flops(jaxpr) -> int:
        total = 0
        for eqn in jaxpr.eqns:
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                total += dot_flops(sub)
            if eqn.primitive.name == "dot_general":
                (lc, _), _ = eqn.params["dimension_numbers"]
                a, out = eqn.invars[0].aval, eqn.outvars[0].aval
                total += 2 * int(np.prod(out.shape)) * int(np.prod([a.shape[d] for d in lc]))
        return total

    def loss(p):
        return losses.cross_entropy(model.apply(p, idx), idx)

    forward = dot_flops(jax.make_jaxpr(model.apply)(params, idx).jaxpr)
    train = dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    no_matmul = sum(int(np.prod(a.shape)) for path, a in jax.tree_util.tree_leaves_with_path(params)
                    if a.ndim == 1)  # biases, LayerNorm weights and biases
    tokens, L, C = batch * seq, _TINY_GPT2["n_layer"], _TINY_GPT2["n_embd"]
    assert forward == gpt_small.model_flops(n_params, L, C, seq, tokens, train=False) - 2 * tokens * no_matmul
    assert train == gpt_small.model_flops(n_params, L, C, seq, tokens, train=True) - 6 * tokens * no_matmul


@pytest.mark.slow
def test_gpt_small_quick_run_checks_losses_and_writes_mfu(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # main() appends to it: restored after
    out = tmp_path / "gpt_small.json"
    assert _script("gpt_small").main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert all(v["ok"] for k, v in result["check"].items() if isinstance(v, dict) and "ok" in v)
    impls = {(r["impl"], r["dtype"], r["mode"]) for r in result["rows"]}
    assert impls == {(i, d, m) for i in ("funcnet GPT", "converted", "torch eager") for d in ("fp32", "bf16")
                     for m in ("forward", "train")}
    assert all(0 < r["mfu"] and r["ms"] > 0 for r in result["rows"])


def test_bf16_dots_every_form_agrees_with_float32_and_counts_its_dots():
    """benchmarks/bf16_dots.py on a tiny chain: each bf16 dot form within bf16 rounding of the float32
    chain (the script exits 1 otherwise), and every row reports how many of its dots are bf16."""
    # its own process: main() sets --xla_cpu_multi_thread_eigen=false before JAX starts its backend, which run
    # in this worker made every later in-process computation single-threaded (a killed-and-resumed CLI run then
    # no longer equalled its in-process reference bitwise)
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bf16_dots.py"), "--tokens", "8", "--width", "16",
                           "--layers", "1", "--repeat", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if "|" in line and "ms" not in line]
    assert len(rows) == 5 and all(re.search(r" \d+/\d+ \|", row) for row in rows), rows
