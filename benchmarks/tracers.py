"""Which tracer can see the torch models people write: the measurement behind interop.convert's choice.

For every model of the converter's zoo (tests/convert_zoo.py) it tries:

- ``torch.fx`` symbolic tracing, with the layers funcnet has a counterpart for as leaves
  (the module hierarchy stays: a leaf is one ``call_module`` node);
- ``torch.export`` (static shapes from the example), then whether the graph still names the
  zoo's leaf layers (``unflatten`` can rebuild the modules, but their bodies are ATen ops:
  ``aten.conv2d``, ``aten.view``, not ``F.conv2d`` and the layer);
- funcnet's recorder (``interop.convert``: a TorchFunctionMode on real tensors, one graph per
  module call).

and prints one row per model: traced or the first error line.

    python benchmarks/tracers.py
"""

from __future__ import annotations

import os
import sys

import torch
from torch import fx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from convert_zoo import ZOO  # noqa: E402

from funcnet import interop  # noqa: E402
from funcnet.interop.trace.registry import _match, _registry  # noqa: E402


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return text[:90]


def try_fx(module, args, kwargs) -> str:
    registry = _registry()

    class Leaves(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            base, row = _match(m, registry)
            return (row is not None and type(m).forward is base.forward) or super().is_leaf_module(m, qualname)

    try:
        import inspect

        names = list(inspect.signature(module.forward).parameters)
        concrete = {n: None for n in names[len(args):] if n not in kwargs}  # absent optional inputs
        graph = Leaves().trace(module, concrete_args=concrete or None)
        gm = fx.GraphModule(module, graph)
        gm(*args, **kwargs)
        return "ok"
    except Exception as e:  # noqa: BLE001 (the row reports what failed)
        return _first_line(e)


def try_export(module, args, kwargs) -> str:
    try:
        program = torch.export.export(module, args, kwargs)
    except Exception as e:  # noqa: BLE001
        return _first_line(e)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    aten = sorted(t for t in targets if t.startswith("aten."))
    return f"ok, {len(aten)} distinct ATen ops (e.g. {', '.join(aten[:2])})"


def try_recorder(module, args, kwargs) -> str:
    try:
        interop.convert(module, *args, **kwargs)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return _first_line(e)


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tracing the converter's zoo")
    for col in ("model", "torch.fx (funcnet layers as leaves)", "torch.export", "funcnet recorder"):
        table.add_column(col, overflow="fold")
    counts = [0, 0, 0]
    for name, build in ZOO.items():
        row = []
        for i, attempt in enumerate((try_fx, try_export, try_recorder)):
            module, args, kwargs = build()
            module.eval()
            result = attempt(module, args, kwargs)
            counts[i] += result.startswith("ok")
            row.append(result)
        table.add_row(name, *row)
    table.add_row("traced", *(f"{c}/{len(ZOO)}" for c in counts))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
