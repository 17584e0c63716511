"""``funcnet port FILE.py:Class``: a torch model written out as funcnet.nn source.

Imports the user's file, builds ``Class(*args, **kwargs)``, records its forward on example
inputs of the given shapes and writes ``interop.to_source``'s module to ``--out``; with
``--weights`` also the model's state_dict as a safetensors file that torch loads strictly
(``model.load_state_dict(safetensors.torch.load_file(path))``). Every flag is checked before
the user's file is imported: ``--out`` and ``--weights`` may not name FILE.py (by any path,
symlink or hard link) nor each other, and ``--input-shape`` is bounded (``INPUT_VALUES_MAX``)
before anything is allocated; both files are written atomically, so a failed run leaves the
files already there as they were. A file that ends the process while it is imported
(``sys.exit``, a script's argparse) is reported as such. Exit status: 0 done, 2 bad input or a
model that cannot be converted (one message naming every problem).

``funcnet port --hf DIR``: a Hugging Face checkpoint folder as ``save_pretrained`` writes it
(config.json and model.safetensors) instead of FILE.py:Class; the model is built with
transformers (``architectures[0]``, local files only, ``use_cache=False``, eval mode) and
recorded on an example input read off the config, as ``interop.from_pretrained`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from funcnet.cli.errors import EXIT_ERROR, UsageError
from funcnet.cli.outputs import refuse_overwriting_inputs, write_atomic
from funcnet.cli.parser import SEED_MAX, join_negative_values

__all__ = ["main", "build_parser"]


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``funcnet port`` parser: every flag with its help and default."""
    p = _OneLineParser(prog="funcnet port", description="Write a torch model as funcnet.nn source.")
    p.add_argument("target", metavar="FILE.py:Class", nargs="?", default=None,
                   help="the Python file and the torch.nn.Module class in it (or --hf DIR; default: none)")
    p.add_argument("--hf", default=None, metavar="DIR",
                   help="instead of FILE.py:Class: a Hugging Face checkpoint folder as save_pretrained writes it "
                        "(config.json and model.safetensors; read locally, no network; default: none)")
    p.add_argument("--args", default="[]",
                   help='JSON list of the constructor\'s positional arguments, e.g. "[10, 3]" (default %(default)s)')
    p.add_argument("--kwargs", default="{}",
                   help='JSON object of its keyword arguments, e.g. \'{"depth": 2}\' (default %(default)s)')
    p.add_argument("--input-shape", action="append", default=None, metavar="N,C,H,W",
                   help="shape of one example input of forward, e.g. 1,3,32,32; repeat for each input "
                        "(required, no default: forward is recorded on these inputs)")
    p.add_argument("--input-dtype", action="append", choices=["float", "long"], default=None,
                   help="float (random normal) or long (integer tokens in [0, 2)); once for every input, "
                        "or once per --input-shape (default: float)")
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed of the example inputs and of torch's initial weights (default %(default)s)")
    p.add_argument("--out", required=True, help="the .py file to write (required)")
    p.add_argument("--weights", default=None,
                   help="also write the state_dict to this .safetensors file (default: none, no weights file)")
    return p


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {SEED_MAX}], got "
                                         f"{text!r}")
    return value


def _target(text: str) -> tuple[str, str]:
    path, sep, name = text.rpartition(":")
    if not sep or not path or not name:
        raise UsageError(f"{text!r}: expected FILE.py:Class, e.g. models.py:ResNet (the file, a colon, the class)")
    if not name.isidentifier():
        raise UsageError(f"{text!r}: {name!r} is not a class name; expected FILE.py:Class, e.g. models.py:ResNet")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file; pass the path of the Python file that defines {name} "
                         f"(relative to {os.getcwd()} or absolute)")
    if not path.endswith(".py"):
        raise UsageError(f"{path}: expected a Python source file ending in .py")
    return path, name


