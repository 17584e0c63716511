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

The float32 rule (``classify``, a pure function of the figures). A figure past its float32 bound
is float32 rounding that the model amplifies, not a difference in what is computed, when both:

1. the model converted in float64 agrees with torch in float64 (``<m>64``) within
   ``4 * x * 2**-29`` (and never above 1e-8), ``x`` the float32 figure: rounding scales with the
   eps, and float64's is 2**-29 of float32's, so the same amplification leaves float64 that
   fraction of the float32 gap (the 4 is slack: the amplification is not exactly linear). A
   logic error (a misplaced eps, a wrong axis, a missed branch) does not shrink with the
   precision; a cap 1000x below the tightest float32 bound (1e-5) keeps any it could produce
   from passing;
2. funcnet's float32 result is as near the exact answer as torch's own: against torch in
   float64, ours within 4x of torch's float32 (or within the float32 bound itself). Two correct
   float32 computations that sum in different orders (XLA's fusions and tree reductions, oneDNN's
   blocked loops) are off by similar amounts, and the largest of many such errors varies between
   them by a small factor; 4 (two bits) admits that and no more: an implementation that loses
   more precision than torch's is WRONG even when float64 agrees.

Otherwise the row is ``WRONG``. The rule applies to ``fwd``, ``grad`` and ``state`` alike; the
float64 figures are measured only for a row with a figure past its bound.

The model list was fixed before the first run: ``NAMED`` are the models the converter is required
to match, ``HELD_OUT`` the others. Each model runs in its own process (``--timeout`` seconds).

    python benchmarks/convert_zoo_libraries.py [--models NAME ...] [--json out.json] [--timeout 900] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import inspect
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FWD_TOL, GRAD_TOL, STATE_TOL, SRC_TOL = 1e-5, 1e-4, 1e-4, 1e-5
TOLS = {"fwd": FWD_TOL, "grad": GRAD_TOL, "state": STATE_TOL}
EPS_RATIO = 2.0 ** -52 / 2.0 ** -23  # float64's eps over float32's: 2**-29 = 1.9e-9
FACTOR = 4  # how much further from the exact answer than torch's float32 ours may be, and float64's slack
F64_CAP = 1e-8  # the float64 bound never exceeds this: 1000x below the tightest float32 bound
VACUOUS = 1e-20  # a compared output or gradient no larger than this is zeros: the comparison cannot fail

# timm: (name, create_model kwargs, image size)
NAMED = {
    "timm/vit_tiny_patch16_224": ("timm", "vit_tiny_patch16_224", {"img_size": 32}, 32),
    "timm/deit_tiny_patch16_224": ("timm", "deit_tiny_patch16_224", {"img_size": 32}, 32),
    "timm/swin_tiny_patch4_window7_224": ("timm", "swin_tiny_patch4_window7_224", {"img_size": 112}, 112),
    "timm/efficientnet_b0": ("timm", "efficientnet_b0", {}, 64),
    "timm/mobilenetv3_small_100": ("timm", "mobilenetv3_small_100", {}, 64),
    "timm/regnetx_002": ("timm", "regnetx_002", {}, 64),
    "timm/densenet121": ("timm", "densenet121", {}, 64),
}

