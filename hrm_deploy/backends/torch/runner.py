"""PyTorch engine runner (``.pt2`` from ``build-engine --backend torch``): the AOTInductor
package (or, where the build fell back, the exported program: :mod:`.fallback`) behind
:class:`TorchEngineAdapter`, driven by the same :class:`~hrm_deploy.runtime.device_loop.DeviceLoop`
as TensorRT engines: on CUDA one stream, buffers once per batch size, the step loop captured
as a CUDA graph; on the CPU the same loop with torch CPU memory (no graph).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrm_deploy.backends.torch.fallback import load_program
from hrm_deploy.backends.torch.package import (
    load_aoti_package,
    prepare_load,
    release_folder,
    set_tf32,
)
from hrm_deploy.errors import ConfigError, EngineError, require
from hrm_deploy.manifest import check_artifact
from hrm_deploy.runtime.adapter import TensorSpec
from hrm_deploy.runtime.base import LoopRunner
from hrm_deploy.runtime.compat import check_compatible

log = logging.getLogger(__name__)

__all__ = ["TorchEngineAdapter", "TorchEngineRunner", "load_aoti_package"]


class TorchEngineAdapter:
    """The engine surface for a compiled torch callable ``fn(*inputs) -> outputs``. A context is
    a dict of bound tensors; ``execute`` calls ``fn`` and copies its outputs into the bound
    output buffers (on the memory backend's stream). Buffers that are not torch tensors
    (cuda-python memory) are wrapped zero-copy through ``__cuda_array_interface__``."""

    def __init__(self, fn: Callable[..., Any], specs: list[TensorSpec], memory: Any, batch_range: tuple[int, int]):
        import torch

        self.torch, self.fn, self.memory, self.batch_range = torch, fn, memory, batch_range
        self.tensors = {s.name: s for s in specs}
        self.inputs = [s.name for s in specs if s.is_input]
        self.outputs = [s.name for s in specs if not s.is_input]
        cuda = memory.kind in ("torch-cuda", "cuda-python")
        # the memory backend's device (the runner's --device), not whatever device is current:
        # TorchMemory has a torch device, cuda-python memory a device index
        if not cuda:
            self.device = torch.device("cpu")
        elif getattr(memory, "device", None) is not None:
            self.device = memory.device
        else:
            self.device = torch.device("cuda", int(getattr(memory, "device_index", 0)))
        self.graph_safe = True  # False when the compiled model cannot be captured (see load_aoti_package)
        external = memory.kind == "cuda-python"
        self._stream = torch.cuda.ExternalStream(memory.stream_handle) if external else None

    def new_context(self) -> dict[str, Any]:
        return {"shapes": {}, "bound": {}}

    def set_input_shape(self, context: dict[str, Any], name: str, shape: tuple[int, ...]) -> bool:
        spec = self.tensors[name]
        low, high = self.batch_range
        ok = (
            len(shape) == len(spec.shape)
            and low <= shape[0] <= high
            and all(w in (-1, d) for w, d in zip(spec.shape, shape))
        )
        if ok:
            context["shapes"][name] = tuple(shape)
        return ok

    def output_shape(self, context: dict[str, Any], name: str) -> tuple[int, ...]:
        return self.tensors[name].at(context["shapes"].get("inputs", (-1,))[0])

    def scratch_bytes(self, context: Any) -> int:
        return 0  # the compiled code allocates its own temporaries from torch's allocator

    def set_scratch(self, context: Any, buffer: Any, nbytes: int) -> None:
        pass

    def bind(self, context: dict[str, Any], name: str, buffer: Any) -> None:
        torch = self.torch
        if not isinstance(buffer, torch.Tensor):  # cuda-python memory: a zero-copy view
            view = torch.as_tensor(buffer, device=self.device)
            buffer = view.view(torch.bfloat16) if getattr(buffer, "dtype", None) == "bfloat16" else view
        context["bound"][name] = buffer

    def execute(self, context: dict[str, Any]) -> None:
        torch, bound = self.torch, context["bound"]
        with torch.no_grad(), torch.cuda.stream(self._stream) if self._stream is not None else _null():
            outs = self.fn(*[bound[n] for n in self.inputs])
            for name, value in zip(self.outputs, outs):
                bound[name].copy_(value)

    def capturable(self, context: Any) -> bool:
        # torch's allocator must know the capture (torch.cuda.graph): only with torch memory
        return self.memory.kind == "torch-cuda" and self.graph_safe


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class TorchEngineRunner(LoopRunner):
    """PyTorch (AOTInductor) engines; CPU engines use torch CPU memory (options: see
    :class:`~hrm_deploy.runtime.base.LoopRunner`)."""

    name = "torch"
    default_mode = "step"

    def __init__(self, path: str | Path, **options: Any):
        super().__init__(path, **options)
        if self.manifest.get("backend", {}).get("name") != "torch":
            raise EngineError(f"{self.path} is not a PyTorch engine (its manifest names another backend)")
        self.compile_path = self.manifest.get("compile_path", "aoti")

    def _activate(self) -> None:
        torch = require("torch", "torch", "The PyTorch engine runner")
        check_artifact(self.path, require_manifest=True)
        from hrm_deploy.runtime.device_loop import DeviceLoop
        from hrm_deploy.runtime.memory import device_memory

        on_cuda = self.manifest.get("device") == "cuda"
        if on_cuda and not torch.cuda.is_available():
            raise EngineError(
                f"{self.path.name} was compiled for CUDA but torch sees no GPU here; rebuild it here "
                "(hrm-deploy build-engine --backend torch builds for the CPU without a GPU)"
            )
        if on_cuda and self.memory_kind == "cuda-python":
            # On an H100 this pairing failed (an illegal memory access, then a crash loading the
            # package): AOTInductor's kernels and allocator belong to torch, so its buffers do too.
            raise ConfigError(
                "the PyTorch engine runs on torch's CUDA memory; the runner option memory='cuda-python' is "
                "for TensorRT engines on machines without torch: open it with memory='torch' (or 'auto')"
            )
        self.memory = device_memory(self.device_index if on_cuda else "cpu", "torch" if on_cuda else "auto")
        check_compatible(self.manifest, "torch", torch.__version__, self.memory.capability, self.memory.gpu_name)
        if self.compile_path == "aoti":  # before CUDA, as the probe's child does (docs/gpu.md)
            self.runtime_settings["load_setup"] = prepare_load(torch)
        if on_cuda:  # torch's CUDA state exists on the runner's GPU before the package is loaded onto it
            torch.cuda.init()
            torch.cuda.set_device(self.device_index)
            # float32 matmuls as the engine was built: exact unless it was built with --tf32
            set_tf32(torch, bool(self.manifest.get("tf32", False)))
        fn, graph_safe = self._load(torch, on_cuda)
        specs = [TensorSpec(t["name"], t["is_input"], t["dtype"], tuple(t["shape"])) for t in self.manifest["io"]]
        low, high = self.manifest.get("profile_shapes", {}).get("batch", [1, 1024])
        adapter = TorchEngineAdapter(fn, specs, self.memory, (int(low), int(high)))
        adapter.graph_safe = graph_safe
        self.loop = DeviceLoop(
            adapter,
            self.memory,
            self.steps if self.mode == "step" else self.requested_steps,
            cuda_graph=self.cuda_graph,
            step_predictions=self.step_predictions,
        )
        self.mode, self.steps = self.loop.mode, self.loop.steps
        self.min_batch, self.max_batch = int(low), int(high)
        self.seq_len = adapter.tensors["inputs"].shape[-1]

    def _load(self, torch: Any, on_cuda: bool) -> tuple[Callable[..., Any], bool]:
        """The compiled callable and whether a CUDA graph may capture it. An AOTInductor package
        is first loaded by a child process (:mod:`.probe`): where that dies, the exported program
        saved beside the engine runs instead (:mod:`.fallback`; one warning line), or, for
        an engine without one, one error line says what to do."""
        device = torch.device("cuda", self.device_index) if on_cuda else None
        if self.compile_path != "aoti":  # the build could not AOT-compile: the exported program runs here
            return load_program(torch, self.path, device), True
        verdict = self.load_verdict(torch, on_cuda)
        if verdict.ok:
            return load_aoti_package(
                torch,
                self.path,
                single_threaded=on_cuda and self.cuda_graph,
                device_index=self.device_index if on_cuda else -1,
            )
        companion = fallback_program(self.path, self.manifest)
        where = f"torch {torch.__version__} on {'CUDA' if on_cuda else 'the CPU'}"
        if companion is None:
            raise EngineError(
                f"{self.path.name} cannot be loaded by {where}: {verdict.reason}; rebuild it with "
                "`hrm-deploy build-engine --backend torch`, which saves its exported program beside it to run "
                "where the package cannot load"
            )
        log.warning(
            "%s cannot be loaded by %s (%s); running its exported program instead",
            self.path.name,
            where,
            verdict.reason,
        )
        self.compile_path = "exported program (load fallback)"
        self.runtime_settings["load_fallback"] = verdict.reason
        return load_program(torch, companion, device), True

    def load_verdict(self, torch: Any, on_cuda: bool) -> Any:
        """Whether this package may be loaded in this process: the probe's (cached, sealed) verdict
        from a child process that loaded it as this runner would (:mod:`.probe`)."""
        from hrm_deploy.backends.torch.probe import ProbeSpec, probe_load

        spec = ProbeSpec(
            path=str(self.path.resolve()),
            device="cuda" if on_cuda else "cpu",
            device_index=self.device_index if on_cuda else -1,
            single_threaded=on_cuda and self.cuda_graph,
            tf32=bool(self.manifest.get("tf32", False)),
            io=self.manifest["io"],
            max_batch=int(self.manifest.get("profile_shapes", {}).get("batch", [1, 1])[1]),
            capture=on_cuda and self.cuda_graph,
        )
        label = f"cuda {self.memory.gpu_name}" if on_cuda else "cpu"
        return probe_load(spec, sha256=self.manifest["sha256"], torch_version=torch.__version__, device_label=label)

    @property
    def engine_path(self) -> str:
        """What runs: ``engine`` (the AOTInductor package) or ``fallback (eager|torch.compile)``
        (the exported program; where the build could not AOT-compile or the package cannot load here)."""
        how = getattr(getattr(getattr(self.loop, "adapter", None), "fn", None), "path", None)
        return "engine" if how is None else f"fallback ({how})"

    def _close(self) -> None:
        try:
            super()._close()
        finally:  # the loaded package is gone with the loop: its unzip folder too, then this process's
            release_folder()


def fallback_program(path: Path, manifest: dict[str, Any]) -> Path | None:
    """The exported program the build saved beside an AOTInductor package (checked against the
    manifest's sha256 with the engine), or None for an engine without one."""
    name = manifest.get("load_fallback")
    if not name or name not in (manifest.get("companions") or {}):
        return None
    return path.with_name(str(name))
