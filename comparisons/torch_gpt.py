"""nanoGPT's modules in torch (``CausalSelfAttention``, ``MLP``, ``Block``, ``TorchGPT``), importing torch alone.

``comparisons/gpt.py`` trains them against ``funcnet.gpt.GPT``; the parallel comparisons'
torch processes (tensor_parallel, fsdp) import them from here, without JAX. ``config``: a
``funcnet.gpt.GPTConfig`` or anything with its fields (``block_size``, ``vocab_size``,
``n_layer``, ``n_head``, ``n_embd``, ``dropout``, ``bias``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn as tnn

__all__ = ["MLP", "Block", "CausalSelfAttention", "TorchGPT"]


class CausalSelfAttention(tnn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = tnn.Linear(
            config.n_embd, 3 * config.n_embd, bias=config.bias
        )  # q, k, v for all heads
        self.c_proj = tnn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = tnn.Dropout(config.dropout)
        self.resid_dropout = tnn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = (
            config.n_head,
            config.n_embd,
            config.dropout,
        )

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(
            1, 2
        )  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None,
            dropout_p=self.dropout if self.training else 0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(tnn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = tnn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = tnn.GELU()
        self.c_proj = tnn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = tnn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(tnn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = tnn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TorchGPT(tnn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = tnn.ModuleDict(
            {
                "wte": tnn.Embedding(config.vocab_size, config.n_embd),
                "wpe": tnn.Embedding(config.block_size, config.n_embd),
                "drop": tnn.Dropout(config.dropout),
                "h": tnn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                "ln_f": tnn.LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = tnn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for (
            pn,
            p,
        ) in self.named_parameters():  # scaled init of the residual projections (GPT-2)
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(
                    p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer)
                )

    def _init_weights(self, module):
        if isinstance(module, tnn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, tnn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        _, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # logits at every position, as funcnet's