HELD_OUT = {
    # timm
    "timm/resnet18": ("timm", "resnet18", {}, 64),
    "timm/convnext_atto": ("timm", "convnext_atto", {}, 64),
    "timm/levit_128s": ("timm", "levit_128s", {"img_size": 64}, 64),
    "timm/dla34": ("timm", "dla34", {}, 64),
    "timm/ghostnet_100": ("timm", "ghostnet_100", {}, 64),
    "timm/mixer_s16_224": ("timm", "mixer_s16_224", {"img_size": 64}, 64),
    "timm/poolformer_s12": ("timm", "poolformer_s12", {}, 64),
    "timm/coatnet_nano_rw_224": ("timm", "coatnet_nano_rw_224", {"img_size": 64}, 64),
    "timm/maxvit_nano_rw_256": ("timm", "maxvit_nano_rw_256", {"img_size": 64}, 64),
    "timm/efficientvit_b0": ("timm", "efficientvit_b0", {}, 64),
    # torchvision
    "tv/squeezenet1_0": ("tv", "squeezenet1_0", {}, 64),
    "tv/shufflenet_v2_x0_5": ("tv", "shufflenet_v2_x0_5", {}, 64),
    "tv/mobilenet_v2": ("tv", "mobilenet_v2", {}, 64),
    "tv/mobilenet_v3_small": ("tv", "mobilenet_v3_small", {}, 64),
    "tv/efficientnet_b0": ("tv", "efficientnet_b0", {}, 64),
    "tv/regnet_y_400mf": ("tv", "regnet_y_400mf", {}, 64),
    "tv/convnext_tiny": ("tv", "convnext_tiny", {}, 64),
    "tv/swin_t": ("tv", "swin_t", {}, 64),
    "tv/vit_b_16": ("tv", "vit_b_16", {"image_size": 32}, 32),
    "tv/googlenet": ("tv", "googlenet", {"aux_logits": False, "init_weights": True}, 64),
    "tv/inception_v3": ("tv", "inception_v3", {"aux_logits": False, "init_weights": True}, 96),
    "tv/lraspp_mobilenet_v3_large": ("tvseg", "lraspp_mobilenet_v3_large", {"num_classes": 4}, 64),
    "tv/deeplabv3_mobilenet_v3_large": ("tvseg", "deeplabv3_mobilenet_v3_large", {"num_classes": 4}, 64),
    # transformers, tiny configs
    "hf/distilbert": ("hf", "distilbert", {}, 0),
    "hf/roberta": ("hf", "roberta", {}, 0),
    "hf/albert": ("hf", "albert", {}, 0),
    "hf/electra": ("hf", "electra", {}, 0),
    "hf/mistral": ("hf", "mistral", {}, 0),
    "hf/qwen2": ("hf", "qwen2", {}, 0),
    "hf/gpt_neox": ("hf", "gpt_neox", {}, 0),
    "hf/opt": ("hf", "opt", {}, 0),
    "hf/bart": ("hf", "bart", {}, 0),
    "hf/mobilebert": ("hf", "mobilebert", {}, 0),
    "hf/convnext": ("hf", "convnext", {}, 32),
    "hf/resnet": ("hf", "resnet", {}, 32),
    "hf/swin": ("hf", "swin", {}, 32),
    "hf/deit": ("hf", "deit", {}, 16),
    "hf/segformer": ("hf", "segformer", {}, 32),
}

MODELS = {**NAMED, **HELD_OUT}
VOCAB = 100
_TEXT = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 64}
_DECODER = {**_TEXT, "num_key_value_heads": 1, "use_cache": False, "bos_token_id": 0, "eos_token_id": 0,
            "pad_token_id": 0}


def _rounding(x: float, tol: float, exact, x64) -> bool:
    """Whether a float32 figure ``x`` past ``tol`` is float32 rounding the model amplifies (the rule
    of the module docstring): ``exact`` is (ours in float32, torch in float32), each against torch in
    float64; ``x64`` the float64 conversion against torch in float64."""
    if exact is None or x64 is None:
        return False
    ours, theirs = exact
    as_rounding = x64 <= min(F64_CAP, FACTOR * x * EPS_RATIO)  # (1) shrinks with eps: no logic error
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


