"""HRM reference model (PyTorch, SDPA attention), its config and checkpoint loading."""

from hrm_deploy.model.config import HRMConfig

__all__ = ["HRMConfig"]
