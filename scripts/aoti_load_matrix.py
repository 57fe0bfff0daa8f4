#!/usr/bin/env python3
"""Where does loading an AOTInductor (.pt2) package crash? One line per load variant.

    python scripts/aoti_load_matrix.py ENGINE.pt2 [--device-index 0] [--budget 170] [--control]

Needs only the standard library here and torch in the children. The parent never imports
torch: every variant runs in its own fresh `python` child (subprocess, never fork), so a
segfault costs only that child. Printed per variant: ok / SIGSEGV (or other signal) / error /
timeout, the seconds it took and the last step the child reached (import, cuda-init, warm,
load, loaded, run-bN). Variants, most informative first:

  tool-api            torch._inductor.aoti_load_package(run_single_threaded=True, device_index=N)
                      after TorchMemory-like CUDA setup + torch.cuda.init() + set_device(N):
                      the load `hrm-deploy verify/solve` did before the child-process probe
  dlopen-extracted    the package's .so, unzipped here, dlopen'ed (RTLD_NOW|RTLD_LOCAL) only:
                      dynamic linking + static initialisers, no model container
  runner-extracted    AOTIModelContainerRunnerCuda on the unzipped .so + cubin dir: container
                      creation (cudaSetDevice, weights cudaMalloc/cudaMemcpy) without the zip loader
  hrm-runner          hrm-deploy's own runner (open_runner + activate + one batch-1 call), its
                      probe skipped: today's in-process load (private unzip folder, TF32 setting)
  api-cli-imports     tool-api after importing what `hrm-deploy verify` imports first (the
                      CLI, verify, onnxruntime where installed): a library clash shows here
  tool-loader         the same C++ AOTIModelPackageLoader, without the Python pre-steps
                      (load_metadata_from_package, get_device_information/pick_vec_isa)
  loader-st0-dev      run_single_threaded=False, device_index=N
  loader-st1-devdef   run_single_threaded=True,  device_index=-1
  loader-defaults     run_single_threaded=False, device_index=-1 (torch's defaults)
  loader-no-cuda-init tool options, but nothing touches CUDA before the load
  loader-warm         tool options after a torch.compile'd CUDA op ran (Triton/Inductor warm,
                      like the pytest process that compiled the engine itself)
  api-fresh-cache     tool-api with TORCHINDUCTOR_CACHE_DIR = a new empty folder
  run                 the first variant that loaded ok, plus one forward at batch 1 and at the
                      profile's max batch (inputs from <pkg>.manifest.json's "io"; skipped without it)
Then, if a variant died by a signal and time is left: the native backtrace of a rerun under gdb
(if gdb is installed) and the last dynamic-loader lines (LD_DEBUG=files) before the crash.
--control also AOT-compiles a tiny plain-torch CUDA model (dynamic batch 1..1024), loads it in
the compiling process and then in a fresh one (~60-90 s more): crash there too => not specific
to this package.

Extraction folders that crashed children leave in /tmp (the C++ loader's mkdtemp: /tmp/XXXXXX in
the 2.11-era loader, /tmp/aotinductor_XXXXXX in later ones) are reported (how far extraction got)
and removed unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ME = os.path.abspath(__file__)
EST = {"api": 35, "loader": 14, "dlopen": 12, "runner": 14, "warm": 35, "fresh": 50, "run": 25}
DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "bool")
CLI_IMPORTS = ["hrm_deploy.cli", "hrm_deploy.verify", "hrm_deploy.backends.reference", "onnxruntime", "onnx"]


# ---------------------------------------------------------------------------------------------
# child side (imports torch)
# ---------------------------------------------------------------------------------------------
def _step(name: str) -> None:
    print(f"STEP {name}", flush=True)


def _inputs(torch, io, batch, device):
    xs = []
    for t in io:
        if not t.get("is_input"):
            continue
        shape = [batch if d == -1 else d for d in t["shape"]]
        dtype = getattr(torch, t["dtype"])
        xs.append(torch.ones(shape, dtype=dtype, device=device) if t["dtype"] == "bool"
                  else torch.zeros(shape, dtype=dtype, device=device))
    return xs


def child(spec: dict) -> None:
    import ctypes
    import faulthandler

    faulthandler.enable()
    _step("import")
    import torch

    idx, st, dev = spec["index"], spec["st"], spec["dev"]
    cuda = spec["device"] == "cuda"
    if spec.get("facts"):
        print(f"FACT torch {torch.__version__} cuda {torch.version.cuda} git {torch.version.git_version[:12]}", flush=True)
        keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "LD_LIBRARY_PATH",
                "LD_PRELOAD", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "OMP_NUM_THREADS", "TMPDIR")
        print("FACT env " + " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ), flush=True)
    for module in spec.get("pre_imports", []):  # what the CLI process has imported before its load
        _step(f"import-{module}")
        try:
            __import__(module)
        except ImportError as exc:
            print(f"FACT pre-import {module} unavailable: {exc}", flush=True)
    if cuda and spec["cuda"] == "tool":  # hrm_deploy: TorchMemory, then the runner's torch.cuda.init/set_device
        _step("cuda-init")
        d = torch.device("cuda", idx)
        torch.cuda.Stream(d)
        cap, name = torch.cuda.get_device_capability(d), torch.cuda.get_device_name(d)
        torch.cuda.init()
        torch.cuda.set_device(idx)
        if spec.get("facts"):
            print(f"FACT gpu {name} sm {cap[0]}.{cap[1]} devices {torch.cuda.device_count()}", flush=True)
    if cuda and spec.get("warm"):
        _step("warm")
        f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
        f(torch.randn(256, device=f"cuda:{idx}"))
        torch.cuda.synchronize()
    method, run_fn = spec["method"], None
    _step("load")
    if method == "api":
        model = torch._inductor.aoti_load_package(spec["pkg"], run_single_threaded=st, device_index=dev)
        run_fn = lambda xs: model(*xs)  # noqa: E731
    elif method == "loader":
        loader = torch._C._aoti.AOTIModelPackageLoader(spec["pkg"], "model", st, 1, dev)
        run_fn = lambda xs: loader.run(xs)  # noqa: E731
    elif method == "runner":
        if cuda:
            dstr = "cuda" if dev < 0 else f"cuda:{dev}"
            try:
                r = torch._C._aoti.AOTIModelContainerRunnerCuda(spec["so"], 1, dstr, spec["cubin_dir"], st)
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

        torch_runner.TorchEngineRunner._probe = lambda self, torch, on_cuda: LoadVerdict(True)  # load in-process
        hrm = open_runner(spec["pkg"], device=max(idx, 0), step_predictions=False).activate()
        seq = int(hrm.seq_len)

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
            print(f"RAN b{b}: {len(outs)} outputs, shapes {[tuple(o.shape) for o in outs][:3]}..., finite={finite}",
                  flush=True)
    print("RESULT ok", flush=True)


def child_main(raw: str) -> None:
    try:
        child(json.loads(raw))
    except BaseException as exc:  # noqa: BLE001 - report any failure as one line
        first = (str(exc).strip().splitlines() or [""])[0][:240]
        print(f"ERROR {type(exc).__name__}: {first}", flush=True)
        sys.exit(3)


# ---------------------------------------------------------------------------------------------
# parent side (no torch)
# ---------------------------------------------------------------------------------------------
def say(line: str = "") -> None:
    print(line, flush=True)


def inspect_package(pkg: Path, work: Path) -> dict:
    """Unzip the AOTI model folder (for the *-extracted variants) and describe the archive."""
    info: dict = {}
    with zipfile.ZipFile(pkg) as z:
        names = z.namelist()
        bad = z.testzip()
        model = [n for n in names if re.search(r"(^|/)data/aotinductor/model/[^/]+$", n)]
        consts = [n for n in names if re.search(r"(^|/)data/constants/[^/]+$", n)]
        info["prefix"] = names[0].split("/")[0] if names else "?"
        out = work / "data" / "aotinductor" / "model"
        out.mkdir(parents=True, exist_ok=True)
        for n in model + consts:
            (out / os.path.basename(n)).write_bytes(z.read(n))
        sos = sorted(out.glob("*.so"), key=lambda p: -p.stat().st_size)
        meta = next(iter(out.glob("*wrapper_metadata.json")), None)
        info["metadata"] = json.loads(meta.read_text()) if meta else {}
        info["so"] = str(sos[0]) if sos else None
        info["cubin_dir"] = str(out)
        kinds: dict = {}
        for n in model + consts:
            ext = os.path.splitext(n)[1] or n.rsplit("/", 1)[-1]
            kinds[ext] = kinds.get(ext, 0) + 1
        say(f"package  {pkg} ({pkg.stat().st_size / 2**20:.1f} MiB, mode {oct(pkg.stat().st_mode & 0o777)}), "
            f"archive root '{info['prefix']}/', {len(names)} entries, CRC {'ok' if bad is None else 'BAD: ' + bad}")
        say(f"model    {len(model)} files {dict(sorted(kinds.items()))}; .so: "
            + ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in sos))
        say(f"metadata {json.dumps(info['metadata'], sort_keys=True)}")
        if any(n.endswith(".blob") for n in model) or any("/data/weights/" in n for n in names):
            say("weights  stored outside the .so (.blob or data/weights/): the loader updates constants after creation")
    if info["so"] and shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-dW", info["so"]], capture_output=True, text=True).stdout
        needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
        paths = re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.+?)\]", dyn)
        say(f"elf      NEEDED {' '.join(needed)}")
        say(f"elf      RPATH/RUNPATH {' | '.join(paths) or '(none)'}")
    return info


def tmp_dirs() -> set[str]:
    try:
        return {e.path for e in os.scandir("/tmp")
                if e.is_dir() and re.fullmatch(r"(aotinductor_)?[A-Za-z0-9]{6}", e.name)}
    except OSError:
        return set()


def leftovers(before: set[str], keep: bool) -> str:
    notes = []
    for d in sorted(tmp_dirs() - before):
        files = [p for p in Path(d).rglob("*") if p.is_file()]
        if not any("aotinductor" in str(p) for p in files):
            continue
        so = [p for p in files if p.suffix == ".so"]
        notes.append(f"{d}: {len(files)} files extracted" + (f", .so {so[0].stat().st_size} B" if so else ", no .so"))
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    return "; ".join(notes)


def run_child(spec: dict, timeout: float, env_extra: dict | None = None, wrap: list | None = None):
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", **(env_extra or {}))
    argv = [*(wrap or []), sys.executable, ME, "--child", json.dumps(spec)]
    start = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc = None
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return rc, out, err, time.perf_counter() - start


def verdict(rc, out: str, err: str) -> tuple[str, str]:
    steps = re.findall(r"^STEP (\S+)", out, re.M)
    last = steps[-1] if steps else "-"
    if rc is None:
        return "timeout", last
    if rc < 0:
        try:
            return signal.Signals(-rc).name, last
        except ValueError:
            return f"signal {-rc}", last
    if rc == 0 and "RESULT ok" in out:
        return "ok", last
    m = re.search(r"^ERROR (.+)$", out, re.M)
    if m:
        return "error " + m.group(1), last
    tail = (err.strip().splitlines() or [f"rc {rc}"])[-1][:200]
    return f"error rc={rc}: {tail}", last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package")
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds for everything (default 170)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per child (default 90)")
    ap.add_argument("--control", action="store_true", help="also compile+load a tiny plain-torch CUDA package")
    ap.add_argument("--only", default="", help="comma-separated variant names to run")
    ap.add_argument("--no-forensics", action="store_true", help="skip the gdb / LD_DEBUG reruns")
    ap.add_argument("--keep", action="store_true", help="keep temp folders and crashed children's /tmp/XXXXXX")
    args = ap.parse_args()
    t0 = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - t0)  # noqa: E731

    pkg = Path(args.package).resolve()
    if not pkg.is_file():
        say(f"{pkg}: no such file")
        return 2
    work = Path(tempfile.mkdtemp(prefix="aoti-matrix-"))
    usage = shutil.disk_usage("/tmp")
    litter = [d for d in tmp_dirs() if any("aotinductor" in str(p) for p in Path(d).rglob("*.so"))]
    say(f"/tmp     {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB; "
        f"{len(litter)} unzip folder(s) of earlier loads left there")
    info = inspect_package(pkg, work / "x")
    device = info["metadata"].get("AOTI_DEVICE_KEY", "cuda")
    manifest = pkg.with_name(pkg.name + ".manifest.json")
    io, batches = None, [1]
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        io = m.get("io")
        batches = sorted({1, int(m.get("profile_shapes", {}).get("batch", [1, 1])[-1])})
        say(f"manifest io: {len(io or [])} tensors, batch profile -> run at {batches}; "
            f"build machine {m.get('build_machine')}, max_batch {m.get('config', {}).get('max_batch')}")
    i = args.device_index
    base = {"pkg": str(pkg), "so": info["so"], "cubin_dir": info["cubin_dir"], "index": i, "device": device,
            "cuda": "tool", "st": True, "dev": i if device == "cuda" else -1, "io": io, "batches": batches}
    variants = [
        ("tool-api", {"method": "api", "facts": True}, {}, "api"),
        ("dlopen-extracted", {"method": "dlopen"}, {}, "dlopen"),
        ("runner-extracted", {"method": "runner"}, {}, "runner"),
        ("hrm-runner", {"method": "hrm-runner"}, {}, "api"),
        ("api-cli-imports", {"method": "api", "pre_imports": CLI_IMPORTS}, {}, "api"),
        ("tool-loader", {"method": "loader"}, {}, "loader"),
        ("loader-st0-dev", {"method": "loader", "st": False}, {}, "loader"),
        ("loader-st1-devdef", {"method": "loader", "dev": -1}, {}, "loader"),
        ("loader-defaults", {"method": "loader", "st": False, "dev": -1}, {}, "loader"),
        ("loader-no-cuda-init", {"method": "loader", "cuda": "none"}, {}, "loader"),
        ("loader-warm", {"method": "loader", "warm": True}, {}, "warm"),
        ("api-fresh-cache", {"method": "api"}, {"TORCHINDUCTOR_CACHE_DIR": str(work / "fresh-cache")}, "fresh"),
    ]
    if device != "cuda":
        say(f"(a {device} package: CUDA steps are skipped; the matrix still exercises the loader paths)")
        variants = [v for v in variants if v[3] != "warm"]
    only = {s for s in args.only.split(",") if s}
    say(f"{'variant':20s} {'st':>2s} {'dev':>3s} {'cuda':5s} result (seconds, last step)")
    results: dict = {}
    leaked = 0
    for name, over, env, kind in variants:
        if only and name not in only:
            continue
        spec = {**base, **over}
        tag = f"{name:20s} {int(spec['st']):>2d} {spec['dev']:>3d} {spec['cuda'] if device == 'cuda' else '-':5s}"
        if kind in ("dlopen", "runner") and not info["so"]:
            say(f"{tag} skipped (no .so in the package)")
            continue
        if left() < EST[kind]:
            say(f"{tag} skipped (budget: {left():.0f} s left)")
            continue
        before = tmp_dirs()
        rc, out, err, secs = run_child(spec, min(args.timeout, max(left(), 5)), env)
        res, last = verdict(rc, out, err)
        results[name] = (res, spec, env)
        for line in re.findall(r"^FACT (.+)$", out, re.M):
            say(f"  fact: {line}")
        note = leftovers(before, args.keep)
        if res == "ok" and note:
            leaked += 1  # the loader's destructor did not run at interpreter exit
            note = ""
        say(f"{tag} {res} ({secs:.1f} s, last step {last})" + (f"  [left {note}]" if note else ""))

    prefer = [n for n, _, _, _ in variants if n not in ("dlopen-extracted", "hrm-runner")]
    prefer = [n for n in prefer if n != "runner-extracted"] + ["runner-extracted"]  # the loaders first
    ok = [n for n in prefer if results.get(n, ("",))[0] == "ok"]
    if (not only or "run" in only) and io and ok:
        name = ok[0]
        spec = {**results[name][1], "run": True, "facts": False}
        tag = f"{'run (' + name + ')':20s} {int(spec['st']):>2d} {spec['dev']:>3d} {spec['cuda'] if device == 'cuda' else '-':5s}"
        if left() >= EST["run"]:
            before = tmp_dirs()
            rc, out, err, secs = run_child(spec, min(args.timeout, max(left(), 5)), results[name][2])
            res, last = verdict(rc, out, err)
            leaked += bool(leftovers(before, args.keep)) and res == "ok"
            say(f"{tag} {res} ({secs:.1f} s, last step {last})")
            for line in re.findall(r"^RAN (.+)$", out, re.M):
                say(f"  ran {line}")
        else:
            say(f"{tag} skipped (budget)")
    elif not io:
        say("run                  skipped (no <package>.manifest.json with 'io' beside the package)")

    crashed = [n for n, (r, _, _) in results.items() if r.startswith("SIG") or r.startswith("signal")]
    if crashed and not args.no_forensics:
        pick = "tool-loader" if "tool-loader" in crashed else crashed[0]
        spec, env = results[pick][1], results[pick][2]
        before = tmp_dirs()
        if left() >= 20:
            _, out, err, secs = run_child(spec, min(30, left()), {**env, "LD_DEBUG": "files"})
            lines = [ln.strip() for ln in err.splitlines() if re.match(r"\s*\d+:\s", ln)]
            say(f"LD_DEBUG=files rerun of {pick} ({secs:.0f} s): last loader lines before it died:")
            for ln in lines[-8:]:
                say(f"  {ln[:200]}")
        gdb = shutil.which("gdb")
        if gdb and left() >= 30:
            wrap = [gdb, "-q", "-nx", "-batch", "-iex", "set debuginfod enabled off", "-ex", "set pagination off",
                    "-ex", "run", "-ex", "bt 30", "--args"]
            _, out, err, secs = run_child(spec, min(90, left()), {**env, "DEBUGINFOD_URLS": ""}, wrap=wrap)
            text = out + "\n" + err
            frames = [ln for ln in text.splitlines() if re.match(r"#\d+\s", ln) or "received signal" in ln]
            say(f"gdb rerun of {pick} ({secs:.0f} s): native backtrace:")
            for ln in frames[:32] or ["  (no backtrace: the rerun did not crash under gdb, or gdb timed out)"]:
                say(f"  {ln[:220]}")
        elif not gdb:
            say("gdb not installed: no native backtrace (apt-get install gdb, then rerun with --only tool-loader)")
        leftovers(before, args.keep)

    if args.control and device == "cuda":
        ctrl = str(work / "control.pt2")
        spec = {**base, "method": "control", "pkg": ctrl, "run": True, "io": [
            {"name": "x", "is_input": True, "dtype": "float32", "shape": [-1, 128]},
            {"name": "ids", "is_input": True, "dtype": "int32", "shape": [-1]}], "batches": [1, 1024]}
        if left() >= 60:
            rc, out, err, secs = run_child(spec, min(180, left()), {})
            res, last = verdict(rc, out, err)
            say(f"{'control-inprocess':20s} {1:>2d} {i:>3d} tool  {res} ({secs:.1f} s, last step {last})")
            if os.path.isfile(ctrl) and left() >= 15:
                before = tmp_dirs()
                rc, out, err, secs = run_child({**spec, "method": "api"}, min(args.timeout, left()), {})
                res, last = verdict(rc, out, err)
                note = leftovers(before, args.keep)
                say(f"{'control-fresh':20s} {1:>2d} {i:>3d} tool  {res} ({secs:.1f} s, last step {last})"
                    + (f"  [left {note}]" if note else ""))
        else:
            say("control              skipped (budget)")

    if leaked:
        say(f"note: {leaked} child(ren) that loaded fine left their /tmp extraction folder behind at exit")
    say(f"done in {time.perf_counter() - t0:.0f} s" + (f"; temp folder kept: {work}" if args.keep else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    say("read: tool-api & tool-loader die => the C++ loader, not the Python pre-steps; dlopen-extracted dies => "
        "linking/static init of the .so (see elf NEEDED/RPATH); dlopen ok but runner-extracted dies => model "
        "container creation (weights/CUDA); runner-extracted ok but loaders die => zip extraction/metadata; an "
        "option variant ok => that option avoids it; loader-warm ok but tool-loader dies => process-state dependent; "
        "control-fresh dies too => not this package (torch/driver/host).")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
    else:
        sys.exit(main())
