"""What the recorder (``interop/trace/record.py``) answers torch and libraries while a forward runs, and
how what the forward raises is told: ``torch.compiler.is_compiling()``, the recorder's own
quiet calls (``torch.vmap`` is recorded by funcnet/interop/trace/vmap.py), and the ``ConversionError`` for an exception of the model or of
funcnet."""

from __future__ import annotations

import os


_FUNCNET_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # funcnet/


class _quiet:
    """The recorder's own torch calls (reading sizes, storages) are not the model's."""

    def __init__(self, recorder):
        self.recorder = recorder

    def __enter__(self):
        self.before, self.recorder.busy = self.recorder.busy, True

    def __exit__(self, *exc):
        self.recorder.busy = self.before
        return False


# What torch.compiler.is_compiling() answers while recording: True, as under torch.compile, so that
# libraries take their traceable path (transformers skips its mask shortcuts that read the mask's
# values). Measured on the zoo and transformers' models (docs/design.md); FUNCNET_TRACE_COMPILING=0
# answers False, for comparing the two.
_ANSWER_COMPILING = os.environ.get("FUNCNET_TRACE_COMPILING", "1") != "0"


def _run(func, args, kwargs):
    """``func(*args, **kwargs)`` for the model: what it raises is torch's or the model's, not the recorder's."""
    try:
        return func(*args, **kwargs)
    except Exception as e:
        e.funcnet_torch = True
        raise


def _compiling() -> bool:
    return True


def _raised(recorder, mode: str, error: Exception) -> Exception:
    """The ``ConversionError`` for an exception raised while the forward ran: the model's own (its
    module path, mode and line, and what to do), or the recorder's (a funcnet bug, to report)."""
    from funcnet.interop.trace.frame import is_model_code
    from funcnet.interop.trace.registry import ConversionError

    if isinstance(error, ConversionError):
        return error
    frame = recorder.stack[-1] if recorder.stack else None
    path = (recorder.rec.names.get(id(frame.module), "?") or "<root>") if frame is not None else "<root>"
    # the innermost line of the model's own code (the line that called the torch layer that raised);
    # a torch layer's forward only when the model has no code of its own there (a torch layer at the root)
    tb, innermost, user, layer = error.__traceback__, None, None, "?"
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        innermost = name
        if not name.startswith(recorder.skip) and is_model_code(name, recorder.skip):
            user = f"{name}:{tb.tb_lineno}"
        elif is_model_code(name, recorder.skip):
            layer = f"{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    user = user or layer
    what = f"{type(error).__name__}: {error}"
    if innermost is not None and innermost.startswith(_FUNCNET_DIR) and not getattr(error, "funcnet_torch", False):
        return ConversionError(f"convert: internal error while tracing {path} in {mode} mode ({user}): {what}. This "
                               f"is a funcnet bug: please report it with this message and the model's code")
    hint = (" ; if only inference is wanted, convert(module, x, train=False) traces eval mode alone"
            if mode == "train" else "")
    before = "".join(f"\n  {p}: {op + ': ' if op else ''}{message} ({where})"
                     for p, op, where, message in recorder.rec.problems)
    return ConversionError(f"convert: the torch forward raised {what} while tracing {path} in {mode} mode "
                           f"({user}){hint}{before}")
