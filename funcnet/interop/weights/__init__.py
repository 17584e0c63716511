"""Weights: torch tensors <-> funcnet params and state (``state_dict``), and safetensors files
without torch (``files``)."""
