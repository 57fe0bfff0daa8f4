#!/usr/bin/env python3
"""The child side of scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py: one load variant in a fresh process.

    python scripts/diagnostics/2026-11-aoti-load/aoti_load_child.py SPEC_JSON

The parent (standard library only) starts one of these per variant and reads its stdout:
`STEP <name>` lines (import, import-<module>, cuda-init, cuda-op, warm, load, loaded, run-bN),
`FACT ...` lines, `RAN ...` lines and finally `RESULT ok` or `ERROR <type>: <first line>` (exit 3).
A native crash shows as the signal the process died of, after the last STEP it printed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _step(name: str) -> None:
    print(f"STEP {name}", flush=True)


def _inputs(torch, io, batch, device):
    xs = []
    for t in io:
        if not t.get("is_input"):
            continue
        shape = [batch if d == -1 else d for d in t["shape"]]
        dtype = getattr(torch, t["dtype"])
        xs.append(
            torch.ones(shape, dtype=dtype, device=device)
            if t["dtype"] == "bool"
            else torch.zeros(shape, dtype=dtype, device=device)
        )
    return xs


def _xcomp_mask(ctypes) -> str:
    """arch_prctl(ARCH_GET_XCOMP_PERM) as hex (bit 18: AMX tile data), or why it is unknown."""
    try:
        mask = ctypes.c_uint64(0)
        if ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)) != 0:  # SYS_arch_prctl on x86-64
            return "unavailable"
        return f"{mask.value:#x} (AMX tile data {'permitted' if mask.value >> 18 & 1 else 'not permitted'})"
    except (OSError, AttributeError) as exc:
        return f"unavailable ({exc})"


def child(spec: dict) -> None:
    import ctypes
    import faulthandler

    if not spec.get("fault_report"):  # with the preloaded fault report, it alone catches the signal
        faulthandler.enable()
    _step("import")
    import torch

    idx, st, dev = spec["index"], spec["st"], spec["dev"]
    cuda = spec["device"] == "cuda"
    if spec.get("facts"):
        print(
            f"FACT torch {torch.__version__} cuda {torch.version.cuda} git {torch.version.git_version[:12]}", flush=True
        )
        keys = (
            "CUDA_VISIBLE_DEVICES",
            "CUDA_MODULE_LOADING",
            "PYTORCH_CUDA_ALLOC_CONF",
            "LD_LIBRARY_PATH",
            "LD_PRELOAD",
            "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_DIR",
            "OMP_NUM_THREADS",
            "TMPDIR",
        )
        print("FACT env " + " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ), flush=True)
    for module in spec.get("pre_imports", []):  # what the CLI process has imported before its load
        _step(f"import-{module}")
        try:
            __import__(module)
        except ImportError as exc:
            print(f"FACT pre-import {module} unavailable: {exc}", flush=True)
    for library in spec.get("preload", []):  # one library onnxruntime's import maps, loaded alone
        _step(f"preload-{os.path.basename(library)}")
        ctypes.CDLL(library, mode=os.RTLD_NOW | ctypes.RTLD_GLOBAL)
    if spec.get("amx_first"):  # the permission asked before CUDA is initialised (hrm-deploy's order now)
        _step("amx-first")
        print(f"FACT amx tile data granted before CUDA: {torch.cpu._init_amx()}", flush=True)
    if cuda and spec["cuda"] == "tool":  # hrm_deploy: TorchMemory, then the runner's torch.cuda.init/set_device
        _step("cuda-init")
        d: Any = torch.device("cuda", idx)
        torch.cuda.Stream(d)
        cap, name = torch.cuda.get_device_capability(d), torch.cuda.get_device_name(d)
        torch.cuda.init()
        torch.cuda.set_device(idx)
        if spec.get("facts"):
            print(f"FACT gpu {name} sm {cap[0]}.{cap[1]} devices {torch.cuda.device_count()}", flush=True)
    if spec.get("amx"):  # the permission onnxruntime's import (and torch's compiler) asks for; a no-op without AMX
        _step("amx")
        print(f"FACT amx tile data granted: {torch.cpu._init_amx()}", flush=True)
    if cuda and spec.get("cuda_op"):  # a primary context that has launched a kernel and synchronised
        _step("cuda-op")
        torch.ones(1, device=f"cuda:{idx}").sum().item()
        torch.cuda.synchronize()
    if cuda and spec.get("warm"):
        _step("warm")
        f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
        f(torch.randn(256, device=f"cuda:{idx}"))
        torch.cuda.synchronize()
    method, run_fn = spec["method"], None
    print(f"FACT xcomp permission mask right before the load: {_xcomp_mask(ctypes)}", flush=True)
    _step("load")
    if method == "api":
        model = torch._inductor.aoti_load_package(spec["pkg"], run_single_threaded=st, device_index=dev)
        run_fn = lambda xs: model(*xs)  # noqa: E731
    elif method == "loader":
        loader = torch._C._aoti.AOTIModelPackageLoader(spec["pkg"], "model", st, 1, dev)
        run_fn = lambda xs: loader.run(xs)  # noqa: E731
    elif method == "runner":
        r: Any
        if cuda:
            dstr = "cuda" if dev < 0 else f"cuda:{dev}"
            try:
                r = torch._C._aoti.AOTIModelContainerRunnerCuda(spec["so"], 1, dstr, spec["cubin_dir"], st)  # type: ignore[call-overload]
            except TypeError:  # builds whose binding has no run_single_threaded argument
                r = torch._C._aoti.AOTIModelContainerRunnerCuda(spec["so"], 1, dstr, spec["cubin_dir"])
        else:
            r = torch._C._aoti.AOTIModelContainerRunnerCpu(spec["so"], 1)
        run_fn = lambda xs: r.run(xs)  # noqa: E731
    elif method == "hrm-runner":
        import numpy as np

        from hrm_deploy.backends import open_runner
        from hrm_deploy.backends.torch import runner as torch_runner
        from hrm_deploy.backends.torch.probe import LoadVerdict

        # load in-process: the verdict a probe would have given for a package that loads
        torch_runner.TorchEngineRunner.load_verdict = lambda self, torch, on_cuda: LoadVerdict(True)  # type: ignore[method-assign]
        hrm = open_runner(spec["pkg"], device=max(idx, 0), step_predictions=False).activate()
        seq = int(hrm.seq_len or 0)

        def run_fn(xs):
            b = int(xs[0].shape[0])
            out = hrm.infer({"inputs": np.ones((b, seq), np.int32), "puzzle_identifiers": np.zeros(b, np.int32)})
            return [torch.as_tensor(v) for v in out.values() if getattr(v, "dtype", None) is not None]
    elif method == "dlopen":
        ctypes.CDLL(spec["so"], mode=os.RTLD_NOW | os.RTLD_LOCAL)
    elif method == "control":
        d = f"cuda:{idx}"

        class Tiny(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(128, 256), torch.nn.Linear(256, 11)

            def forward(self, x, ids):
                return self.b(torch.relu(self.a(x))) + ids.float()[:, None]

        _step("control-compile")
        batch = torch.export.Dim("batch", min=1, max=1024)
        args = (torch.randn(2, 128, device=d), torch.zeros(2, dtype=torch.int32, device=d))
        ep = torch.export.export(Tiny().to(d).eval(), args, dynamic_shapes=({0: batch}, {0: batch}))
        torch._inductor.aoti_compile_and_package(ep, package_path=spec["pkg"])
        _step("load")
        model = torch._inductor.aoti_load_package(spec["pkg"], run_single_threaded=st, device_index=dev)
        run_fn = lambda xs: model(*xs)  # noqa: E731
    _step("loaded")
    if spec.get("run") and run_fn is not None:
        dev_str = f"cuda:{idx}" if cuda else "cpu"
        for b in spec["batches"]:
            xs = _inputs(torch, spec["io"], b, dev_str)
            _step(f"run-b{b}")
            with torch.no_grad():
                outs = run_fn(xs)
            if cuda:
                torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(o.float()).all()) for o in outs if o.is_floating_point())
            print(
                f"RAN b{b}: {len(outs)} outputs, shapes {[tuple(o.shape) for o in outs][:3]}..., finite={finite}",
                flush=True,
            )
    print("RESULT ok", flush=True)


def child_main(raw: str) -> None:
    try:
        child(json.loads(raw))
    except BaseException as exc:  # noqa: BLE001 - report any failure as one line
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        print(f"ERROR {type(exc).__name__}: {first}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    child_main(sys.argv[1])
