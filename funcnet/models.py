"""Real models written with funcnet.nn, each the line-for-line twin of a torch module.

- ``ConvNet``: a conv net with BatchNorm for 8x8 digits (what ``funcnet train --model cnn``
  trains), its input the flat 64 features the data sets give, unflattened to 1x8x8.
- ``BasicBlock`` / ``ResNet``: torchvision's residual block (two 3x3 convs with BatchNorm,
  a 1x1 conv + BatchNorm downsample when the shape changes) and a small ResNet of them.
- ``LSTMLM``: pytorch/examples' word-language-model ``RNNModel`` with an LSTM (embedding,
  dropout, stacked LSTM, dropout, a decoder tied to the embedding, log-softmax); its torch
  twin is in ``comparisons/recurrent.py``.

Each is an ``nn.Composite`` whose ``forward`` reads like the torch ``forward``; the params
and state (BatchNorm's running statistics) have the torch module's state_dict keys. The
torch twins live in ``examples/port_cnn.py`` and ``examples/port_resnet.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from funcnet import nn

__all__ = ["ConvNet", "BasicBlock", "ResNet", "LSTMLM", "init_hidden"]


def ConvNet(num_classes: int = 10, channels: Sequence[int] = (16, 32), image: int = 8) -> nn.Module:
    """conv3x3-BN-ReLU-maxpool twice, then a Linear: ``(N, image*image)`` -> ``(N, num_classes)``."""
    c1, c2 = channels
    if image % 4:
        raise ValueError(f"ConvNet: image size {image} must be divisible by 4 (two 2x2 max-pools)")

    def forward(self, x):
        x = self.unflatten(x)
        x = self.pool(jax.nn.relu(self.bn1(self.conv1(x))))
        x = self.pool(jax.nn.relu(self.bn2(self.conv2(x))))
        return self.fc(self.flatten(x))

    return nn.Composite(
        forward, name=f"ConvNet(num_classes={num_classes}, channels={tuple(channels)})",
        unflatten=nn.Unflatten(1, (1, image, image)),
        conv1=nn.Conv2d(1, c1, 3, padding=1, bias=False), bn1=nn.BatchNorm2d(c1),
        conv2=nn.Conv2d(c1, c2, 3, padding=1, bias=False), bn2=nn.BatchNorm2d(c2),
        pool=nn.MaxPool2d(2), flatten=nn.Flatten(), fc=nn.Linear(c2 * (image // 4) ** 2, num_classes))


def BasicBlock(inplanes: int, planes: int, stride: int = 1) -> nn.Module:
    """torchvision's ``BasicBlock``: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)

    downsample = None
    if stride != 1 or inplanes != planes:
        downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
    return nn.Composite(
        forward, name=f"BasicBlock({inplanes}, {planes}, stride={stride})",
        conv1=nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False), bn1=nn.BatchNorm2d(planes),
        relu=nn.ReLU(), conv2=nn.Conv2d(planes, planes, 3, 1, 1, bias=False), bn2=nn.BatchNorm2d(planes),
        downsample=downsample)


def ResNet(num_classes: int = 10, widths: Sequence[int] = (16, 32), blocks: int = 1, image: int = 8) -> nn.Module:
    """A small ResNet: a 3x3 stem, stages of ``BasicBlock`` (stride 2 from the second stage
    on), global average pooling and a Linear. Input ``(N, image*image)``."""

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(self.unflatten(x))))
        for layer in self.layers:
            x = layer(x)
        return self.fc(self.flatten(self.avgpool(x)))

    stages, inplanes = [], widths[0]
    for i, planes in enumerate(widths):
        stages.append(nn.Sequential(*[BasicBlock(inplanes if b == 0 else planes, planes,
                                                 stride=2 if (i > 0 and b == 0) else 1) for b in range(blocks)]))
        inplanes = planes
    return nn.Composite(
        forward, name=f"ResNet(num_classes={num_classes}, widths={tuple(widths)}, blocks={blocks})",
        unflatten=nn.Unflatten(1, (1, image, image)),
        conv1=nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), bn1=nn.BatchNorm2d(widths[0]), relu=nn.ReLU(),
        layers=nn.ModuleList(stages), avgpool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(),
        fc=nn.Linear(widths[-1], num_classes))


def LSTMLM(ntoken: int, ninp: int = 200, nhid: int = 200, nlayers: int = 2, dropout: float = 0.2,
           tie_weights: bool = True, *, batch_first: bool = False, return_hidden: bool = True,
           dtype=jnp.float32) -> nn.Module:
    """pytorch/examples' word_language_model ``RNNModel("LSTM", ...)``: ``(log_probs, hidden)``.

    ``apply(params, input, hidden=None, *, key=None, train=False)``: input ``(T, B)`` token ids
    (``(B, T)`` with ``batch_first``), hidden ``(h, c)`` each ``(nlayers, B, nhid)`` (zeros when
    None, as ``init_hidden``); returns log-probabilities ``(T, B, ntoken)`` (``(B, T, ntoken)``)
    and the new hidden state (the log-probabilities alone with ``return_hidden=False``, the form
    ``funcnet train --model lstm`` fits on independent blocks from a zero state). Children
    ``encoder`` (Embedding), ``drop`` (Dropout), ``rnn``
    (LSTM with ``dropout`` between layers) and ``decoder`` (Linear, its weight the encoder's when
    ``tie_weights``); init as the example's ``init_weights``: encoder and decoder weights
    U(-0.1, 0.1), decoder bias 0, the LSTM torch's default. Truncated BPTT carries ``hidden``
    from one batch to the next under ``jax.lax.stop_gradient`` (torch: ``hidden.detach()``).
    """
    if tie_weights and nhid != ninp:
        raise ValueError(f"LSTMLM: when using the tied flag, nhid must be equal to emsize (ninp): got nhid={nhid}, "
                         f"ninp={ninp}; pass nhid={ninp} or tie_weights=False")

    def forward(self, input, hidden=None):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        log_probs = jax.nn.log_softmax(self.decoder(output), axis=-1)
        return (log_probs, hidden) if return_hidden else log_probs

    model = nn.Composite(
        forward, name=f"RNNModel(LSTM, ntoken={ntoken}, ninp={ninp}, nhid={nhid}, nlayers={nlayers})",
        tied={"decoder.weight": "encoder.weight"} if tie_weights else None,
        drop=nn.Dropout(dropout), encoder=nn.Embedding(ntoken, ninp, dtype=dtype),
        rnn=nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0, batch_first=batch_first,
                    dtype=dtype),
        decoder=nn.Linear(nhid, ntoken, dtype=dtype))

    def init(key):
        key, k_enc, k_dec = jax.random.split(key, 3)
        params = model.init(key)
        params["encoder"]["weight"] = jax.random.uniform(k_enc, (ntoken, ninp), dtype, -0.1, 0.1)
        params["decoder"]["bias"] = jnp.zeros((ntoken,), dtype)
        if not tie_weights:
            params["decoder"]["weight"] = jax.random.uniform(k_dec, (ntoken, nhid), dtype, -0.1, 0.1)
        return params

    return model._replace(init=init)


def init_hidden(nlayers: int, bsz: int, nhid: int, dtype=jnp.float32):
    """The example's ``init_hidden(bsz)``: zeros ``(h, c)``, each ``(nlayers, bsz, nhid)``."""
    return jnp.zeros((nlayers, bsz, nhid), dtype), jnp.zeros((nlayers, bsz, nhid), dtype)
