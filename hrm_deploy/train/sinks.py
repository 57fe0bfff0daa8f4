"""Optional metric sinks besides ``metrics.jsonl``: TensorBoard and Weights & Biases, used
only when asked for (``--log-to``) and installed; asked for but missing is a clear error."""

from __future__ import annotations

from typing import Any

from hrm_deploy.errors import ConfigError, DependencyError

SINKS = ("tensorboard", "wandb")


def _numbers(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and key != "step":
            out[prefix + key] = float(value)
    return out


class MetricSinks:
    def __init__(self, names: tuple[str, ...], out_dir: str, run_config: dict[str, Any]):
        unknown = set(names) - set(SINKS)
        if unknown:
            raise ConfigError(f"--log-to {', '.join(sorted(unknown))}: choose from {', '.join(SINKS)}")
        self.writers: list[Any] = []
        if "tensorboard" in names:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise DependencyError(
                    "--log-to tensorboard needs the tensorboard package: pip install tensorboard"
                ) from None
            self.writers.append(("tensorboard", SummaryWriter(log_dir=f"{out_dir}/tensorboard")))
        if "wandb" in names:
            try:
                import wandb
            except ImportError:
                raise DependencyError("--log-to wandb needs the wandb package: pip install wandb") from None
            self.writers.append(("wandb", wandb.init(project="hrm-deploy", dir=out_dir, config=run_config)))

    def log(self, row: dict[str, Any]) -> None:
        values = _numbers(row)
        for kind, writer in self.writers:
            if kind == "tensorboard":
                for key, value in values.items():
                    writer.add_scalar(key, value, row["step"])
            else:
                writer.log(values, step=row["step"])

    def close(self) -> None:
        for kind, writer in self.writers:
            writer.close() if kind == "tensorboard" else writer.finish()
