"""Module trees that interop.to_source must write as valid source (tests/test_interop_source_trees.py):
numerically named children, ModuleDict/ModuleList subclasses with their own forward, a recursive
tree whose class holds children of its own class, a module shared at two places, and Swin-like
window attention whose head count differs between instances."""

from __future__ import annotations

import collections

import torch
import torch.nn as tnn


class LayerGetter(tnn.ModuleDict):
    """As torchvision's IntermediateLayerGetter: the children of a model under their numeric names
    (an OrderedDict), run in order, the named ones returned in a dict."""

    def __init__(self):
        layers = collections.OrderedDict()
        layers["0"] = tnn.Sequential(tnn.Conv2d(3, 4, 3, padding=1), tnn.BatchNorm2d(4), tnn.ReLU())
        layers["1"] = tnn.Sequential(tnn.Conv2d(4, 6, 3, stride=2, padding=1), tnn.ReLU())
        layers["2"] = tnn.Conv2d(6, 5, 1)
        super().__init__(layers)
        self.return_layers = {"1": "mid", "2": "out"}

    def forward(self, x):
        out = collections.OrderedDict()
        for name, module in self.items():
            x = module(x)
            if name in self.return_layers:
                out[self.return_layers[name]] = x
        return out


class Residuals(tnn.ModuleList):
    """A ModuleList subclass with a forward that iterates it."""

    def __init__(self, d: int, n: int):
        super().__init__([tnn.Linear(d, d) for _ in range(n)])

    def forward(self, x):
        for layer in self:
            x = x + torch.tanh(layer(x))
        return x


class Numbered(tnn.Module):
    """Children added under numbers (``add_module("0", ...)``), a ModuleDict whose numbers are not
    their positions, and a ModuleList subclass below them."""

    def __init__(self):
        super().__init__()
        self.add_module("0", tnn.Sequential(tnn.Linear(4, 6), tnn.Tanh()))
        self.add_module("1", Residuals(6, 3))
        self.heads = tnn.ModuleDict({"5": tnn.Linear(6, 2), "3": tnn.Linear(6, 3)})

    def forward(self, x):
        h = getattr(self, "1")(getattr(self, "0")(x))
        return self.heads["3"](h), self.heads["5"](h)


class OddNames(tnn.Module):
    """A child named by a keyword, a parameter named "0", a Sequential whose numbered entries are
    not in their positions (torch's ``seq[0]`` is the entry named "1")."""

    def __init__(self):
        super().__init__()
        self.add_module("class", tnn.Linear(3, 3))
        self.register_parameter("0", tnn.Parameter(torch.linspace(-1.0, 1.0, 3)))
        self.seq = tnn.Sequential(collections.OrderedDict([("1", tnn.Linear(3, 3)), ("0", tnn.Tanh())]))
        self.heads = tnn.ModuleDict({"7": tnn.Linear(3, 2), "lambda": tnn.Linear(3, 2)})

    def forward(self, x):
        h = getattr(self, "class")(x) * getattr(self, "0")
        h = self.seq(h) + self.seq[0](h)
        return self.heads["7"](h) + self.heads["lambda"](h)


