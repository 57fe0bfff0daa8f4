"""bench on CPU runners, its statistics, Jetson detection/tegrastats parsing, and --host over a real sshd."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hrm_deploy.bench.jetson import _clocks_pinned, parse_tegrastats, summarize
from hrm_deploy.bench.run import BenchConfig, bench
from hrm_deploy.bench.stats import latency_stats
from hrm_deploy.errors import ConfigError
from hrm_deploy.system import jetson_model

NANO = (
    "RAM 2785/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) CPU [2%@1510,1%@1510,0%@1510,0%@1510,off,off] "
    "EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] NVDEC off NVJPG off cpu@48.5C soc2@47.4C soc0@47.9C gpu@48.0C "
    "tj@49.2C soc1@48.5C VDD_IN 4820mW/4820mW VDD_CPU_GPU_CV 561mW/561mW VDD_SOC 1402mW/1402mW"
)
NX = (
    "04-12-2025 10:01:02 RAM 5120/15656MB (lfb 12x4MB) SWAP 0/7828MB (cached 0MB) CPU [35%@1984,30%@1984,"
    "28%@1984,40%@1984,22%@1984,25%@1984,20%@1984,31%@1984] GR3D_FREQ 97%@[918,0] cpu@55.1C soc2@52.3C "
    "gpu@57.8C tj@58.0C VDD_IN 14120mW/13890mW VDD_CPU_GPU_CV 7350mW/7101mW VDD_SOC 2810mW/2790mW"
)
AGX = (
    "RAM 9234/30536MB (lfb 5216x4MB) SWAP 0/15268MB (cached 0MB) CPU [5%@2201,3%@2201,1%@2201,0%@2201,"
    "2%@2201,4%@2201,0%@2201,1%@2201,off,off,off,off] GR3D_FREQ 99%@[1300,1300] cpu@52.6C tboard@40C "
    "soc2@49.1C tdiode@41.5C soc0@49.8C gpu@55.3C tj@55.3C soc1@48.9C VDD_GPU_SOC 12785mW/12601mW "
    "VDD_CPU_CV 1998mW/1987mW VIN_SYS_5V0 6012mW/5987mW VDDQ_VDD2_1V8AO 1203mW/1199mW"
)


def test_latency_stats():
    stats = latency_stats([0.001, 0.002, 0.003, 0.004, 0.010], batch=8)
    assert stats["median_ms"] == pytest.approx(3.0) and stats["min_ms"] == pytest.approx(1.0)
    assert stats["p90_ms"] == pytest.approx(7.6) and stats["puzzles_per_s"] == pytest.approx(8000 / 3)
    with pytest.raises(ValueError):
        latency_stats([], 1)


def test_tegrastats_lines_of_nano_nx_agx():
    nano, nx, agx = parse_tegrastats(NANO), parse_tegrastats(NX), parse_tegrastats(AGX)
    assert nano["ram_used_mb"] == 2785 and nano["gpu_freq_mhz"] == 305 and nano["power_mw"]["VDD_IN"] == 4820
    assert nano["power_mw"]["VDD_CPU_GPU_CV"] == 561 and nano["temps_c"]["tj"] == 49.2
    assert nx["gpu_load_pct"] == 97 and nx["gpu_freq_mhz"] == 918 and nx["power_mw"]["VDD_IN"] == 14120
    assert agx["power_mw"]["VDD_GPU_SOC"] == 12785 and agx["temps_c"]["tboard"] == 40.0
    summary = summarize([nano, nx])
    assert summary["VDD_IN_mean_mw"] == (4820 + 14120) / 2 and summary["VDD_IN_peak_mw"] == 14120
    assert summary["temp_peak_c"] == 58.0


def test_jetson_detection(tmp_path):
    model, release = tmp_path / "model", tmp_path / "nv_tegra_release"
    assert jetson_model(model, release) is None
    model.write_bytes(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00")
    assert "Orin Nano" in jetson_model(model, release)
    model.write_bytes(b"Raspberry Pi 5\x00")
    release.write_text("# R36 (release), REVISION: 4.3\n")
    assert jetson_model(model, release) == "NVIDIA Jetson (model unknown)"
    assert _clocks_pinned("GPU MinFreq=306000000 MaxFreq=1020000000 CurrentFreq=1020000000")
    assert not _clocks_pinned("GPU MinFreq=306000000 MaxFreq=1020000000 CurrentFreq=306000000")


@pytest.mark.slow
def test_bench_cpu_runners_table_json_plot(tiny_onnx, tmp_path):
    out = tmp_path / "bench"
    report = bench(
        [str(tiny_onnx.unrolled), str(tiny_onnx.step)],
        BenchConfig(data=tiny_onnx.data, batches=(1, 4), iters=3, warmup=1, accuracy_samples=32, out_dir=str(out)),
    )
    rows = {Path(r["artifact"]).name: r for r in report["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()) and rows["sudoku-tiny.pt"]["reference"]
    assert rows["tiny.onnx"]["batches"]["4"]["speedup_vs_reference"] > 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["rows"][0]["accuracy"]["count"] == 32
    assert "| Format |" in (out / "report.md").read_text()
    # Sudoku data: no ARC tasks/s, in the report or its table
    assert "arc" not in saved and not any("arc" in row for row in saved["rows"])
    assert "ARC tasks/s" not in (out / "report.md").read_text()
    if report.get("plot"):
        assert (out / "latency.png").stat().st_size > 1000


def test_target_jetson_off_jetson_refuses(tiny_onnx, tmp_path):
    if jetson_model() is not None:
        pytest.skip("checks the refusal off a Jetson; this is a Jetson, where the on-device bench tests apply")
    with pytest.raises(ConfigError, match="not a Jetson"):
        bench([str(tiny_onnx.unrolled)], BenchConfig(data=tiny_onnx.data, target="jetson", out_dir=str(tmp_path)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_sshd(tmp_path):
    """A real OpenSSH server on 127.0.0.1 for this user, key login only."""
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install openssh-server)")
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nPermitRootLogin yes\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True) if os.geteuid() == 0 else None
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE)
    options = [
        "-o",
        f"Port={port}",
        "-o",
        f"IdentityFile={d / 'client_key'}",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        f"UserKnownHostsFile={d / 'known_hosts'}",
        "-o",
        "IdentitiesOnly=yes",
    ]
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    for _ in range(50):
        probe = subprocess.run(
            ["ssh", "-o", "BatchMode=yes", *options, f"{user}@127.0.0.1", "true"], capture_output=True
        )
        if probe.returncode == 0:
            break
        if proc.poll() is not None:
            pytest.skip(f"sshd could not start: {proc.stderr.read().decode()[-300:]}")
        time.sleep(0.2)
    else:
        proc.terminate()
        pytest.skip("sshd did not accept a key login")
    yield f"{user}@127.0.0.1", options
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.slow
def test_bench_over_ssh_host(local_sshd, tiny_onnx, tmp_path, capsys):
    from hrm_deploy.bench.remote import bench_remote

    host, options = local_sshd
    config = BenchConfig(
        data=tiny_onnx.data,
        batches=(1,),
        iters=2,
        warmup=1,
        accuracy_samples=16,
        out_dir=str(tmp_path / "remote-report"),
    )
    report = bench_remote(host, [str(tiny_onnx.unrolled)], config, remote_python=sys.executable, ssh_options=options)
    assert report["remote_host"] == host and [r["status"] for r in report["rows"]] == ["ok", "ok"]
    assert (tmp_path / "remote-report" / "report.md").is_file()
    err = capsys.readouterr().err  # the upload and the remote run show as stages (a log: start and done lines)
    assert "copying 4 files" in err and f"bench on {host}" in err and err.count("done in") >= 2


def test_bench_over_ssh_unreachable_and_bad_host_are_clear(tiny_onnx, tmp_path):
    from hrm_deploy.bench.remote import RemoteError, bench_remote

    config = BenchConfig(data=tiny_onnx.data, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="USER@HOST"):
        bench_remote("me@host;rm -rf /", [str(tiny_onnx.unrolled)], config)
    with pytest.raises(RemoteError, match="cannot reach"):
        bench_remote(
            "nobody@127.0.0.1",
            [str(tiny_onnx.unrolled)],
            config,
            ssh_options=["-o", f"Port={_free_port()}", "-o", "StrictHostKeyChecking=no"],
        )


def test_measure_reports_gpu_phases_when_the_runner_has_them(tiny_onnx):
    """The engine runner's CUDA-event phases (H2D / compute / D2H) reach the report."""
    import numpy as np

    from hrm_deploy.bench.run import _measure
    from hrm_deploy.data.examples import load_examples

    class FakeGpuRunner:
        name, precision, steps = "tensorrt", "fp16", 1

        def activate(self):
            self.calls = 0

        def infer(self, feeds):
            self.calls += 1
            self.last_timing = {"h2d_ms": 0.1, "compute_ms": 1.0 + self.calls, "d2h_ms": 0.2}
            n = len(feeds["inputs"])
            return {"logits": np.zeros((n, 81, 11), np.float32), "q_halt_logits": np.zeros((n, 1), np.float32)}

        def close(self):
            pass

    examples = load_examples(tiny_onnx.data, 8, split="test")
    row = _measure(FakeGpuRunner(), examples, BenchConfig(data=tiny_onnx.data, batches=(2,), iters=3, warmup=0))
    phases = row["batches"]["2"]["phases_median_ms"]
    assert phases["h2d_ms"] == 0.1 and phases["compute_ms"] == 4.0 and phases["d2h_ms"] == 0.2


