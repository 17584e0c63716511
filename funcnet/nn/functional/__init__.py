"""torch.nn.functional's counterpart: the layers' math as pure functions, imported as ``F``
(``from funcnet.nn import functional as F``), with torch's names and signatures."""

from funcnet.nn.functional import padding, resample
from funcnet.nn.functional.padding import *  # noqa: F401,F403
from funcnet.nn.functional.resample import *  # noqa: F401,F403

__all__ = [*resample.__all__, *padding.__all__]
