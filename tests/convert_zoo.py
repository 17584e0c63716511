"""Torch models written the way people write them (their own forward), for interop.convert's tests.

Each builder returns ``(module, args, kwargs)``: the module (float32, seeded) and example
inputs. ``p`` is every dropout rate, so the oracle can compare train mode with ``p=0``.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import torch
import torch.nn as tnn
import torch.nn.functional as TF


class MnistNet(tnn.Module):
    """Functional calls: F.relu, F.max_pool2d, F.dropout, torch.flatten, F.log_softmax."""

    def __init__(self, p=0.25):
        super().__init__()
        self.conv1 = tnn.Conv2d(1, 4, 3, 1)
        self.conv2 = tnn.Conv2d(4, 8, 3, 1)
        self.dropout1 = tnn.Dropout(p)
        self.fc1 = tnn.Linear(8 * 2 * 2, 16)
        self.fc2 = tnn.Linear(16, 10)
        self.p = p

    def forward(self, x):
        x = TF.relu(self.conv1(x))
        x = TF.relu(self.conv2(x))
        x = TF.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = TF.relu(self.fc1(x))
        x = TF.dropout(x, self.p, self.training)
        return TF.log_softmax(self.fc2(x), dim=1)


class VAE(tnn.Module):
    """randn_like, the reparameterisation, BCE and KL in forward when a target is given."""

    def __init__(self, d=16, h=12, z=3):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = tnn.Linear(d, h), tnn.Linear(h, z), tnn.Linear(h, z)
        self.fc3, self.fc4 = tnn.Linear(z, h), tnn.Linear(h, d)
        self.d = d

    def encode(self, x):
        h1 = TF.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(TF.relu(self.fc3(z))))

    def forward(self, x, target=None):
        mu, logvar = self.encode(x.view(-1, self.d))
        recon = self.decode(self.reparameterize(mu, logvar))
        if target is None:
            return recon, mu, logvar
        bce = TF.binary_cross_entropy(recon, target.view(-1, self.d), reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kld


class Generator(tnn.Module):
    """DCGAN's generator: transposed convolutions in a Sequential named main."""

    def __init__(self, nz=4, ngf=4, nc=1):
        super().__init__()
        self.main = tnn.Sequential(
            tnn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), tnn.BatchNorm2d(ngf * 2), tnn.ReLU(True),
            tnn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), tnn.BatchNorm2d(ngf), tnn.ReLU(True),
            tnn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), tnn.Tanh())

    def forward(self, input):
        return self.main(input)


class Discriminator(tnn.Module):
    def __init__(self, ndf=4, nc=1):
        super().__init__()
        self.main = tnn.Sequential(
            tnn.Conv2d(nc, ndf, 4, 2, 1, bias=False), tnn.LeakyReLU(0.2, inplace=True),
            tnn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), tnn.BatchNorm2d(ndf * 2), tnn.LeakyReLU(0.2, inplace=True),
            tnn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), tnn.Sigmoid())

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


class WordLM(tnn.Module):
    """pytorch/examples' word language model: an LSTM with the decoder tied to the encoder."""

    def __init__(self, ntoken=20, ninp=8, nhid=8, nlayers=2, p=0.2):
        super().__init__()
        self.drop = tnn.Dropout(p)
        self.encoder = tnn.Embedding(ntoken, ninp)
        self.rnn = tnn.LSTM(ninp, nhid, nlayers, dropout=p)
        self.decoder = tnn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight
        self.ntoken = ntoken

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return TF.log_softmax(decoded, dim=1), hidden


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 8
    vocab_size: int = 24
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 8
    dropout: float = 0.0
    bias: bool = True
    flash: bool = False


