"""torch <-> funcnet: weights, buffers, whole models and safetensors files.

- ``from_torch(module_or_state_dict) -> params`` and ``to_torch(params, state=None)``: torch's
  parameters as a nested params dict with the same names, shapes, dtypes and bits, and back
  as ``{dotted_key: torch.Tensor}`` for ``module.load_state_dict``.
- ``from_torch_with_state(module_or_state_dict) -> (params, state)``: the same, with torch's
  buffers (BatchNorm's running statistics) as the state tree of the module contract.
  ``from_torch`` refuses a source with buffers and names this function, rather than mixing
  buffers into params (an optimizer would update them) or dropping them.
- ``convert(module) -> (model, params, state)``: a torch module made of supported layers and
  containers as a ready funcnet.nn model, with its variables.
  A model traced on example inputs is specialised per input signature, as ``jax.jit`` is: a
  call with new shapes, dtypes or non-array arguments records the torch module again.
- ``shape_guard(signature, names)``: the decorator a ``to_source`` port's root carries when its
  code holds at the traced shapes alone; another input signature is refused in one line.
- ``size_check(holds, condition, where)``: the line a port writes where the torch code compared
  sizes and branched; the port refuses, in one line, a call where the branch taken no longer holds.
- ``from_pretrained(DIR)``: a Hugging Face checkpoint folder (``save_pretrained``'s) converted;
  ``generate_greedy``: greedy decoding with a converted causal LM.
- ``save_safetensors`` / ``load_safetensors``: the safetensors file format, without torch.

Tied parameters (nanoGPT's ``lm_head.weight is transformer.wte.weight``) stay tied: the
params tree holds the array once, at the first name torch lists, and ``nn.Tied`` at the
others. torch is imported lazily, inside the functions that need it; the safetensors
functions never import it.

Examples:
    >>> import torch
    >>> from funcnet import interop
    >>> params = interop.from_torch(torch.nn.Linear(3, 2))
    >>> {k: v.shape for k, v in params.items()}
    {'weight': (2, 3), 'bias': (2,)}
"""

from funcnet.interop.weights.files import load_safetensors, save_safetensors
from funcnet.interop.hf import from_pretrained, generate_greedy
from funcnet.interop.trace.modules import convert
from funcnet.interop.optim.convert import convert_optimizer
from funcnet.interop.trace.registry import SUPPORTED_MODULES, ConversionError
from funcnet.interop.source.write import to_source
from funcnet.interop.trace.signature import shape_guard, size_check
from funcnet.interop.weights.state_dict import from_torch, from_torch_with_state, to_torch

__all__ = ["from_torch", "from_torch_with_state", "to_torch", "convert", "to_source", "save_safetensors",
           "load_safetensors", "SUPPORTED_MODULES", "ConversionError", "convert_optimizer", "from_pretrained",
           "generate_greedy", "shape_guard", "size_check"]