def _hf(kind: str):
    import transformers as t

    text = {
        "distilbert": lambda: t.DistilBertModel(t.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2,
                                                                   hidden_dim=64, max_position_embeddings=64)),
        "roberta": lambda: t.RobertaModel(t.RobertaConfig(**_TEXT, pad_token_id=1)),
        "albert": lambda: t.AlbertModel(t.AlbertConfig(**_TEXT, embedding_size=16)),
        "electra": lambda: t.ElectraModel(t.ElectraConfig(**_TEXT, embedding_size=16)),
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**_DECODER, head_dim=16)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**_DECODER)),
        "gpt_neox": lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, use_cache=False, bos_token_id=0, eos_token_id=0)),
        "opt": lambda: t.OPTForCausalLM(t.OPTConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
            word_embed_proj_dim=32, max_position_embeddings=64, use_cache=False, pad_token_id=1)),
        "bart": lambda: t.BartModel(t.BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)),
        "mobilebert": lambda: t.MobileBertModel(t.MobileBertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
            max_position_embeddings=64)),
    }
    vision = {
        "convnext": lambda: t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1])),
        "resnet": lambda: t.ResNetModel(t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32],
                                                       depths=[1, 1, 1, 1])),
        "swin": lambda: t.SwinModel(t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                 num_heads=[2, 2], window_size=4)),
        "deit": lambda: t.DeiTModel(t.DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=64, image_size=16, patch_size=4)),
        "segformer": lambda: t.SegformerForSemanticSegmentation(t.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
            patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=3)),
    }
    return (text.get(kind) or vision[kind])(), kind in text


def _no_dropout(module):
    """Dropout, stochastic depth and attention dropout off: the train step is deterministic on both sides."""
    for m in module.modules():
        name = type(m).__name__.lower()
        if ("drop" in name or "stochastic" in name) and isinstance(getattr(m, "p", None), float):
            m.p = 0.0
        for attr in ("drop_prob", "drop_rate"):  # timm's DropPath, and F.dropout in a model's own forward (GhostNet)
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
        cfg = getattr(m, "config", None)
        for k, v in list(getattr(cfg, "__dict__", {}).items()):
            if ("dropout" in k or "drop_path" in k or "layerdrop" in k) and isinstance(v, float):
                setattr(cfg, k, 0.0)
        for attr in ("dropout", "attention_dropout", "dropout_prob", "attn_drop"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return module


def build(name: str):
    """(module, trace_kwargs, fresh_kwargs): the module in float32 with random weights, seeded."""
    import torch

    lib, model_name, kw, size = MODELS[name]
    torch.manual_seed(0)
    if lib == "timm":
        import timm
        module = timm.create_model(model_name, pretrained=False, **kw)
    elif lib == "tv":
        import torchvision
        module = torchvision.models.get_model(model_name, weights=None, **kw)
    elif lib == "tvseg":
        import torchvision
        module = torchvision.models.get_model(model_name, weights=None, weights_backbone=None, **kw)
    else:
        module, is_text = _hf(model_name)
    _no_dropout(module)
    gen = torch.Generator().manual_seed(1)
    if lib == "hf" and is_text:
        def text(batch, length, padded_row, g):
            ids = torch.randint(3, VOCAB, (batch, length), generator=g)
            mask = torch.ones(batch, length, dtype=torch.long)
            mask[padded_row, -2:] = 0
            return {"input_ids": ids, "attention_mask": mask}
        return module, text(2, 6, 0, torch.Generator().manual_seed(0)), text(3, 7, 2, gen)
    key = next(iter(inspect.signature(module.forward).parameters))  # x, input (LRASPP), pixel_values
    return module, {key: torch.randn(2, 3, size, size)}, {key: torch.randn(3, 3, size, size, generator=gen)}


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


def _reinit_zeros(module) -> list[str]:
    """Every all-zero multiplicative parameter drawn again, so no comparison is of zeros on both
    sides: a weight of two or more dimensions (a zero-initialised head: timm's Mixer, torchvision's
    ViT) uniformly in +-1/sqrt(fan_in) (torch's Linear and Conv default), a one-dimensional
    ``weight``/``gamma`` (a normalisation's scale zeroed at the end of a residual branch) in
    [0.5, 1.5]. Biases stay: a zero shift kills no output or gradient. Returns their names."""
    import torch

    names = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.is_floating_point() or p.numel() == 0 or p.any():
                continue
            if p.ndim >= 2:
                bound = p[0].numel() ** -0.5
                p.uniform_(-bound, bound)
            elif name.rsplit(".", 1)[-1] in ("weight", "gamma"):
                p.uniform_(0.5, 1.5)
            else:
                continue
            names.append(name)
    return names


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


def check(name: str) -> dict:
    """One model: convert, then the figures above; the row's ``status`` and ``why``."""
    import jax
    import jax.numpy as jnp
    import torch

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from convert_check import dict_rel, loss_of, to_jax

    import funcnet
    from funcnet import interop, nn

    row: dict = {"model": name}
    module, trace, fresh = build(name)
    row["reinit"] = _reinit_zeros(module)
    pristine = copy.deepcopy(module)  # to_source reads the weights before the train step changes any buffer
    module.eval()
    start = time.perf_counter()
    try:
        model, params, state = interop.convert(module, **trace)
    except Exception as e:  # noqa: BLE001 (classified: refused or crash)
        row["status"], row["why"] = _outcome(e)
        if row["status"] == "CRASH":
            row["trace"] = traceback.format_exc()[-2000:]
        return row
    row["convert_s"] = round(time.perf_counter() - start, 1)
    jfresh = to_jax(fresh)
    try:
        with torch.no_grad():
            want = module(**fresh)
        got = jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0])(params, state, jfresh)
        row["fwd"], row["fwd_scale"] = _out_rel(got, want), _largest(want)

        module.train()
        module.zero_grad()
        loss_of(module(**fresh), torch).backward()

        def f(p):
            y, s = nn.call(model, p, state, train=True, key=jax.random.key(0), **jfresh)
            return loss_of(y, jnp), s

        grads, new_state = jax.jit(jax.grad(f, has_aux=True))(params)
        named = {k: p.grad for k, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}
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
        row["status"], row["why"] = "CRASH", f"after convert: {type(e).__name__}: {_first_line(e)}"
        row["trace"] = traceback.format_exc()[-2000:]
        return row
    row["src"], row["src_why"] = _source(pristine, trace, fresh, want, jfresh)
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
    return row


