"""The load probe's cache: keyed by what a load depends on (host CPU, driver, fixes), never a
verdict about the package from a child killed from outside or out of memory or time, and sealed:
an edited, unsealed or moved verdict is probed again, so no cache edit can make the user's
process load in-process what no child of this user and host loaded."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from hrm_deploy.backends.torch import host, probe

KEY = {"sha256": "ab" * 32, "torch_version": "2.11", "device_label": "cuda H100"}
OK_CHILD = "print('PROBE step loading the package'); print('PROBE facts {\"amx_granted\": true}'); print('PROBE ok')"


@pytest.fixture
def child(monkeypatch):
    """The probe's child replaced by ``child.code`` (a Python snippet); ``child.runs`` counts them."""

    class Child:
        code = OK_CHILD
        runs = 0

    def command(spec):
        Child.runs += 1
        return [sys.executable, "-c", Child.code]

    monkeypatch.setattr(probe, "child_command", command)
    return Child


def _spec(**kw):
    io = [{"name": "inputs", "is_input": True, "dtype": "int32", "shape": [-1, 4]}]
    return probe.ProbeSpec("e.pt2", "cuda", 0, True, False, io, **kw)


def test_the_key_holds_the_host_cpu_the_driver_the_batch_and_the_capture(cache, monkeypatch):
    base = probe.cache_file(**KEY, spec=_spec(max_batch=64, capture=True))
    monkeypatch.setattr(host, "cpu_identity", lambda: {"model": "Xeon 8480", "flags_digest": "f1", "isa": []})
    monkeypatch.setattr(host, "driver_version", lambda: "550.54")
    one = probe.cache_file(**KEY, spec=_spec(max_batch=64, capture=True))
    monkeypatch.setattr(host, "cpu_identity", lambda: {"model": "Xeon 8480", "flags_digest": "f2", "isa": []})
    flags = probe.cache_file(**KEY, spec=_spec(max_batch=64, capture=True))
    monkeypatch.setattr(host, "driver_version", lambda: "560.28")
    driver = probe.cache_file(**KEY, spec=_spec(max_batch=64, capture=True))
    batch = probe.cache_file(**KEY, spec=_spec(max_batch=1024, capture=True))
    capture = probe.cache_file(**KEY, spec=_spec(max_batch=1024, capture=False))
    assert len({base, one, flags, driver, batch, capture}) == 6


def test_the_cpu_identity_reads_model_and_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel Xeon 8480+\nflags\t\t: fpu avx2 avx512f amx_tile\n")
    host.cpu_identity.cache_clear()
    got = host.cpu_identity(info)
    assert got["model"] == "Intel Xeon 8480+" and got["isa"] == ["avx2", "avx512f", "amx_tile"]
    other = tmp_path / "cpuinfo2"
    other.write_text("model name\t: Intel Xeon 8480+\nflags\t\t: fpu avx2 avx512f\n")
    assert host.cpu_identity(other)["flags_digest"] != got["flags_digest"]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "SIGTERM"),
        ("print('PROBE error OutOfMemoryError: CUDA out of memory'); raise SystemExit(3)", "OutOfMemoryError"),
        ("print('PROBE error RuntimeError: CUDA error: out of memory'); raise SystemExit(3)", "out of memory"),
    ],
)
def test_a_child_killed_from_outside_or_out_of_memory_is_never_cached(cache, child, code, words):
    child.code = "print('PROBE step running batch 1024', flush=True); " + code
    first = probe.probe_load(_spec(), **KEY)
    assert not first.ok and words in first.reason and "batch 1024" in first.reason
    assert not probe.probe_load(_spec(), **KEY).cached and child.runs == 2  # probed again
    assert not probe.cache_file(**KEY, spec=_spec()).exists()


def test_a_crash_is_cached_and_its_facts_recorded(cache, child):
    child.code = (
        'import os, signal; print(\'PROBE facts {"xcomp_mask_at_load": "0x202e7"}\', flush=True); '
        "os.kill(os.getpid(), signal.SIGSEGV)"
    )
    first = probe.probe_load(_spec(), **KEY)
    again = probe.probe_load(_spec(), **KEY)
    assert again.cached and not again.ok and child.runs == 1
    assert again.record()["xcomp_mask_at_load"] == "0x202e7" and "SIGSEGV" in again.record()["reason"]
    assert first.facts == again.facts


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("seal"),
        lambda d: d.update(seal="0" * 64),
        lambda d: d["verdict"].update(ok=True, reason=None),  # an attacker's "it loads"
        lambda d: d["key"].update(sha256="cd" * 32),  # moved to another package's key
    ],
    ids=["missing", "bad", "edited-ok", "other-key"],
)
def test_an_unsealed_or_edited_verdict_is_probed_again(cache, child, change):
    child.code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    path = probe.cache_file(**KEY, spec=_spec())
    assert not probe.probe_load(_spec(), **KEY).ok and path.exists()
    _edit(path, change)
    verdict = probe.probe_load(_spec(), **KEY)
    assert not verdict.cached and not verdict.ok and child.runs == 2  # the child decided, not the edit


def test_a_verdict_sealed_by_another_user_or_machine_is_not_honoured(cache, child, tmp_path, monkeypatch):
    path = probe.cache_file(**KEY, spec=_spec())
    assert probe.probe_load(_spec(), **KEY).ok and probe.probe_load(_spec(), **KEY).cached and child.runs == 1
    key_file = cache / probe.KEY_FOLDER / "key"
    assert key_file.stat().st_mode & 0o077 == 0  # readable by this user alone
    copied = path.read_text()
    key_file.write_bytes(b"x" * 32)  # another secret (a copied cache, another user's folder)
    key_file.chmod(0o600)
    path.write_text(copied)
    assert not probe.probe_load(_spec(), **KEY).cached and child.runs == 2
    key_file.chmod(0o644)  # a secret others can read is no secret: replaced, verdicts probed again
    assert not probe.probe_load(_spec(), **KEY).cached and child.runs == 3


def test_judge_reads_shell_signal_statuses_as_signals():
    verdict, final = probe.judge(128 + signal.SIGKILL, "PROBE step loading the package\n", "", 1.0)
    assert not verdict.ok and not final and "SIGKILL" in verdict.reason
    verdict, final = probe.judge(-signal.SIGILL, "", "", 1.0)
    assert final and "SIGILL (before importing torch)" in verdict.reason
