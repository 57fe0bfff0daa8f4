"""HRM reference model (PyTorch, SDPA attention), its config and checkpoint loading.

- :mod:`~hrm_deploy.model.config`: ``HRMConfig``, the architecture as a frozen, versioned dataclass;
- :mod:`~hrm_deploy.model.hrm`: ``HRMCore`` (one ACT segment) and ``HRMACT`` (upstream's carry semantics);
- :mod:`~hrm_deploy.model.layers`: building blocks (attention, SwiGLU, RoPE);
- :mod:`~hrm_deploy.model.checkpoint`: load upstream's ``step_N`` or ours; save ours.
"""

from hrm_deploy.model.config import HRMConfig

__all__ = ["HRMConfig"]