class CausalSelfAttention(tnn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = tnn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = tnn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = tnn.Dropout(config.dropout)
        self.resid_dropout = tnn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout, self.flash = config.n_head, config.n_embd, config.dropout, config.flash
        if not self.flash:
            self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                 .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = TF.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                                dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = TF.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
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


class GPT(tnn.Module):
    """nanoGPT's shape: a config dataclass, a causal-mask buffer, weight tying, `if targets is None`."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(config.vocab_size, config.n_embd),
            wpe=tnn.Embedding(config.block_size, config.n_embd),
            drop=tnn.Dropout(config.dropout),
            h=tnn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=tnn.LayerNorm(config.n_embd, bias=config.bias)))
        self.lm_head = tnn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = TF.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


class ViT(tnn.Module):
    """A class token and positional embedding as Parameters, MultiheadAttention blocks."""

    def __init__(self, image=8, patch=4, dim=8, heads=2, depth=2, classes=5, p=0.1):
        super().__init__()
        self.patch_embed = tnn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls_token = tnn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = tnn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.dropout = tnn.Dropout(p)
        self.blocks = tnn.ModuleList([ViTBlock(dim, heads, p) for _ in range(depth)])
        self.norm = tnn.LayerNorm(dim)
        self.head = tnn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        x = self.dropout(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class ViTBlock(tnn.Module):
    def __init__(self, dim, heads, p):
        super().__init__()
        self.norm1, self.norm2 = tnn.LayerNorm(dim), tnn.LayerNorm(dim)
        self.attn = tnn.MultiheadAttention(dim, heads, dropout=p, batch_first=True)
        self.mlp = tnn.Sequential(tnn.Linear(dim, 2 * dim), tnn.GELU(), tnn.Dropout(p), tnn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class BasicBlock(tnn.Module):
    """A residual block with an optional downsample, `out += identity` and ReLU(inplace=True)."""

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = tnn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(planes)
        self.relu = tnn.ReLU(inplace=True)
        self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(tnn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv1 = tnn.Conv2d(3, 4, 3, 1, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(4)
        self.layer1 = tnn.Sequential(BasicBlock(4, 4), BasicBlock(4, 4))
        down = tnn.Sequential(tnn.Conv2d(4, 8, 1, 2, bias=False), tnn.BatchNorm2d(8))
        self.layer2 = tnn.Sequential(BasicBlock(4, 8, 2, down), BasicBlock(8, 8))
        self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
        self.fc = tnn.Linear(8, classes)

    def forward(self, x):
        x = TF.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SqueezeExcitation(tnn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.fc1, self.fc2 = tnn.Conv2d(channels, squeeze, 1), tnn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        scale = TF.adaptive_avg_pool2d(x, 1)
        scale = torch.sigmoid(self.fc2(TF.relu(self.fc1(scale))))
        return scale * x


class InvertedResidual(tnn.Module):
    """MobileNetV2's block: expansion, depthwise conv, ReLU6, a residual only when shapes allow."""

    def __init__(self, inp, oup, stride, expand_ratio, se=False):
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == oup
        layers = [tnn.Conv2d(inp, hidden, 1, bias=False), tnn.BatchNorm2d(hidden), tnn.ReLU6(inplace=True),
                  tnn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), tnn.BatchNorm2d(hidden),
                  tnn.ReLU6(inplace=True)]
        if se:
            layers.append(SqueezeExcitation(hidden, 4))
        layers += [tnn.Conv2d(hidden, oup, 1, bias=False), tnn.BatchNorm2d(oup)]
        self.conv = tnn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNet(tnn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.features = tnn.Sequential(InvertedResidual(3, 8, 2, 2), InvertedResidual(8, 8, 1, 2, se=True))
        self.classifier = tnn.Linear(8, classes)

    def forward(self, x):
        x = self.features(x)
        x = TF.adaptive_avg_pool2d(x, (1, 1)).reshape(x.shape[0], -1)
        return self.classifier(x)


def channel_shuffle(x, groups: int):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(tnn.Module):
    """ShuffleNetV2's unit: chunk, a branch, cat, and the channel shuffle."""

    def __init__(self, c):
        super().__init__()
        half = c // 2
        self.branch2 = tnn.Sequential(tnn.Conv2d(half, half, 1, bias=False), tnn.BatchNorm2d(half), tnn.ReLU(),
                                      tnn.Conv2d(half, half, 3, 1, 1, groups=half, bias=False),
                                      tnn.BatchNorm2d(half))

    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        out = torch.cat((x1, self.branch2(x2)), dim=1)
        return channel_shuffle(out, 2)


class UNet(tnn.Module):
    """Down, up with interpolate, and skip connections by cat."""

    def __init__(self, c=4):
        super().__init__()
        self.inc = tnn.Sequential(tnn.Conv2d(1, c, 3, padding=1), tnn.ReLU())
        self.down = tnn.Sequential(tnn.MaxPool2d(2), tnn.Conv2d(c, 2 * c, 3, padding=1), tnn.ReLU())
        self.up_conv = tnn.Conv2d(3 * c, c, 3, padding=1)
        self.outc = tnn.Conv2d(c, 2, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down(x1)
        up = TF.interpolate(x2, scale_factor=2, mode="bilinear", align_corners=False)
        x = TF.relu(self.up_conv(torch.cat([x1, up], dim=1)))
        return self.outc(x)


class EinsumAttention(tnn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_qkv = tnn.Linear(dim, dim * 3, bias=False)
        self.to_out = tnn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        attn = dots.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.to_out(out.permute(0, 2, 1, 3).reshape(b, n, -1))


class SDPAttention(tnn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = tnn.Linear(dim, 3 * dim)
        self.proj = tnn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class RunningCenter(tnn.Module):
    """A forward that updates its own buffers: a call count and a running mean of its input."""

    def __init__(self, dim=4):
        super().__init__()
        self.lin = tnn.Linear(dim, dim)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(0.9).add_(0.1 * x.mean(0))
            self.calls += 1
        return self.lin(x - self.running_mean)


class Net3d(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv3d(1, 4, 3, padding=1)
        self.bn = tnn.BatchNorm3d(4)
        self.fc = tnn.Linear(4, 3)

    def forward(self, x):
        x = TF.relu(self.bn(self.conv(x)))
        return self.fc(TF.adaptive_avg_pool3d(x, 1).flatten(1))


class RMSNorm(tnn.Module):
    """A norm of the user's own (LLaMA's): rsqrt of the mean square."""

    def __init__(self, d):
        super().__init__()
        self.weight, self.eps = tnn.Parameter(torch.ones(d)), 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Llamaish(tnn.Module):
    """Rotary embeddings from a non-persistent buffer, strided slices, stack + flatten, outer, SiLU."""

    def __init__(self, vocab=20, d=16, heads=2):
        super().__init__()
        self.emb, self.norm = tnn.Embedding(vocab, d), RMSNorm(d)
        self.wq, self.wo = tnn.Linear(d, d, bias=False), tnn.Linear(d, d, bias=False)
        self.heads = heads
        inv = 1.0 / (10000 ** (torch.arange(0, d // heads, 2).float() / (d // heads)))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.head = tnn.Linear(d, vocab)

    def forward(self, tokens):
        B, T = tokens.shape
        x = self.emb(tokens)
        q = self.wq(self.norm(x)).view(B, T, self.heads, -1)
        freqs = torch.outer(torch.arange(T, device=tokens.device).float(), self.inv_freq)
        cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
        q1, q2 = q[..., ::2], q[..., 1::2]
        q = torch.stack([q1 * cos - q2 * sin, q1 * sin + q2 * cos], dim=-1).flatten(-2).transpose(1, 2)
        att = TF.scaled_dot_product_attention(q, q, q, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(B, T, -1))
        return self.head(TF.silu(x)).mean(dim=1)


class WithEncoder(tnn.Module):
    """torch's TransformerEncoder as a child with a keyword argument, a string-configured pooling."""

    def __init__(self):
        super().__init__()
        layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc, self.cls, self.pool = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False), \
            tnn.Linear(8, 3), "mean"

    def forward(self, x, mask=None):
        y = self.enc(x, src_key_padding_mask=mask)
        y = y.mean(dim=1) if self.pool == "mean" else y[:, 0]
        return self.cls(y)


class Unet1d(tnn.Module):
    """GroupNorm, a 1-d transposed conv, F.pad by a size difference, torch.where with a scalar."""

    def __init__(self):
        super().__init__()
        self.down = tnn.Conv1d(2, 4, 3, stride=2, padding=1)
        self.up = tnn.ConvTranspose1d(4, 2, 4, stride=2, padding=1)
        self.gn = tnn.GroupNorm(2, 4)

    def forward(self, x):
        y = self.up(TF.gelu(self.gn(self.down(x))))
        y = TF.pad(y, (0, x.shape[-1] - y.shape[-1]))
        return torch.where(y > 0, y, 0.1 * y) + x


class FeatureGetter(tnn.ModuleDict):
    """torchvision's IntermediateLayerGetter: a ModuleDict subclass that returns its chosen stages in an OrderedDict."""

    def __init__(self):
        super().__init__({"stem": tnn.Sequential(tnn.Conv2d(3, 4, 3, padding=1), tnn.BatchNorm2d(4), tnn.ReLU()),
                          "down": tnn.Sequential(tnn.Conv2d(4, 8, 3, stride=2, padding=1), tnn.ReLU())})

    def forward(self, x):
        out = collections.OrderedDict()
        for name, stage in self.items():
            x = stage(x)
            out["low" if name == "stem" else "high"] = x
        return out


class SegHead(tnn.Module):
    """LRASPP's head: the backbone's features read by key, the coarse one upsampled onto the fine one."""

    def __init__(self, classes=3):
        super().__init__()
        self.backbone = FeatureGetter()
        self.low, self.high = tnn.Conv2d(4, classes, 1), tnn.Conv2d(8, classes, 1)

    def forward(self, x):
        features = self.backbone(x)
        high = TF.interpolate(self.high(features["high"]), size=features["low"].shape[-2:], mode="bilinear",
                              align_corners=False)
        return self.low(features["low"]) + high


def _seeded(build):
    def make(p=0.0):
        torch.manual_seed(0)
        return build(p)
    make.__name__ = build.__name__
    return make


def _tokens(*shape, high=24):
    return torch.randint(0, high, shape)


ZOO = {
    "mnist_net": _seeded(lambda p: (MnistNet(p), (torch.randn(3, 1, 8, 8),), {})),
    "vae": _seeded(lambda p: (VAE(), (torch.rand(4, 16),), {"target": torch.rand(4, 16)})),
    "dcgan_generator": _seeded(lambda p: (Generator(), (torch.randn(2, 4, 1, 1),), {})),
    "dcgan_discriminator": _seeded(lambda p: (Discriminator(), (torch.randn(2, 1, 16, 16),), {})),
    "word_lm": _seeded(lambda p: (WordLM(p=p), (_tokens(5, 2, high=20), (torch.zeros(2, 2, 8), torch.zeros(2, 2, 8))),
                                  {})),
    "gpt": _seeded(lambda p: (GPT(GPTConfig(dropout=p)), (_tokens(2, 6),), {"targets": _tokens(2, 6)})),
    "gpt_flash": _seeded(lambda p: (GPT(GPTConfig(dropout=p, flash=True, bias=False)), (_tokens(2, 6),), {})),
    "vit": _seeded(lambda p: (ViT(p=p), (torch.randn(2, 3, 8, 8),), {})),
    "resnet": _seeded(lambda p: (ResNet(), (torch.randn(2, 3, 8, 8),), {})),
    "mobilenet_se": _seeded(lambda p: (MobileNet(), (torch.randn(2, 3, 8, 8),), {})),
    "shuffle_unit": _seeded(lambda p: (ShuffleUnit(8), (torch.randn(2, 8, 4, 4),), {})),
    "unet": _seeded(lambda p: (UNet(), (torch.randn(2, 1, 8, 8),), {})),
    "einsum_attention": _seeded(lambda p: (EinsumAttention(), (torch.randn(2, 5, 8),), {})),
    "sdpa_attention": _seeded(lambda p: (SDPAttention(), (torch.randn(2, 5, 8),), {})),
    "running_center": _seeded(lambda p: (RunningCenter(), (torch.randn(6, 4),), {})),
    "net3d": _seeded(lambda p: (Net3d(), (torch.randn(2, 1, 4, 4, 4),), {})),
    "llama_rope": _seeded(lambda p: (Llamaish(), (_tokens(2, 5, high=20),), {})),
    "encoder_classifier": _seeded(lambda p: (WithEncoder(), (torch.randn(2, 4, 8),), {})),
    "unet1d": _seeded(lambda p: (Unet1d(), (torch.randn(2, 2, 9),), {})),
    "seg_feature_dict": _seeded(lambda p: (SegHead(), (torch.randn(2, 3, 8, 8),), {})),
}
"""name -> builder(p=0.0) -> (module, args, kwargs)"""

# the axis of every input that is the batch, where it is not the first
_BATCH_AXIS = {"word_lm": 1}


def fresh_inputs(name: str, args, kwargs, seed: int = 1):
    """Inputs the model was not traced on: new values (same range: tokens below the largest seen,
    values in [0, 1] where the example's were) and one more in the batch, so a value or a size
    baked in at tracing shows as a difference from torch."""
    gen = torch.Generator().manual_seed(seed)
    axis = _BATCH_AXIS.get(name, 0)

    def fresh(t):
        if isinstance(t, (tuple, list)):
            return type(t)(fresh(v) for v in t)
        if isinstance(t, dict):
            return {k: fresh(v) for k, v in t.items()}
        if not isinstance(t, torch.Tensor):
            return t
        shape = list(t.shape)
        shape[axis] += 1
        if not t.is_floating_point():
            return torch.randint(0, int(t.max()) + 1, shape, generator=gen, dtype=t.dtype)
        if t.min() >= 0 and t.max() <= 1:
            return torch.rand(shape, generator=gen, dtype=t.dtype)
        return torch.randn(shape, generator=gen, dtype=t.dtype)

    return fresh(args), fresh(kwargs)