class _SleepyRunner:
    """A runner whose every call takes ``seconds`` (sleeping), for the time-sized loop."""

    precision, steps, last_timing = "fp32", 1, None

    def __init__(self, seconds: float):
        self.seconds, self.calls = seconds, 0

    def activate(self):
        return self

    def infer(self, feeds):
        import numpy as np

        self.calls += 1
        time.sleep(self.seconds)
        n = len(feeds["inputs"])
        return {"logits": np.zeros((n, 81, 11), np.float32)}

    def close(self):
        pass


@pytest.mark.slow
def test_bench_is_sized_by_time_with_a_minimum_count_and_iters_forces_a_count(tiny_onnx):
    from hrm_deploy.bench.run import _measure, timing_rule
    from hrm_deploy.data.examples import load_examples

    examples = load_examples(tiny_onnx.data, 4, split="test")
    fast = _measure(_SleepyRunner(0.01), examples, BenchConfig(batches=(1,), warmup=0, duration_s=0.3), quiet=True)
    assert 15 <= fast["batches"]["1"]["iterations"] <= 31  # ~0.3 s of 10 ms calls, not a fixed count
    slow = _measure(_SleepyRunner(0.05), examples, BenchConfig(batches=(1,), warmup=0, duration_s=0.1), quiet=True)
    assert slow["batches"]["1"]["iterations"] == 10  # past the budget, still the minimum for percentiles
    forced = _measure(_SleepyRunner(0.001), examples, BenchConfig(batches=(1,), warmup=0, iters=3), quiet=True)
    assert forced["batches"]["1"]["iterations"] == 3
    assert timing_rule(BenchConfig()) == "timed for 10 s per artifact and batch (at least 10 calls)"
    assert "--iters" in timing_rule(BenchConfig(iters=5))
    with pytest.raises(ConfigError, match="--duration must be between"):
        BenchConfig(duration_s=0)


@pytest.mark.slow
def test_bench_report_states_its_time_budget(tiny_onnx, tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    out = tmp_path / "b"
    args = ["bench", str(tiny_onnx.unrolled), "--data", tiny_onnx.data, "--batch", "1", "--duration", "0.2"]
    result = CliRunner().invoke(app, [*args, "--no-reference", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["duration_s"] == 0.2 and report["config"]["iters"] is None
    assert "timed for 0.2 s per artifact and batch (at least 10 calls)" in (out / "report.md").read_text()
    assert report["rows"][0]["batches"]["1"]["iterations"] >= 10
