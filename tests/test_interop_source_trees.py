"""interop.to_source on module trees beyond the zoo (tests/source_trees.py): numerically named
children, ModuleDict/ModuleList subclasses with their own forward, a recursive tree of one class
with other children in every instance, modules shared at two places. Each written port passes
ruff, loads torch's state_dict strictly and matches torch on a fresh input (other values, another
batch size) in eval and in train: the forward, the loss, the gradients and 3 SGD steps."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))

from convert_check import _check, tree_rel  # noqa: E402
from source_trees import NAMES, build  # noqa: E402
from test_interop_source import _call, _load  # noqa: E402

import funcnet  # noqa: E402
from funcnet import interop  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402
from funcnet.interop.source import classes as source_classes  # noqa: E402

_WRITTEN: dict = {}


def _written(name: str):
    if name not in _WRITTEN:
        module, example, fresh = build(name)
        _WRITTEN[name] = (module, fresh, interop.to_source(module, *example))
    return _WRITTEN[name]


# float32 (unit roundoff 6e-8). The forwards are at most ~12 layers deep with reductions of at most
# 3*3*8 = 72 products (a conv) or 16*16 terms (the mean, a batch norm's statistics over 3*8*8): rounding
# grows like sqrt(n) per reduction and adds up over the layers, about 1e-6 relative; the limits leave
# 10x. Gradients pass through train-mode batch norm over 3 samples, whose 1/std amplifies the
# rounding of small differences, and their largest entry is the scale: convert's zoo limits, 5e-5.
LIMITS = {"eval": 1e-5, "train": 1e-5, "loss": 1e-5, "grads": 5e-5, "params_after": 5e-5, "keys": 0.0,
          "state_after": 0.0}


@pytest.mark.parametrize("name", NAMES)
def test_written_tree_loads_strictly_and_matches_torch_on_a_fresh_input(name):
    module, fresh, source = _written(name)
    model, params, state = _load(source, module)  # funcnet.load_state_dict: every key, torch's shapes
    assert list(funcnet.state_dict(params, state, model=model)) == list(module.state_dict())  # keys unchanged
    errors = _check(module, fresh, {}, (model, params, state), steps=3, lr=0.05)
    over = {k: v for k, v in errors.items() if v > LIMITS[k]}
    assert not over, (over, source)


def test_written_trees_pass_ruff(tmp_path):
    for name in NAMES:
        (tmp_path / f"{name}.py").write_text(_written(name)[2])
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_numbered_children_read_as_in_torch():
    source = _written("numbered")[2]
    # children named "0": keyword arguments through **{...} in torch's order, getattr in forward; a
    # ModuleDict entry "3" that is not at position 3 is indexed by its name
    assert "nn.Composite(forward, **{'0': nn.Sequential(" in source and "'1': Residuals()}" in source, source
    assert "getattr(self, '1')(getattr(self, '0')(x))" in source and "self.heads['3'](h)" in source, source
    odd = _written("odd_names")[2]  # torch's seq[0] is the entry named "1"; a keyword is no attribute name
    assert "getattr(self, 'class')(x) * getattr(self, '0')" in odd and "self.seq['1'](h)" in odd, odd
    assert "self.heads['lambda'](h)" in odd and "seq=NamedSequential(**{'1': nn.Linear(3, 3), '0': nn.Tanh()})" in odd
    getter = _written("layer_getter")[2]
    assert "x_2 = getattr(self, '2')(x)" in getter and "return {'mid': x, 'out': x_2}" in getter, getter


def test_a_recursive_tree_passes_its_subtrees_as_arguments():
    source = _written("dla")[2]
    # a tree whose children are trees takes them as arguments; its call sites nest the subtrees
    assert "def DlaTree_4(tree1, tree2):" in source and "tree1=tree1, tree2=tree2, root=None" in source, source
    assert "level3=DlaTree_11(DlaTree_7(DlaTree_5(), DlaTree_6()), DlaTree_10(DlaTree_8(), DlaTree_9()))" in source
    # nn.Identity returns its input: the input is still the caller's value (no in-place change to refuse)
    assert "bottom = self.downsample(x)" in source and "x1 = self.tree1(x, bottom)" in source, source


def test_a_child_named_like_a_composite_argument_is_refused_before_tracing():
    class Named(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.name = torch.nn.Linear(2, 2)

        def forward(self, x):
            raise AssertionError("traced: the check did not come first")

    with pytest.raises(ConversionError, match=r"<root> \(Named\): 'name' is also an argument of nn.Composite.*"
                                              r"rename the attribute"):
        interop.to_source(Named(), torch.randn(1, 2))


def test_an_internal_error_names_the_module_and_says_it_is_a_bug(monkeypatch):
    module, example, _ = build("shared")
    written = source_classes.ClassWriter._function

    def broken(self, name, *args):
        if name == "Scaled":
            raise KeyError("something funcnet did not expect")
        return written(self, name, *args)

    monkeypatch.setattr(source_classes.ClassWriter, "_function", broken)
    with pytest.raises(ConversionError, match=r"writing block \(Scaled\) failed: KeyError: .*This is a bug in "
                                              r"funcnet's to_source.*please report it") as caught:
        interop.to_source(module, *example)
    assert isinstance(caught.value.__cause__, KeyError)  # the traceback of the bug is kept



class _Passes(torch.nn.Module):
    """A child that returns its input object (nn.Identity) and one that appends to the list it is given."""

    def __init__(self):
        super().__init__()
        self.same, self.lin = torch.nn.Identity(), torch.nn.Linear(3, 3)

    def forward(self, x, found):
        y = self.same(x)
        found.append(self.lin(y))
        return y * 2


class _Caller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Passes()

    def forward(self, x):
        found = [x]
        return self.inner(x, found) + x


def test_inputs_a_child_returns_or_appends_to_stay_the_callers_values():
    torch.manual_seed(0)
    module = _Caller()
    source = interop.to_source(module, torch.randn(2, 3))  # refused before: "an in-place change" of x
    assert "return self.inner(x, [x]) + x" in source, source  # the list as it was when inner was called
    model, params, state = _load(source, module)
    x = torch.randn(4, 3)
    with torch.no_grad():
        want = module(x)
    got, _ = _call(model, params, state, jax.numpy.asarray(x.numpy()))
    assert tree_rel(got, want) < 1e-6  # one 3-term dot product and a doubling: float32 rounding, 1e-7
