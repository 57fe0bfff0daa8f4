"""One local Ray instance (127.0.0.1, 2 CPUs) for the Ray tests of a module, and a check that no Ray
process outlives it."""

from __future__ import annotations

import subprocess

import pytest


def ray_processes() -> list[str]:
    """Command lines of the Ray processes running on this machine (raylet, GCS, workers); exited ones
    waiting to be reaped (``<defunct>``: a container whose first process reaps no orphans) are not running."""
    done = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=False)
    names = ("raylet", "gcs_server", "ray::")
    return [line for line in done.stdout.splitlines() if any(n in line for n in names) and "<defunct>" not in line]


@pytest.fixture(scope="module")
def ray_cluster():
    """``ray``, initialised for the module; shut down after it, leaving no Ray process behind."""
    ray = pytest.importorskip("ray", reason="pip install -e '.[scale]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()
    assert not ray_processes(), ray_processes()