def _in_float64(pristine, trace, fresh, ours: dict, torch32: dict) -> dict:
    """The float64 figures of the rule: the model converted in float64 against torch in float64
    (``fwd64``, ``grad64``, ``state64``), and ``<m>_exact`` = [ours, torch's float32], each
    against torch in float64 from the same weights and input, measured as the float32 figures."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from convert_check import _cast, dict_rel, loss_of, to_jax

    import funcnet
    from funcnet import interop, nn

    jax.config.update("jax_enable_x64", True)
    try:
        module = copy.deepcopy(pristine).double().eval()
        model, params, state = interop.convert(module, **_cast(trace, torch.float64))
        fresh64 = _cast(fresh, torch.float64)
        jfresh = to_jax(fresh64)
        with torch.no_grad():
            want = module(**fresh64)
        got = jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0])(params, state, jfresh)
        module.train()
        loss_of(module(**fresh64), torch).backward()

        def f(p):
            y, s = nn.call(model, p, state, train=True, key=jax.random.key(0), **jfresh)
            return loss_of(y, jnp), s

        grads, new_state = jax.jit(jax.grad(f, has_aux=True))(params)
        named = {k: p.grad for k, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}
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
            out["grad_exact"] = [dict_rel(ours["grad"], named), dict_rel(as_np(torch32["grad"]), named)]
            out["grad_f32_bn"] = dict_rel(_float32_batchnorm_grads(pristine, fresh), named)
        return out
    finally:
        jax.config.update("jax_enable_x64", False)


def _float32_batchnorm_grads(pristine, fresh) -> dict:
    """Diagnosis only, not part of the rule: torch's float32 gradients with every training-mode
    ``F.batch_norm`` computed in float32 arithmetic (autograd of its mean and variance). torch's
    CPU kernel accumulates a float32 BatchNorm's sums in float64 (``acc_type<float>`` is double
    on CPU, float on CUDA); funcnet's sums are float32. Where the float32 gradient's error comes
    from those sums, this figure is near funcnet's ``grad_exact``."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from convert_check import loss_of

    kernel = F.batch_norm

    def float32_bn(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        if not training or x.dtype != torch.float32:
            return kernel(x, running_mean, running_var, weight, bias, training, momentum, eps)
        dims, shape = [0, *range(2, x.ndim)], [1, -1] + [1] * (x.ndim - 2)
        mean = x.mean(dims, keepdim=True)
        var = (x - mean).square().mean(dims, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + eps)
        return y if weight is None else y * weight.reshape(shape) + (0 if bias is None else bias.reshape(shape))

    module = copy.deepcopy(pristine).train()
    F.batch_norm = float32_bn
    try:
        loss_of(module(**fresh), torch).backward()
    finally:
        F.batch_norm = kernel
    return {k: np.asarray(p.grad.double().numpy()) for k, p in module.named_parameters(remove_duplicate=False)
            if p.grad is not None}


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


def _source(module, trace, fresh, want, jfresh):
    """to_source's model: written, executed, loaded strictly, compared on the fresh input."""
    import jax
    import torch

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
        got = jax.jit(lambda p, s, x: nn.call(model, p, s, **x)[0])(*loaded, jfresh)
        with torch.no_grad():
            err = _out_rel(got, module(**fresh))
    except Exception as e:  # noqa: BLE001
        return "CRASH", f"{type(e).__name__}: {_first_line(e)}"
    return ("match", f"{err:.1e}") if err <= SRC_TOL else ("WRONG", f"{err:.1e}")


def _child(name: str, timeout: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"model": name, "status": "CRASH", "why": f"timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "status": "CRASH", "why": f"process exited {proc.returncode}: {tail[:160]}"}
    row = json.loads(lines[-1])
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


def _fmt(x) -> str:
    return "" if x is None else f"{x:.1e}"


def _print(r: dict) -> None:
    name = r["model"]
    src = r.get("src_why", "") if r.get("src") not in (None, "match") else ""
    print(f"{name:<36}{'named' if name in NAMED else 'held-out':<9}{r['status']:<21}{_fmt(r.get('fwd')):>9}"
          f"{_fmt(r.get('grad')):>9}{_fmt(r.get('state')):>9}  {r.get('src', ''):<8}{r.get('why', '')} {src}",
          flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="names from MODELS (default: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows here as JSON")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per model")
    parser.add_argument("--jobs", type=int, default=1, help="models run at once")
    opts = parser.parse_args(argv)
    if opts.one:
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
        import torch
        torch.set_num_threads(1)
        print(json.dumps(check(opts.one)))
        return 0
    names = opts.models or list(MODELS)
    rows, start = [], time.perf_counter()
    print(f"{'model':<36}{'set':<9}{'status':<21}{'fwd':>9}{'grad':>9}{'state':>9}  {'source':<8}why", flush=True)
    with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
        futures = {pool.submit(_child, n, opts.timeout): n for n in names}
        for done in concurrent.futures.as_completed(futures):  # printed as they finish, then in list order
            r = done.result()
            rows.append(r)
            _print(r)
            if opts.json:
                with open(opts.json, "w") as f:
                    json.dump(rows, f, indent=1)
    rows.sort(key=lambda r: names.index(r["model"]))
    print("\nin list order:")
    for r in rows:
        _print(r)
    for group, members in (("named", NAMED), ("held-out", HELD_OUT)):
        sel = [r for r in rows if r["model"] in members]
        if sel:
            counts = {s: sum(r["status"] == s for r in sel)
                      for s in ("match", "match (f32 rounding)", "refused", "WRONG", "vacuous", "CRASH")}
            src = sum(r.get("src") == "match" for r in sel)
            print(f"{group}: {len(sel)} models: " + ", ".join(f"{v} {k}" for k, v in counts.items())
                  + f"; to_source matches for {src}")
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s with --jobs {opts.jobs}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
