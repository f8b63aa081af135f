"""Fixtures of the package's tests: hosts over the test plugins (test_processes, with a root each
test makes) and over local_docker on the real daemon (image sbx-busybox:latest from
scripts/docker-up.sh), and the checks that nothing is left behind: no sandbox (a directory under
the root, a labelled container), no thread, no file descriptor.

The build registers these as the ctest python_test (python/CMakeLists.txt), with PYTHONPATH at
the build's package and SBX_TEST_PLUGIN_DIR, SBX_BAD_PLUGIN_DIR and SBX_PLUGIN_DIR set."""

from __future__ import annotations

import gc
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import sbx

TEST_PLUGIN_DIR = os.environ.get("SBX_TEST_PLUGIN_DIR", "")
BAD_PLUGIN_DIR = os.environ.get("SBX_BAD_PLUGIN_DIR", "")
PLUGIN_DIR = os.environ.get("SBX_PLUGIN_DIR", "")
IMAGE = "sbx-busybox:latest"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def docker_sandboxes(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=sbx.sandbox", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A directory of this test's own for test_processes' sandboxes (host processes)."""
    made = tmp_path / "sandboxes"
    made.mkdir()
    return made


@pytest.fixture
def processes(root: Path) -> Iterator[sbx.Provider]:
    """test_processes through a Host of its own; after the test, no sandbox directory is left
    (threads and descriptors: test_hosts_leave_no_thread_or_descriptor)."""
    host = sbx.Host(
        {"providers": {"p": {"plugin": "test_processes", "config": {"root": str(root)}}}},
        plugin_dirs=[TEST_PLUGIN_DIR],
        use_default_plugin_dirs=False,
    )
    yield host.provider("p")
    del host
    gc.collect()
    assert list(root.iterdir()) == [], "a sandbox was left behind"


@pytest.fixture
def docker(request: pytest.FixtureRequest) -> Iterator[sbx.Provider]:
    """local_docker (with its agent) through a Host of its own, its sandboxes labelled with the
    test's name; none is left after the test."""
    label = "sbx.python-test=" + request.node.name[:60].replace("[", "-").replace("]", "")
    host = sbx.Host(
        {"providers": {"docker": {"plugin": "local_docker"}}},
        plugin_dirs=[PLUGIN_DIR],
        use_default_plugin_dirs=False,
        labels=dict([label.split("=", 1)]),
    )
    yield host.provider("docker")
    del host
    gc.collect()
    assert docker_sandboxes(label) == [], "a container was left behind"
