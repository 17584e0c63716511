"""A refusal of an op with no JAX form is one line naming the source line that called the op: the
model's own file (the user's module, a library's model code, or torch's layer forward), never the
line that called ``convert`` nor torch's dispatch machinery."""

import inspect
import os

import pytest

torch = pytest.importorskip("torch")
from torch import nn as tnn  # noqa: E402

from funcnet import interop  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402
from funcnet.interop.ops.names import lookup  # noqa: E402

MISSING = "F.fold"  # an op the table has no rule for (checked below, so the test says when one is added)


def _line_of(func, text):
    lines, start = inspect.getsourcelines(func)
    return start + next(i for i, line in enumerate(lines) if text in line)


class _Folds(tnn.Module):
    def forward(self, x):
        y = x * 2
        return tnn.functional.fold(y, (4, 4), 2)


def _refusal(module, x) -> str:
    assert lookup(MISSING) is None, f"{MISSING} has a rule now: pick another op with none for this test"
    with pytest.raises(ConversionError) as info:
        interop.convert(module, x, train=False)
    message = str(info.value)
    assert "\n" not in message, message  # one problem: one line
    assert MISSING in message and "no JAX form" in message
    return message


def test_an_op_with_no_rule_names_the_modules_file_and_line_on_one_line():
    message = _refusal(_Folds(), torch.randn(1, 8, 9))
    assert f"({os.path.abspath(__file__)}:{_line_of(_Folds.forward, 'fold(y')})" in message, message


def test_inside_a_torch_layer_it_names_the_layers_forward_not_the_convert_call():
    # nn.Fold is the root: the innermost frame outside funcnet and torch's dispatch is torch's own
    # fold.py forward that calls F.fold; the test's convert line would tell the user nothing
    message = _refusal(tnn.Fold((4, 4), 2), torch.randn(1, 8, 9))
    where = f"({os.path.abspath(inspect.getsourcefile(tnn.Fold))}:{_line_of(tnn.Fold.forward, 'F.fold(')})"
    assert where in message, message
    assert os.path.abspath(__file__) not in message


class _TrainBranch(tnn.Module):
    def forward(self, x):
        if self.training and x.sum() > 0:  # a branch on data, in train mode alone
            x = -x
        return x * 2


def test_a_problem_met_in_train_mode_alone_says_that_train_false_converts_inference():
    with pytest.raises(ConversionError) as info:
        interop.convert(_TrainBranch(), torch.ones(2, 3))
    message = str(info.value)
    assert "\n" not in message, message
    assert f"({os.path.abspath(__file__)}:{_line_of(_TrainBranch.forward, 'x.sum() > 0')})" in message, message
    assert "train mode alone" in message and "train=False" in message, message
    model, params, _ = interop.convert(_TrainBranch(), torch.ones(2, 3), train=False)
    x = torch.randn(3, 3)
    assert float(abs(model.apply(params, x.numpy(), train=False) - _TrainBranch().eval()(x).numpy()).max()) == 0


def test_to_source_refuses_it_in_one_line_at_the_same_line():
    with pytest.raises(ConversionError) as info:
        interop.to_source(_Folds(), torch.randn(1, 8, 9))
    message = str(info.value)
    assert message.startswith("to_source:") and "\n" not in message, message
    assert f"({os.path.abspath(__file__)}:{_line_of(_Folds.forward, 'fold(y')})" in message, message


def test_a_library_beside_torch_is_model_code():
    # torchvision sits beside torch in site-packages and its name starts with torch's: its lines
    # (torchvision/ops/boxes.py, where nms is called) are where a refusal is told, not skipped
    from funcnet.interop.trace.frame import is_model_code
    from funcnet.interop.trace.record import skip_dirs

    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    assert is_model_code(os.path.join(site, "torchvision", "ops", "boxes.py"), skip_dirs())
    assert not is_model_code(os.path.join(site, "torch", "overrides.py"), skip_dirs())
    assert is_model_code(os.path.join(site, "torch", "nn", "modules", "linear.py"), skip_dirs())
