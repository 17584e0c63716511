"""Side-by-side comparisons: each concept of the source articles in PyTorch and in JAX.

Run them with ``python -m comparisons [NAME ...]``; see ``comparisons/_core.py`` for
what a comparison returns.
"""
