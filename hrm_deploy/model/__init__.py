"""Reference models (PyTorch, SDPA attention) of each model family, their configs and checkpoint loading.

- :mod:`~hrm_deploy.model.families`: the registry of families (HRM, TRM) and their detection;
- :mod:`~hrm_deploy.model.config`: ``HRMConfig``, the architecture as a frozen, versioned dataclass (every
  family's base) and the HRM family's helpers;
- :mod:`~hrm_deploy.model.trm_config`: ``TRMConfig`` and the TRM family's helpers;
- :mod:`~hrm_deploy.model.hrm`: ``HRMCore`` (one ACT segment) and ``HRMACT`` (upstream's carry semantics);
- :mod:`~hrm_deploy.model.trm`: ``TRMCore`` / ``TRMACT``, the Tiny Recursive Model on the same interface;
- :mod:`~hrm_deploy.model.layers`: building blocks (attention, SwiGLU, RoPE);
- :mod:`~hrm_deploy.model.checkpoint`: load upstream's ``step_N`` or ours; save ours.
"""

from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.trm_config import TRMConfig

__all__ = ["HRMConfig", "TRMConfig"]
