"""Tracing: a torch model's forward recorded on real tensors and replayed in JAX.

``record`` runs the forward under a ``TorchFunctionMode`` with hooks on every submodule (one
``graph.Graph`` per module call and mode, sizes as ``frame.Dim``s); ``env`` is what the recorder
answers torch and libraries while it runs (``is_compiling``, static checks) and how failures
become ``ConversionError``s; ``vmap`` records a ``torch.vmap`` body once; ``replay`` runs a
graph through the op table (``funcnet.interop.ops``); ``registry`` and ``modules`` turn
supported torch layers and containers into their funcnet.nn counterparts (``convert``);
``signature`` keeps one recording per input signature (``jax.jit``'s rule).
"""
