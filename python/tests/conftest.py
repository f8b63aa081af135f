"""Fixtures of the package's tests: hosts over the test plugins (test_processes, with a root each
test makes) and over local_docker on the real daemon (image sbx-busybox:latest from
scripts/docker-up.sh), and the checks that nothing is left behind: no sandbox (a directory under
the root, a labelled container), no thread, no file descriptor, after every test.

The build registers these as the ctest python_test (python/CMakeLists.txt), with PYTHONPATH at
the build's package and SBX_TEST_PLUGIN_DIR, SBX_BAD_PLUGIN_DIR and SBX_PLUGIN_DIR set."""

from __future__ import annotations

import gc
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sbx

TEST_PLUGIN_DIR = os.environ.get("SBX_TEST_PLUGIN_DIR", "")
BAD_PLUGIN_DIR = os.environ.get("SBX_BAD_PLUGIN_DIR", "")
PLUGIN_DIR = os.environ.get("SBX_PLUGIN_DIR", "")
IMAGE = "sbx-busybox:latest"


# The host library's process-wide threads, started once and kept for the process's life (core:
# the deadline timer and the janitor that destroys what plugins released inside callbacks).
PROCESS_WIDE_THREADS = {"sbx-deadlines", "sbx-janitor"}


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def thread_names() -> list[str]:
    """The names of the process's threads, but the host library's process-wide ones."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except FileNotFoundError:  # it ended while we looked
            continue
        if name not in PROCESS_WIDE_THREADS:
            names.append(name)
    return sorted(names)


def native_threads() -> int:
    return len(thread_names())


def settled(check: Callable[[], bool], within_s: float = 10.0) -> bool:
    """Whether `check` holds within `within_s`: a provider's threads end once the host's janitor
    thread has destroyed it, just after the host is dropped (nothing to wait on from here but
    the threads themselves)."""
    until = time.monotonic() + within_s
    while not check():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """After every test: no thread and no file descriptor more than before it (the sandboxes:
    the provider fixtures)."""
    gc.collect()
    threads, fds = native_threads(), open_fds()
    yield
    gc.collect()
    assert settled(lambda: native_threads() <= threads), (
        f"the test left {native_threads() - threads} thread(s) running: {thread_names()}"
    )
    assert settled(lambda: open_fds() <= fds), f"the test left descriptors open: {open_fds() - fds}"


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


def let_go(request: pytest.FixtureRequest) -> None:
    """Drops pytest's own reference to the fixture's value (kept in the test item until the
    whole teardown ends), so that the host goes now and nothing_left_behind sees it gone."""
    request.node.funcargs.pop(request.fixturename, None)
    gc.collect()


@pytest.fixture
def processes(request: pytest.FixtureRequest, root: Path) -> Iterator[sbx.Provider]:
    """test_processes through a Host of its own; after the test, no sandbox directory is left."""
    host = sbx.Host(
        {"providers": {"p": {"plugin": "test_processes", "config": {"root": str(root)}}}},
        plugin_dirs=[TEST_PLUGIN_DIR],
        use_default_plugin_dirs=False,
    )
    yield host.provider("p")
    del host
    let_go(request)
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
    let_go(request)
    assert docker_sandboxes(label) == [], "a container was left behind"