def _json(flag: str, text: str, kind: type):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        example = "[10, 3]" if kind is list else '{"depth": 2}'
        raise UsageError(f"{flag} {text!r} is not valid JSON ({e.msg} at character {e.pos}); expected a JSON "
                         f"{kind.__name__}, e.g. {flag} '{example}' (JSON strings need double quotes)") from None
    if not isinstance(value, kind):
        raise UsageError(f"{flag} {text!r}: expected a JSON {'list' if kind is list else 'object'}, got "
                         f"{type(value).__name__}")
    return value


# The most values one example input may hold (1 GiB as float32): forward is recorded once, on any
# batch, so a batch of 1 is enough; past this the allocation alone could exhaust the machine.
INPUT_VALUES_MAX = 2**28


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or any(s <= 0 for s in shape):
        raise UsageError(f"--input-shape {text!r}: expected positive integers separated by commas, e.g. 1,3,32,32")
    values = math.prod(shape)
    if values > INPUT_VALUES_MAX:
        one = (1, *shape[1:])
        hint = f" (e.g. a batch of 1: {','.join(map(str, one))})" if 1 < len(shape) and math.prod(one) <= \
            INPUT_VALUES_MAX else ""
        raise UsageError(f"--input-shape {text}: {values:.3g} values ({values * 4 / 1e9:,.0f} GB as float32), "
                         f"more than the {INPUT_VALUES_MAX:,} one example input may hold; forward is recorded once "
                         f"on any batch, so pass a smaller shape{hint}")
    return shape


def _writable(flag: str, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a folder; pass a file path such as {os.path.join(path, 'model.py')}")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist; create it or pass a path in an "
                         f"existing folder")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: the folder {folder} cannot be written by this user")


def _check(args) -> dict:
    if args.hf is not None:
        return _check_hf(args)
    if args.target is None:
        raise UsageError("no model: pass FILE.py:Class (the file and the torch.nn.Module class in it) or --hf DIR "
                         "(a folder written by transformers' save_pretrained)")
    path, name = _target(args.target)
    ctor_args = _json("--args", args.args, list)
    ctor_kwargs = _json("--kwargs", args.kwargs, dict)
    if not args.input_shape:
        raise UsageError("no --input-shape: forward is recorded on example inputs; pass the shape of each, e.g. "
                         "--input-shape 1,3,32,32")
    shapes = [_shape(s) for s in args.input_shape]
    dtypes = args.input_dtype or ["float"]
    if len(dtypes) == 1:
        dtypes = dtypes * len(shapes)
    if len(dtypes) != len(shapes):
        raise UsageError(f"{len(dtypes)} --input-dtype for {len(shapes)} --input-shape; give one for all inputs or "
                         f"one per --input-shape")
    _writable("--out", args.out)
    if args.weights is not None:
        _writable("--weights", args.weights)
    refuse_overwriting_inputs([("--out", args.out, False), ("--weights", args.weights, False)],
                              [("the model file", path)])
    return {"path": path, "name": name, "args": ctor_args, "kwargs": ctor_kwargs, "shapes": shapes, "dtypes": dtypes}


def _check_hf(args) -> dict:
    """``--hf DIR``: the checkpoint folder and the outputs, checked before transformers is imported."""
    if args.target is not None:
        raise UsageError(f"both {args.target} and --hf {args.hf}: pass one model, FILE.py:Class or --hf DIR")
    extra = [flag for flag, value in (("--args", args.args != "[]"), ("--kwargs", args.kwargs != "{}"),
                                      ("--input-shape", args.input_shape), ("--input-dtype", args.input_dtype))
             if value]
    if extra:
        raise UsageError(f"--hf {args.hf} with {', '.join(extra)}: a checkpoint's config.json builds the model and "
                         f"its example input is read off the config; leave {', '.join(extra)} out")
    config = os.path.join(args.hf, "config.json")
    if not os.path.isfile(config):
        raise UsageError(f"--hf {args.hf}: no {config}; expected a folder written by model.save_pretrained(folder) "
                         f"(config.json and model.safetensors)")
    _writable("--out", args.out)
    if args.weights is not None:
        _writable("--weights", args.weights)
    inputs = [("the checkpoint's " + n, os.path.join(args.hf, n)) for n in sorted(os.listdir(args.hf))]
    refuse_overwriting_inputs([("--out", args.out, False), ("--weights", args.weights, False)], inputs)
    return {"hf": args.hf}