class DlaBasic(tnn.Module):
    """timm's DlaBasic with one convolution instead of two (the test compiles fewer)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn = tnn.BatchNorm2d(cout)
        self.relu = tnn.ReLU(inplace=True)

    def forward(self, x, shortcut=None, children=None):
        if shortcut is None:
            shortcut = x
        out = self.bn(self.conv(x))
        out += shortcut
        return self.relu(out)


class DlaRoot(tnn.Module):
    def __init__(self, cin: int, cout: int, shortcut: bool):
        super().__init__()
        self.conv = tnn.Conv2d(cin, cout, 1, bias=False)
        self.bn = tnn.BatchNorm2d(cout)
        self.relu = tnn.ReLU(inplace=True)
        self.shortcut = shortcut

    def forward(self, x_children):
        x = self.bn(self.conv(torch.cat(x_children, 1)))
        if self.shortcut:
            x += x_children[0]
        return self.relu(x)


class DlaTree(tnn.Module):
    """timm's DLA tree: ``tree1``/``tree2`` are trees one level down or basic blocks at level 1,
    ``root`` a DlaRoot or None, ``downsample``/``project`` a layer or nn.Identity; the outputs
    of the levels travel down in the ``children`` list the callee appends to."""

    def __init__(self, levels, cin, cout, stride=1, level_root=False, root_dim=0, root_shortcut=False):
        super().__init__()
        if root_dim == 0:
            root_dim = 2 * cout
        if level_root:
            root_dim += cin
        self.downsample = tnn.MaxPool2d(stride, stride=stride) if stride > 1 else tnn.Identity()
        self.project = tnn.Identity()
        if levels == 1:
            self.tree1 = DlaBasic(cin, cout, stride)
            self.tree2 = DlaBasic(cout, cout, 1)
            if cin != cout:
                self.project = tnn.Sequential(tnn.Conv2d(cin, cout, 1, bias=False), tnn.BatchNorm2d(cout))
            self.root = DlaRoot(root_dim, cout, root_shortcut)
        else:
            self.tree1 = DlaTree(levels - 1, cin, cout, stride, root_dim=0, root_shortcut=root_shortcut)
            self.tree2 = DlaTree(levels - 1, cout, cout, root_dim=root_dim + cout, root_shortcut=root_shortcut)
            self.root = None
        self.level_root, self.levels = level_root, levels

    def forward(self, x, shortcut=None, children=None):
        if children is None:
            children = []
        bottom = self.downsample(x)
        shortcut = self.project(bottom)
        if self.level_root:
            children.append(bottom)
        x1 = self.tree1(x, shortcut)
        if self.levels == 1:
            x2 = self.tree2(x1)
            x = self.root([x2, x1] + children)
        else:
            children.append(x1)
            x = self.tree2(x1, None, children)
        return x


class Dla(tnn.Module):
    """Trees of depth 1, 2 and 3: the same class with other children in every instance."""

    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = tnn.Sequential(tnn.Conv2d(3, 4, 3, padding=1, bias=False), tnn.BatchNorm2d(4), tnn.ReLU())
        self.level1 = DlaTree(1, 4, 6, 2)
        self.level2 = DlaTree(2, 6, 6, 2, level_root=True, root_shortcut=True)
        self.level3 = DlaTree(3, 6, 8, 1, level_root=True)
        self.head = tnn.Linear(8, classes)

    def forward(self, x):
        x = self.level3(self.level2(self.level1(self.stem(x))))
        return self.head(x.mean((2, 3)))


class Scaled(tnn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lin = tnn.Linear(d, d)
        self.scale = tnn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.scale


class Shared(tnn.Module):
    """A Linear and a block of the user's own class each at two places of the tree (``proj`` and
    ``mlp.0``, ``block`` and ``blocks.1``), called through both."""

    def __init__(self):
        super().__init__()
        self.inp = tnn.Linear(3, 4)
        self.proj = tnn.Linear(4, 4)
        self.mlp = tnn.Sequential(self.proj, tnn.GELU())
        self.block = Scaled(4)
        self.blocks = tnn.ModuleList([Scaled(4), self.block])
        self.out = tnn.Linear(4, 2)

    def forward(self, x):
        h = self.inp(x)
        h = self.mlp(h) + self.proj(h)
        for block in self.blocks:
            h = block(h)
        return self.out(self.block(h))


class WindowAttention(tnn.Module):
    """As torchvision's Swin attention: the input cut into 2x2 windows, whose count the forward
    computes from the input's shape, and a reshape into heads by a head count that differs between
    instances and also sizes a parameter (the bias table)."""

    def __init__(self, dim: int, num_heads: int, split: bool = False):
        super().__init__()
        if split:
            self.split = (num_heads, dim // num_heads)
        else:
            self.num_heads = num_heads
        self.table = tnn.Parameter(torch.randn(4, num_heads))
        self.qkv = tnn.Linear(dim, dim * 3)
        self.proj = tnn.Linear(dim, dim)

    def forward(self, x):
        b, h, w, c = x.shape
        windows = (h // 2) * (w // 2)
        heads = self.heads()
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(2, 3).reshape(b * windows, 4, c)
        qkv = self.qkv(x).reshape(b * windows, 4, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
        a = qkv[0] @ qkv[1].transpose(-2, -1) / (c // heads) ** 0.5 + self.table.t()[None, :, None, :]
        out = (a.softmax(-1) @ qkv[2]).transpose(1, 2).reshape(b, h // 2, w // 2, 2, 2, c)
        return self.proj(out.transpose(2, 3).reshape(b, h, w, c))

    def heads(self) -> int:
        return self.num_heads


class TupleHeadsAttention(WindowAttention):
    """The head count in no int attribute of the module (a tuple holds it): its argument has no
    attribute to be named after."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__(dim, num_heads, split=True)

    def heads(self) -> int:
        return self.split[0]


class Windows(tnn.Module):
    """Window attention with other head counts, each class twice."""

    def __init__(self):
        super().__init__()
        self.a = WindowAttention(6, 2)
        self.split_a = TupleHeadsAttention(6, 3)
        self.b = WindowAttention(6, 3)
        self.split_b = TupleHeadsAttention(6, 2)

    def forward(self, x):
        return self.split_b(self.b(self.split_a(self.a(x))))


def build(name: str):
    """``(module, example inputs, fresh inputs)``: the fresh ones have other values and batch size."""
    torch.manual_seed(0)
    module, shape = {"layer_getter": (LayerGetter, (3, 8, 8)), "numbered": (Numbered, (4,)),
                     "odd_names": (OddNames, (3,)),
                     "dla": (Dla, (3, 16, 16)), "shared": (Shared, (3,)),
                     "windows": (Windows, (4, 6, 6))}[name]
    module = module()
    with torch.no_grad():  # running statistics away from their init, so eval mode normalizes with them
        for m in module.modules():
            if isinstance(m, tnn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    example = torch.randn(2, *shape)
    fresh = torch.randn(3, *shape)
    return module, (example,), (fresh,)


NAMES = ["layer_getter", "numbered", "odd_names", "dla", "shared", "windows"]
