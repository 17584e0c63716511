"""interop.convert follows outputs through containers (dict, OrderedDict, dataclasses, namedtuples,
lists, tuples, nested) as it follows bare tensors, and refuses a tensor computed while tracing that it
cannot link to the call that made it. Every model is compared with torch on a fresh input: other
values and another batch size than the ones it was traced on."""

import collections
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

from funcnet import interop  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402

Pair = collections.namedtuple("Pair", "h aux")
EPS = float(np.finfo(np.float32).eps)


def _close(got, want64, terms: int) -> None:
    """float32 ``got`` against torch's float64 ``want64``: every value is a sum of at most ``terms``
    products of values no larger than the output's scale, so each differs from the exact one by a
    few ulps per term; 32 eps per term of that scale is the bound tests/torch_oracle.py uses."""
    got, want64 = np.asarray(got, np.float64), np.asarray(want64, np.float64)
    assert got.shape == want64.shape
    bound = 32 * EPS * terms * float(np.max(np.abs(want64)))
    assert float(np.max(np.abs(got - want64))) <= bound, (float(np.max(np.abs(got - want64))), bound)


def _float64(module):
    """A float64 copy of ``module``: torch's float64 oracle of the float32 weights."""
    import copy

    return copy.deepcopy(module).double()


@dataclasses.dataclass
class Out:
    h: torch.Tensor
    aux: torch.Tensor


def _pack(kind, h, aux):
    if kind == "dict":
        return {"h": h, "aux": aux}
    if kind == "ordered":
        return collections.OrderedDict(h=h, aux=aux)
    if kind == "dataclass":
        return Out(h, aux)
    if kind == "namedtuple":
        return Pair(h, aux)
    if kind == "list":
        return [h, aux]
    if kind == "tuple":
        return (h, aux)
    if kind == "nested":
        return {"outs": [(h,), {"aux": aux}]}
    if kind == "model_output":
        from transformers.utils import ModelOutput

        @dataclasses.dataclass
        class _Output(ModelOutput):
            h: torch.Tensor = None
            aux: torch.Tensor = None

        return _Output(h=h, aux=aux)
    raise AssertionError(kind)


def _unpack(kind, out):
    if kind in ("dict", "ordered"):
        return out["h"], out["aux"]
    if kind in ("dataclass", "namedtuple"):
        return out.h, out.aux
    if kind in ("list", "tuple"):
        return out[0], out[1]
    if kind == "nested":
        return out["outs"][0][0], out["outs"][1]["aux"]
    if kind == "model_output":
        return out[0], out.aux  # by position and by attribute, as transformers' callers read it
    raise AssertionError(kind)


class Encoder(tnn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.lin = kind, tnn.Linear(4, 4)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return _pack(self.kind, h, h.sum(-1))


class Model(tnn.Module):
    """The encoder's output travels in a container to the parent, which reads it and passes it on."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.encoder, self.head = kind, Encoder(kind), tnn.Linear(4, 3)

    def forward(self, x):
        h, aux = _unpack(self.kind, self.encoder(x))
        return self.head(h) * aux[..., None]


KINDS = ["dict", "ordered", "dataclass", "namedtuple", "list", "tuple", "nested", "model_output"]


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_in_containers_are_followed_on_a_fresh_input(kind):
    if kind == "model_output":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    module = Model(kind)
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    x = torch.randn(5, 4)  # other values, another batch size: a baked-in encoder output would not match
    twin = _float64(module)
    want = twin(x.double())
    got = model.apply(params, jnp.asarray(x.numpy()))
    # a 4-term dot product (the head) times a 4-term sum of tanh (aux): 8 terms behind each value
    _close(got, want.detach().numpy(), terms=8)
    # the encoder's weights reach the loss through the container: their gradient is torch's; each entry sums
    # the 5 x 3 outputs' contributions, each of those 8 terms
    want.pow(2).sum().backward()
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, jnp.asarray(x.numpy())) ** 2))(params)
    _close(grads["encoder"]["lin"]["weight"], twin.encoder.lin.weight.grad.numpy(), terms=5 * 3 * 8)


class Returns(tnn.Module):
    """The root itself returns a dataclass: the converted model returns its fields as a dict."""

    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return Out(h=h, aux=h.relu())


def test_a_dataclass_output_of_the_root_comes_back_as_a_dict_of_its_fields():
    torch.manual_seed(0)
    module = Returns()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = _float64(module)(x.double())
    got = model.apply(params, jnp.asarray(x.numpy()))
    assert set(got) == {"h", "aux"}
    _close(got["aux"], want.aux.numpy(), terms=5)  # relu of a 4-term dot product and its bias


class Stash(tnn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(4, 4)

    def forward(self, x):
        self.last = self.lin(x)  # kept on the module, not returned
        return x


class Reader(tnn.Module):
    def __init__(self, stash):
        super().__init__()
        self.stash = stash

    def forward(self, x):
        return x + self.stash.last  # a tensor computed in another call, read off an attribute


class Hidden(tnn.Module):
    def __init__(self):
        super().__init__()
        self.stash = Stash()
        self.reader = Reader(self.stash)

    def forward(self, x):
        return self.reader(self.stash(x))


def test_a_computed_tensor_the_recorder_cannot_link_is_refused_not_baked_in():
    import inspect

    with pytest.raises(ConversionError) as info:
        interop.convert(Hidden(), torch.randn(2, 4))
    message = str(info.value)
    lines, start = inspect.getsourcelines(Reader.forward)
    line = start + next(i for i, text in enumerate(lines) if "self.stash.last" in text)
    assert "reader:" in message and "computed while tracing" in message, message
    assert f"{os.path.abspath(__file__)}:{line}" in message, message


def test_a_tensor_made_before_tracing_is_still_a_constant():
    class Scaled(tnn.Module):
        def __init__(self):
            super().__init__()
            self.lin = tnn.Linear(4, 4)
            self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a plain attribute: fixed, not computed from inputs

        def forward(self, x):
            return self.lin(x) * self.scale

    torch.manual_seed(0)
    module = Scaled()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = _float64(module)(x.double()).numpy()
    _close(model.apply(params, jnp.asarray(x.numpy())), want, terms=6)  # a 4-term dot product, bias, scale
