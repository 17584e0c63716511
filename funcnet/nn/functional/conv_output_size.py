"""torch's ``ConvTranspose*d.forward(x, output_size=...)``: the output padding that gives the
requested size.

A strided convolution maps several input sizes to one output size, so its transpose has
``stride`` possible output sizes: ``(in - 1) * stride - 2 * padding + dilation * (k - 1) + 1``
plus an output padding in ``[0, stride - 1]``. ``output_size`` picks one (its last n entries
when it lists the batch and channel axes too), as torch's ``_ConvTransposeNd._output_padding``.
"""

from __future__ import annotations

__all__ = ["output_padding_for"]


def output_padding_for(in_sizes, output_size, stride, padding, dilation, kernel, unbatched: bool,
                       where: str) -> tuple[int, ...]:
    """The output padding per spatial axis that makes the transposed convolution of ``in_sizes`` give
    ``output_size``; a ValueError naming ``where`` and the reachable sizes otherwise."""
    n = len(in_sizes)
    lead = 1 if unbatched else 2
    try:
        sizes = tuple(int(s) for s in output_size)
    except TypeError:
        sizes = None
    if sizes is not None and len(sizes) == n + lead:
        sizes = sizes[lead:]
    if sizes is None or len(sizes) != n:
        raise ValueError(f"{where}: for a {n + lead}D input, output_size must have {n} or {n + lead} elements, got "
                         f"{output_size!r}")
    min_sizes = tuple((i - 1) * s - 2 * p + d * (k - 1) + 1
                      for i, s, p, d, k in zip(in_sizes, stride, padding, dilation, kernel))
    max_sizes = tuple(m + s - 1 for m, s in zip(min_sizes, stride))
    if any(not lo <= s <= hi for s, lo, hi in zip(sizes, min_sizes, max_sizes)):
        raise ValueError(f"{where}: requested an output size of {sizes}, but valid sizes range from "
                         f"{min_sizes} to {max_sizes} (for an input of spatial size {tuple(in_sizes)})")
    return tuple(s - m for s, m in zip(sizes, min_sizes))
