#!/usr/bin/env python3
"""Where does loading an AOTInductor (.pt2) package crash? One line per load variant.

    python scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py ENGINE.pt2 [--device-index 0] [--budget 170] [--control]
        [--jobs N] [--repeat K] [--fast-first] [--only a,b,c]

Needs only the standard library here and torch in the children. The parent never imports
torch: every variant runs in its own fresh `python scripts/diagnostics/2026-11-aoti-load/aoti_load_child.py` (subprocess in its
own process group, never fork), so a segfault costs only that child. Printed per variant, in the
order below: ok / SIGSEGV (or other signal) / error / timeout, the seconds it took and the last
step the child reached (import, import-<module>, cuda-init, cuda-op, warm, load, loaded, run-bN);
with --repeat K each variant runs K times (`ok 2/3, SIGSEGV 1/3`), with --jobs N up to N children
run at once (a load is mostly single-threaded host work). A variant not started before the budget
ends is `skipped (budget)`. Variants:

  tool-api            torch._inductor.aoti_load_package(run_single_threaded=True, device_index=N)
                      after TorchMemory-like CUDA setup + torch.cuda.init() + set_device(N):
                      the load `hrm-deploy verify/solve` did before the child-process probe
  dlopen-extracted    the package's .so, unzipped here, dlopen'ed (RTLD_NOW|RTLD_LOCAL) only:
                      dynamic linking + static initialisers, no model container
  runner-extracted    AOTIModelContainerRunnerCuda on the unzipped .so + cubin dir: container
                      creation (cudaSetDevice, weights cudaMalloc/cudaMemcpy) without the zip loader
  hrm-runner          hrm-deploy's own runner (open_runner + activate + one batch-1 call), its
                      probe skipped: today's in-process load (private unzip folder, TF32 setting)
  api-cli-imports     tool-api after importing what `hrm-deploy verify` imports first (CLI_IMPORTS:
                      the CLI, verify, the reference backend, onnxruntime, onnx, where installed)
  runner-cli-imports  runner-extracted after all of CLI_IMPORTS (a cheap api-cli-imports)
  runner-import-M     runner-extracted after importing one module M of CLI_IMPORTS: M = ort
                      (onnxruntime), onnx, cli, verify, reference (hrm_deploy.backends.reference)
  runner-import-inductor / runner-import-dynamo
                      runner-extracted after `import torch._inductor` / `import torch._dynamo`
  runner-amx / api-amx
                      runner-extracted / tool-api after torch.cpu._init_amx() (the AMX tile-data
                      permission onnxruntime's import asks for; hrm-deploy's loader asks for it too)
  runner-amx-first    runner-extracted with the AMX permission asked before CUDA is initialised
  runner-preload-L    (--ort-libs) runner-extracted after one library L that `import onnxruntime`
                      maps (a /proc/self/maps diff in a child) was loaded RTLD_GLOBAL, one each
  runner-cuda-ctx     runner-extracted after a real CUDA op (ones(1).sum().item() + synchronize):
                      a primary context that has run a kernel before the load
  api-import-M        tool-api after importing one module M of CLI_IMPORTS (M as above)
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
--cause runs only the variants that decide the cause (CAUSE_VARIANTS: control = runner-extracted,
the permission before and after CUDA initialisation, onnxruntime's import; with --ort-libs each
library it maps). Every child prints its permission mask (ARCH_GET_XCOMP_PERM) right before the
load; --fault-report compiles fault_report.c with cc and preloads it into every child: a child that
dies prints the faulting library + offset and a native backtrace (no gdb needed).
--fast-first runs (and prints) the variants by estimated cost: dlopen and runner-* first.
Then, if a variant died by a signal and time is left: the native backtrace of a rerun under gdb
(if gdb is installed) and the last dynamic-loader lines (LD_DEBUG=files) before the crash.
--control also AOT-compiles a tiny plain-torch CUDA model (dynamic batch 1..1024), loads it in
the compiling process and then in a fresh one (~60-90 s more): crash there too => not specific
to this package. The last line, `read:`, states what the results imply (each variant compared
with the one it adds one thing to; a variant that both crashed and loaded => non-deterministic).

Extraction folders that crashed children leave in /tmp (the C++ loader's mkdtemp: /tmp/XXXXXX in
the 2.11-era loader, /tmp/aotinductor_XXXXXX in later ones) are reported (how far extraction got)
and removed unless --keep (with --jobs > 1: once all children have ended, not per variant).
Set AOTI_MATRIX_CHILD to a command to replace `python scripts/diagnostics/2026-11-aoti-load/aoti_load_child.py` (tests use a
fake child); the JSON spec is its last argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from aoti_matrix_lib import (
    CAUSE_VARIANTS,
    EST,
    PRELOAD_PREFIX,
    Outcome,
    Variant,
    build_fault_report,
    fault_env,
    leftovers,
    ort_mapped_libraries,
    preload_variants,
    read_line,
    run_child,
    run_matrix,
    say,
    state,
    summary,
    tmp_dirs,
    variant_table,
    verdict,
)


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
        say(
            f"package  {pkg} ({pkg.stat().st_size / 2**20:.1f} MiB, mode {oct(pkg.stat().st_mode & 0o777)}), "
            f"archive root '{info['prefix']}/', {len(names)} entries, CRC {'ok' if bad is None else 'BAD: ' + bad}"
        )
        say(
            f"model    {len(model)} files {dict(sorted(kinds.items()))}; .so: "
            + ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in sos)
        )
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("package")
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--budget", type=float, default=170.0, help="seconds for everything (default 170)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per child (default 90)")
    ap.add_argument("--jobs", type=int, default=1, help="children run at once (default 1)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each variant (default 1)")
    ap.add_argument("--fast-first", action="store_true", help="cheapest variants first (dlopen, runner-*)")
    ap.add_argument("--control", action="store_true", help="also compile+load a tiny plain-torch CUDA package")
    ap.add_argument("--only", default="", help="comma-separated variant names to run (and 'run')")
    ap.add_argument("--no-forensics", action="store_true", help="skip the gdb / LD_DEBUG reruns")
    ap.add_argument("--keep", action="store_true", help="keep temp folders and crashed children's /tmp/XXXXXX")
    ap.add_argument("--fault-report", action="store_true", help="preload fault_report.c (compiled here with cc)")
    ap.add_argument("--ort-libs", action="store_true", help="add runner-preload-* per library onnxruntime maps")
    ap.add_argument("--cause", action="store_true", help="only the variants that decide the cause (CAUSE_VARIANTS)")
    return ap.parse_args(argv)


def forensics(pick: str, spec: dict, env: dict, left, logs: Path, keep: bool) -> None:
    """LD_DEBUG=files and gdb reruns of a variant that died by a signal, as far as time allows."""
    before = tmp_dirs()
    if left() >= 20:
        _, out, err, secs = run_child(spec, min(30, left()), logs, {**env, "LD_DEBUG": "files"})
        lines = [ln.strip() for ln in err.splitlines() if re.match(r"\s*\d+:\s", ln)]
        say(f"LD_DEBUG=files rerun of {pick} ({secs:.0f} s): last loader lines before it died:")
        for ln in lines[-8:]:
            say(f"  {ln[:200]}")
    gdb = shutil.which("gdb")
    if gdb and left() >= 30:
        wrap = [
            gdb,
            "-q",
            "-nx",
            "-batch",
            "-iex",
            "set debuginfod enabled off",
            "-ex",
            "set pagination off",
            "-ex",
            "run",
            "-ex",
            "bt 30",
            "--args",
        ]
        _, out, err, secs = run_child(spec, min(90, left()), logs, {**env, "DEBUGINFOD_URLS": ""}, wrap=wrap)
        frames = [ln for ln in (out + "\n" + err).splitlines() if re.match(r"#\d+\s", ln) or "received signal" in ln]
        say(f"gdb rerun of {pick} ({secs:.0f} s): native backtrace:")
        for ln in frames[:32] or ["  (no backtrace: the rerun did not crash under gdb, or gdb timed out)"]:
            say(f"  {ln[:220]}")
    elif not gdb:
        say("gdb not installed: no native backtrace (apt-get install gdb, then rerun with --only tool-loader)")
    leftovers(before, keep)


def control(base: dict, work: Path, logs: Path, left, timeout: float, keep: bool, runs: dict) -> None:
    """A tiny plain-torch CUDA package compiled, loaded in the compiling process, then in a fresh one."""
    ctrl, i = str(work / "control.pt2"), base["index"]
    spec = {
        **base,
        "method": "control",
        "pkg": ctrl,
        "run": True,
        "batches": [1, 1024],
        "io": [
            {"name": "x", "is_input": True, "dtype": "float32", "shape": [-1, 128]},
            {"name": "ids", "is_input": True, "dtype": "int32", "shape": [-1]},
        ],
    }
    if left() < 60:
        say("control              skipped (budget)")
        return
    for name, over, limit in (("control-inprocess", {}, 180.0), ("control-fresh", {"method": "api"}, timeout)):
        if name == "control-fresh" and not (os.path.isfile(ctrl) and left() >= 15):
            return
        before = tmp_dirs()
        rc, out, err, secs = run_child({**spec, **over}, min(limit, left()), logs)
        res, last = verdict(rc, out, err)
        runs[name] = [Outcome(res, last, secs)]
        note = leftovers(before, keep) if name == "control-fresh" else ""
        say(
            f"{name:24s} {1:>2d} {i:>3d} tool  {res} ({secs:.1f} s, last step {last})"
            + (f"  [left {note}]" if note else "")
        )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - t0)  # noqa: E731
    known = [v.name for v in variant_table("")] + ["run"]
    only = [s.strip() for s in args.only.split(",") if s.strip()] or (CAUSE_VARIANTS if args.cause else [])
    if [s for s in only if s not in known and not s.startswith(PRELOAD_PREFIX)]:
        say(f"--only: unknown variant {', '.join(s for s in only if s not in known)}; known: {', '.join(known)}")
        return 2
    if args.jobs < 1 or args.repeat < 1:
        say(f"--jobs {args.jobs} / --repeat {args.repeat}: both must be at least 1")
        return 2
    pkg = Path(args.package).resolve()
    if not pkg.is_file():
        say(f"{pkg}: no such file")
        return 2
    work = Path(tempfile.mkdtemp(prefix="aoti-matrix-"))
    try:
        return matrix(args, pkg, work, left, only)
    finally:
        say(f"done in {time.perf_counter() - t0:.0f} s" + (f"; temp folder kept: {work}" if args.keep else ""))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def matrix(args: argparse.Namespace, pkg: Path, work: Path, left, only: list[str]) -> int:
    """The whole run after the arguments are checked (long: the steps share their results)."""
    usage = shutil.disk_usage("/tmp")
    litter = [d for d in tmp_dirs() if any("aotinductor" in str(p) for p in Path(d).rglob("*.so"))]
    say(
        f"/tmp     {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB; "
        f"{len(litter)} unzip folder(s) of earlier loads left there"
    )
    info = inspect_package(pkg, work / "x")
    device = info["metadata"].get("AOTI_DEVICE_KEY", "cuda")
    manifest = pkg.with_name(pkg.name + ".manifest.json")
    io, batches = None, [1]
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        io = m.get("io")
        batches = sorted({1, int(m.get("profile_shapes", {}).get("batch", [1, 1])[-1])})
        say(
            f"manifest io: {len(io or [])} tensors, batch profile -> run at {batches}; "
            f"build machine {m.get('build_machine')}, max_batch {m.get('config', {}).get('max_batch')}"
        )
    i = args.device_index
    base = {
        "pkg": str(pkg),
        "so": info["so"],
        "cubin_dir": info["cubin_dir"],
        "index": i,
        "device": device,
        "cuda": "tool",
        "st": True,
        "dev": i if device == "cuda" else -1,
        "io": io,
        "batches": batches,
    }
    table = variant_table(str(work))
    if args.ort_libs:
        libraries = ort_mapped_libraries()
        say(f"onnxruntime's import maps {len(libraries)} libraries: {' '.join(os.path.basename(p) for p in libraries)}")
        extra = preload_variants(libraries)
        table += extra
        only = only + [v.name for v in extra] if only else only
    report = build_fault_report(work) if args.fault_report else None
    if report:
        say(f"fault report: {report} preloaded into every child (faulting library + offset, backtrace)")
        table = [
            dataclasses.replace(v, env={**v.env, **fault_env(report)}, over={**v.over, "fault_report": True})
            for v in table
        ]
    if device != "cuda":
        say(f"(a {device} package: CUDA steps are skipped; the matrix still exercises the loader paths)")
        table = [v for v in table if v.kind != "warm"]
    chosen = [v for v in table if not only or v.name in only]
    if args.fast_first:
        chosen.sort(key=lambda v: EST[v.kind])  # stable: the default order within a cost class
    tag = lambda name, s: f"{name:24s} {int(s['st']):>2d} {s['dev']:>3d} {s['cuda'] if device == 'cuda' else '-':5s}"  # noqa: E731
    say(
        f"{'variant':24s} {'st':>2s} {'dev':>3s} {'cuda':5s} result (seconds, last step)"
        + (f"; {args.repeat} runs each" if args.repeat > 1 else "")
        + (f"; {args.jobs} at once" if args.jobs > 1 else "")
    )
    todo = []
    for v in chosen:
        if v.kind in ("dlopen", "runner") and not info["so"]:
            say(f"{tag(v.name, {**base, **v.over})} skipped (no .so in the package)")
        else:
            todo.append((v, {**base, **v.over, "name": v.name}))

    def line(v: Variant, spec: dict, runs: list, skipped: int, left_at: float, note: str) -> None:
        for fact in dict.fromkeys(f for r in runs for f in re.findall(r"^FACT (.+)$", r.out, re.M)):
            say(f"  fact: {fact}")
        say(f"{tag(v.name, spec)} {summary(runs, skipped, left_at)}" + (f"  [left {note}]" if note else ""))

    logs = work / "logs"
    logs.mkdir()
    runs = run_matrix(todo, args.jobs, args.repeat, left, args.timeout, logs, args.keep, line)
    specs = {v.name: (s, v.env) for v, s in todo}
    st = {n: state(r) for n, r in runs.items() if r}
    prefer = [n for n, _ in specs.items() if n.startswith(("tool-", "api-", "loader-"))] + ["runner-extracted"]
    ok = [n for n in prefer if st.get(n) == "ok"]
    if (not only or "run" in only) and io and ok:
        spec = {**specs[ok[0]][0], "run": True, "facts": False}
        if left() >= EST["run"]:
            rc, out, err, secs = run_child(spec, min(args.timeout, max(left(), 5)), logs, specs[ok[0]][1])
            res, last = verdict(rc, out, err)
            say(f"{tag('run (' + ok[0] + ')', spec)} {res} ({secs:.1f} s, last step {last})")
            for ran in re.findall(r"^RAN (.+)$", out, re.M):
                say(f"  ran {ran}")
        else:
            say(f"{tag('run (' + ok[0] + ')', spec)} skipped (budget)")
    elif not io:
        say(f"{'run':24s} skipped (no <package>.manifest.json with 'io' beside the package)")
    crashed = [n for n, s in st.items() if s in ("dies", "flaky")]
    if crashed and not args.no_forensics:
        pick = "tool-loader" if "tool-loader" in crashed else crashed[0]
        forensics(pick, *specs[pick], left, logs, args.keep)
    if args.control and device == "cuda":
        control(base, work, logs, left, args.timeout, args.keep, runs)
    say(read_line({n: state(r) for n, r in runs.items() if r}, runs, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
