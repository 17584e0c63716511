"""torch.nn.functional's counterpart: the layers' math as pure functions, imported as ``F``
(``from funcnet.nn import functional as F``), with torch's names and signatures."""

from funcnet.nn.functional import instance_norm as _instance_norm, padding, pooling_extra, resample
from funcnet.nn.functional.instance_norm import *  # noqa: F401,F403
from funcnet.nn.functional.padding import *  # noqa: F401,F403
from funcnet.nn.functional.pooling_extra import *  # noqa: F401,F403
from funcnet.nn.functional.resample import *  # noqa: F401,F403

# (the function ``instance_norm`` shadows the module of that name, hence the alias)
__all__ = [*resample.__all__, *padding.__all__, *_instance_norm.__all__, *pooling_extra.__all__]
