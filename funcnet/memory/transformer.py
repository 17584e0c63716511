"""A GPT's parameters and the activations its backward keeps (Korthikanti et al. 2022)."""

from __future__ import annotations

from typing import Any

import numpy as np

RECOMPUTE = ("none", "selective", "full")


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def transformer_params(layers: int, hidden: int, vocab: int, seq: int, *, mlp_ratio: int = 4, bias: bool = True,
                       tied: bool = True) -> int:
    """Parameters of a GPT (nanoGPT's ``GPT``, ``funcnet.gpt.GPT``), counted by shape.

    Per layer: the qkv projection ``h x 3h``, the attention output ``h x h``, the MLP's
    ``h x rh`` and ``rh x h`` (r = ``mlp_ratio``), two LayerNorm weights; with ``bias``
    also their biases and the LayerNorm biases: ``(4 + 2r) h^2 + (9 + r) h`` (12h^2 + 13h
    at r = 4). Plus token (``vocab x h``) and position (``seq x h``) embeddings, the final
    LayerNorm, and the LM head ``vocab x h`` unless ``tied`` to the token embedding.
    LLaMA-7B's shape (32 layers, h 4096, vocab 32000) is 6.6e9 by this count (LLaMA's
    SwiGLU MLP with r = 8/3 and untied head make it 6.7e9).
    """
    L, h = _positive("layers", layers), _positive("hidden", hidden)
    V, s, r = _positive("vocab", vocab), _positive("seq", seq), _positive("mlp_ratio", mlp_ratio)
    per_layer = (4 + 2 * r) * h * h + ((3 + 1 + r + 1) * h + 4 * h if bias else 2 * h)
    final_ln = 2 * h if bias else h
    return L * per_layer + V * h + s * h + final_ln + (0 if tied else V * h)


def transformer_activations(layers: int, hidden: int, heads: int, seq: int, batch: int, *, vocab: int = 0,
                            bytes_per_value: int = 2, recompute: str = "none", flash: bool = False,
                            dropout: bool = True, logits_bytes: int = 4) -> int:
    """Bytes of activations a GPT's backward pass keeps, per Korthikanti et al. 2022
    ("Reducing Activation Recomputation in Large Transformer Models", section 4).

    Per layer, with s = ``seq``, b = ``batch``, h = ``hidden``, a = ``heads`` and p =
    ``bytes_per_value`` (2 in the paper: 16-bit activations, 1-byte dropout masks):

    - attention: LayerNorm output (the qkv input) ``psbh``, Q and K ``2psbh``, softmax
      output ``p a s^2 b``, its dropout mask ``a s^2 b`` and output ``p a s^2 b``, V
      ``psbh``, the output projection's input ``psbh``, its dropout mask ``sbh``;
    - MLP: its input ``psbh``, the GELU input ``4psbh`` and output ``4psbh``, dropout mask ``sbh``;
    - the two LayerNorm inputs ``2psbh``.

    That is ``sbh (16p + 2) + a s^2 b (2p + 1)``, the paper's ``sbh (34 + 5as/h)`` at p = 2.
    ``dropout=False`` (nanoGPT's dropout 0, funcnet.gpt's default) drops the masks and the
    dropout outputs: ``16 p sbh + p a s^2 b``.

    ``recompute``: ``"none"``; ``"selective"`` recomputes the attention core (softmax,
    its dropout, the attention over V), dropping the ``a s^2 b`` terms; ``"full"`` keeps
    only each layer's input, ``p sbh`` (the paper's 2sbh), and recomputes the rest during
    the backward (one layer at a time; that working memory is not counted, as in the paper).
    ``flash``: an attention kernel that keeps no ``s x s`` matrix (FlashAttention, torch's
    ``scaled_dot_product_attention`` fused kernels) drops the ``a s^2 b`` terms too.

    Outside the layers (``vocab`` > 0 adds them, section 4.3 of the paper): the embedding
    dropout mask ``sbh`` (with ``dropout``), the final LayerNorm's input and the LM head's
    input ``2psbh``, and the logits that the cross entropy keeps, in ``logits_bytes``
    (float32 in the paper: ``4sbv``).
    """
    L, h, a = _positive("layers", layers), _positive("hidden", hidden), _positive("heads", heads)
    s, b, p = _positive("seq", seq), _positive("batch", batch), _positive("bytes_per_value", bytes_per_value)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if not isinstance(vocab, (int, np.integer)) or isinstance(vocab, bool) or vocab < 0:
        raise ValueError(f"vocab must be an int >= 0 (0 leaves out the embeddings and logits), got {vocab!r}")
    sbh, as2b = s * b * h, a * s * s * b
    mask = 1 if dropout else 0
    if recompute == "full":
        per_layer = p * sbh
    else:
        per_layer = sbh * (16 * p + 2 * mask)
        if recompute == "none" and not flash:
            per_layer += as2b * (p + mask * (p + 1))
    outside = 0
    if vocab:
        outside = mask * sbh + 2 * p * sbh + _positive("logits_bytes", logits_bytes) * s * b * int(vocab)
    return L * per_layer + outside
