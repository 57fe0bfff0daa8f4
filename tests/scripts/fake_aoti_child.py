"""A stand-in for scripts/diagnostics/2026-11-aoti-load/aoti_load_child.py (no torch, no GPU): it behaves as $FAKE_AOTI_PLAN says.

The plan is JSON {variant name: actions}; actions is a comma list, one per attempt (the last one
repeats), each a '+' chain of: ok, segv (dies by SIGSEGV after `STEP load`), error, hang,
sleep:SECONDS, barrier:N (wait, up to 10 s, until N children have started). Each child writes
its start/end times and pid to $FAKE_AOTI_LOG/<name>-<attempt>.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

spec = json.loads(sys.argv[-1])
name, attempt = spec.get("name", "rerun"), spec.get("attempt", 0)  # reruns: no attempt
actions = json.loads(os.environ.get("FAKE_AOTI_PLAN", "{}")).get(name, "ok").split(",")
steps = actions[min(attempt, len(actions) - 1)].split("+")
log = Path(os.environ["FAKE_AOTI_LOG"])
start = time.time()
(log / f"arrive-{name}-{attempt}").touch()
if os.environ.get("FAKE_AOTI_ECHO_ENV"):  # what the parent gave this child
    seen = {k: os.environ.get(k) for k in ("LD_PRELOAD", "PYTHONFAULTHANDLER")}
    (log / f"env-{name}-{attempt}.json").write_text(
        json.dumps({**seen, "fault_report": spec.get("fault_report", False)})
    )
record = log / f"{name}-{attempt}.json"
record.write_text(json.dumps({"pid": os.getpid(), "start": start}))
print("STEP import", flush=True)
print("STEP load", flush=True)
for step in steps:
    kind, _, arg = step.partition(":")
    if kind == "sleep":
        time.sleep(float(arg))
    elif kind == "hang":
        time.sleep(60)
    elif kind == "barrier":
        deadline = time.time() + 10
        while len(list(log.glob("arrive-*"))) < int(arg):
            if time.time() > deadline:
                print(f"ERROR TimeoutError: barrier {arg} not reached", flush=True)
                sys.exit(3)
            time.sleep(0.02)
    record.write_text(json.dumps({"pid": os.getpid(), "start": start, "end": time.time()}))
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "error":
        print("ERROR RuntimeError: boom", flush=True)
        sys.exit(3)
print("STEP loaded", flush=True)
print("RESULT ok", flush=True)