def _build_hf(folder: str):
    """The torch model of a checkpoint folder and its example input (``interop.hf``'s)."""
    import transformers

    from funcnet.interop.hf import _example, _torch_model

    # the command's own one line: not transformers' load report (a table on stderr) nor its progress bars
    verbosity, bars = transformers.logging.get_verbosity(), not transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        torch_model, config = _torch_model(folder)
    except (OSError, ValueError) as e:  # transformers' own reading errors: a file missing or malformed
        raise UsageError(f"--hf {folder}: transformers could not load it: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if not bars:
            transformers.logging.enable_progress_bar()
    return torch_model, _example(torch_model, config)


def _load_class(path: str, name: str):
    import importlib.util

    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the file's own imports of its neighbours
    module_name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(module_name, module)
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:  # a script's sys.exit or argparse at top level: not the command's own exit
        raise UsageError(f"{path} called sys.exit({e.code!r}) while being imported; funcnet port imports the file "
                         f"to build {name}: put the script part under `if __name__ == \"__main__\":`") from None
    except Exception as e:
        raise UsageError(f"importing {path} failed: {type(e).__name__}: {e}; fix the file so that "
                         f"`python {path}` runs") from None
    import torch

    cls = getattr(module, name, None)
    if cls is None:
        found = [k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, torch.nn.Module)
                 and v.__module__ == module.__name__]
        raise UsageError(f"{path} has no class {name!r}; the torch.nn.Module classes it defines are "
                         f"{', '.join(found) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise UsageError(f"{path}:{name} is {type(cls).__name__}, not a torch.nn.Module subclass")
    return cls


def run(argv: Sequence[str]) -> str:
    """Write the port; returns the summary line. Raises UsageError/ConversionError/OSError."""
    args = build_parser().parse_args(join_negative_values(list(argv)))
    plan = _check(args)
    from funcnet import interop

    if "hf" in plan:
        module, example = _build_hf(plan["hf"])
        source = interop.to_source(module, **example)
        return _write(args, module, source)
    cls = _load_class(plan["path"], plan["name"])
    import inspect

    import torch

    torch.manual_seed(args.seed)
    try:
        module = cls(*plan["args"], **plan["kwargs"])
    except SystemExit as e:
        raise UsageError(f"{plan['name']}(*{plan['args']}, **{plan['kwargs']}) called sys.exit({e.code!r}); a model's "
                         f"constructor must return the module, not end the process") from None
    except Exception as e:
        try:
            sig = str(inspect.signature(cls.__init__)).replace("(self, ", "(").replace("(self)", "()")
        except (TypeError, ValueError):
            sig = "(...)"
        raise UsageError(f"{plan['name']}(*{plan['args']}, **{plan['kwargs']}) failed: {type(e).__name__}: {e}; "
                         f"pass --args/--kwargs for {plan['name']}{sig}") from None
    shapes = " ".join(f"--input-shape {','.join(map(str, s))}" for s in plan["shapes"])
    try:
        inputs = [torch.randint(0, 2, s) if d == "long" else torch.randn(s)
                  for s, d in zip(plan["shapes"], plan["dtypes"])]
    except (RuntimeError, MemoryError) as e:  # within INPUT_VALUES_MAX, yet more than this machine has
        raise UsageError(f"the example inputs ({shapes}) could not be allocated: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}; pass smaller shapes, e.g. a batch of 1") from None
    try:
        source = interop.to_source(module, *inputs)
    except interop.ConversionError as e:
        if getattr(e.__cause__, "funcnet_conversion", None) is None:
            raise
        # the forward raised: to_source's message names the module, mode and line; the inputs were port's
        raise interop.ConversionError(f"{e}; the example inputs were {shapes}: pass the shapes (and --input-dtype) "
                                      f"forward expects") from None
    except SystemExit as e:
        raise UsageError(f"{plan['name']}'s forward called sys.exit({e.code!r}) on the example inputs ({shapes}); "
                         f"forward must return its outputs, not end the process") from None
    except Exception as e:
        raise UsageError(f"{plan['name']}'s forward failed on example inputs ({shapes}): {type(e).__name__}: {e}; "
                         f"pass the shapes (and --input-dtype) forward expects") from None
    summary = _write(args, module, source)
    branches = _shape_branches(module)
    if branches:
        more = f" (and {len(branches) - 1} more)" if len(branches) > 1 else ""
        # a comparison of sizes is recorded and checked by the port; a branch on a size's truth (if x.shape[0]:) is not
        then = (" and refuses, in one line (size_check), a call that would take another" if "size_check(" in source
                else ", so check it on the other shapes it will see")
        summary += f"; note: forward branches on a shape at {branches[0]}{more}: the port keeps the branch that " \
                   f"{shapes} took{then}"
    return summary


_SHAPE_READS = ("shape", "size", "dim", "ndim", "numel")


def _shape_branches(module) -> list[str]:
    """``"FILE:LINE: if ..."`` for each ``if``, ``while`` or ``x if c else y`` in the forward of
    the user's own classes whose test reads a shape (``.shape``, ``.size()``, ``len(...)``):
    the recording follows the branch the example inputs took, and the port has no ``if``."""
    import ast
    import inspect
    import textwrap

    found, seen = [], set()
    for m in module.modules():
        cls = type(m)
        if cls in seen or cls.__module__.startswith("torch."):
            continue
        seen.add(cls)
        try:
            lines, first = inspect.getsourcelines(cls.forward)
            tree = ast.parse(textwrap.dedent("".join(lines)))
            path = inspect.getsourcefile(cls.forward)
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.If, ast.While, ast.IfExp)):
                continue
            reads = [n for n in ast.walk(node.test) if (isinstance(n, ast.Attribute) and n.attr in _SHAPE_READS)
                     or (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len")]
            if reads:
                found.append(f"{os.path.basename(path)}:{first + node.lineno - 1} ({ast.unparse(node.test)})")
    return found


def _write(args, module, source: str) -> str:
    """``--weights`` (when given), then ``--out``; the summary line."""
    from funcnet import interop

    if args.weights is not None:
        # every key written as its own tensor (a tied one too), so torch's strict load_state_dict finds them all
        from funcnet.interop.weights.state_dict import _nest, _to_numpy

        tree = _nest(((k, _to_numpy(v)) for k, v in module.state_dict().items()), "funcnet port")
        _written("--weights", args.weights, lambda: interop.save_safetensors(args.weights, tree))
    _written("--out", args.out, lambda: write_atomic(args.out, source))
    lines = source.count("\n")
    return f"wrote {args.out} ({lines} lines)" + (f" and {args.weights}" if args.weights else "")


def _written(flag: str, path: str, write) -> None:
    """``write()``, its OSError (a full disk, a folder made read-only meanwhile) as one line naming the file."""
    try:
        write()
    except OSError as e:
        raise OSError(e.errno, f"{flag} {path}: could not write it: {e.strerror or e}; the file that was there (if "
                               f"any) is left as it was: free space there or pass a path on another disk") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``funcnet port``: returns the exit status."""
    from funcnet.interop.trace.registry import ConversionError

    try:
        print(run(sys.argv[1:] if argv is None else argv))
    except (UsageError, OSError, ConversionError) as e:
        print(f"funcnet port: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0
