"""The layered stack of each framework on this machine (``funcnet info``).

PyTorch: Python API -> ATen eager kernels -> MKL / oneDNN / OpenMP on CPU, cuDNN /
cuBLAS on GPU -> gloo / NCCL for collectives. JAX: Python tracing -> jaxpr ->
StableHLO -> XLA compiler -> Eigen / oneDNN / its own codegen on CPU, cuDNN / cuBLAS /
Triton on GPU -> gloo (CPU) or NCCL / ICI for collectives. ``stacks()`` reads what is
actually installed and available here; torch is imported only inside it.
"""

from __future__ import annotations

import os
import platform

__all__ = ["jax_stack", "torch_stack", "stacks", "print_stacks"]


def jax_stack() -> dict[str, str]:
    """JAX's versions, backend and devices, as name -> text."""
    import jax
    import jaxlib

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    try:
        collectives = str(jax.config.jax_cpu_collectives_implementation)
    except AttributeError:
        collectives = "n/a"
    return {
        "python API": f"jax {jax.__version__} (transformations: grad, jit, vmap, shard_map)",
        "graph": "traced to a jaxpr, lowered to StableHLO",
        "compiler": f"XLA via jaxlib {jaxlib.__version__}, backend {jax.default_backend()}",
        "kernels": ("XLA CPU codegen (LLVM) + Eigen/oneDNN for dots" if jax.default_backend() == "cpu"
                    else "XLA GPU/TPU codegen, cuBLAS/cuDNN or TPU MXU"),
        "collectives": (f"CPU collectives: {collectives}" if jax.default_backend() == "cpu"
                        else "NCCL (GPU) / ICI (TPU)"),
        "devices": f"{len(devices)} x {', '.join(kinds)}",
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") or "(unset)",
    }


def torch_stack() -> dict[str, str]:
    """torch's version, CUDA and distributed backends, as name -> text ("not installed" without torch)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {"python API": "torch not installed (pip install 'funcnet[torch]')"}
    backends = torch.backends
    cpu_libs = [name for name, ok in (("MKL", backends.mkl.is_available()),
                                      ("oneDNN", backends.mkldnn.is_available()),
                                      ("OpenMP", backends.openmp.is_available())) if ok]
    if torch.cuda.is_available():
        gpu = f"CUDA {torch.version.cuda}, cuDNN {backends.cudnn.version()}, {torch.cuda.get_device_name(0)}"
    else:
        gpu = "no CUDA device"
    coll = [name for name, ok in (("gloo", dist.is_gloo_available()),
                                  ("NCCL", dist.is_nccl_available()),
                                  ("MPI", dist.is_mpi_available())) if ok]
    return {
        "python API": f"torch {torch.__version__} (eager by default; torch.compile optional)",
        "graph": "recorded during forward (autograd tape), freed after backward",
        "compiler": "none in eager; TorchDynamo + Inductor under torch.compile",
        "kernels": f"ATen on CPU via {', '.join(cpu_libs) or 'reference kernels'}; {gpu}",
        "collectives": f"torch.distributed backends: {', '.join(coll) or 'none'}",
        "devices": f"cpu threads {torch.get_num_threads()}"
                   + (f", {torch.cuda.device_count()} CUDA" if torch.cuda.is_available() else ""),
    }


def stacks() -> dict[str, dict[str, str]]:
    """The machine, JAX and torch stacks, as ``{"machine" | "jax" | "torch": {name: text}}``."""
    return {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": str(os.cpu_count())},
            "jax": jax_stack(), "torch": torch_stack()}


def print_stacks() -> None:
    """Print ``stacks()`` as one table per stack."""
    from rich.console import Console
    from rich.table import Table

    info = stacks()
    console = Console()
    console.print(f"[bold]machine[/]: {info['machine']['platform']}, python {info['machine']['python']}, "
                  f"{info['machine']['cpus']} CPUs")
    table = Table(title="framework stacks on this machine")
    table.add_column("layer")
    table.add_column("PyTorch")
    table.add_column("JAX")
    layers = list(dict.fromkeys([*info["torch"], *info["jax"]]))
    for layer in layers:
        table.add_row(layer, info["torch"].get(layer, ""), info["jax"].get(layer, ""))
    console.print(table)
