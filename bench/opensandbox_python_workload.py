"""The Python side of bench/opensandbox_vs_python: the official OpenSandbox Python SDK (PyPI
opensandbox 1.1.1, async API) running the benchmark's workload against an OpenSandbox server.

    opensandbox_python_workload.py --domain HOST:PORT [--image IMAGE] [--sandboxes S] [--execs N]

Workload (the same as the plugin side's): S sandboxes created concurrently, then each runs N
`echo hi` one after the other (stdout ["hi"], exit code 0 checked), the S sandboxes in parallel
(asyncio.gather), then all are killed and closed. Every sandbox created is killed, also when
something fails.

Prints one JSON line on stdout: this process's user+sys CPU (resource.getrusage(RUSAGE_SELF)
deltas) and wall time over the workload and over each phase, in ms. Interpreter start and imports
are outside the measurement; the Python and SDK versions ride along. On failure: {"error": "..."}
and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import pkgutil
import platform
import resource
import sys
import time
from datetime import timedelta

import opensandbox
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig


def import_everything():
    """Imports what the SDK would import lazily on its first create or command (its own modules,
    anyio's asyncio backend), so that no import falls inside the measurement."""
    for module in pkgutil.walk_packages(opensandbox.__path__, "opensandbox."):
        try:
            importlib.import_module(module.name)
        except Exception:  # noqa: BLE001 - optional parts (e.g. the redis pool store)
            pass
    importlib.import_module("anyio._backends._asyncio")


def cpu() -> tuple[float, float]:
    """This process's user and sys CPU so far, in ms."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime * 1000.0, usage.ru_stime * 1000.0


class Phases:
    """CPU and wall time of consecutive phases, from one starting point."""

    def __init__(self):
        self.figures: dict[str, float] = {}
        self.start_cpu = self.cpu = cpu()
        self.start_wall = self.wall = time.monotonic()

    def mark(self, name: str):
        now, wall = cpu(), time.monotonic()
        self.figures[f"{name}_cpu_ms"] = sum(now) - sum(self.cpu)
        self.figures[f"{name}_wall_ms"] = (wall - self.wall) * 1000.0
        self.cpu, self.wall = now, wall

    def total(self):
        self.figures["cpu_ms"] = sum(self.cpu) - sum(self.start_cpu)
        self.figures["user_cpu_ms"] = self.cpu[0] - self.start_cpu[0]
        self.figures["sys_cpu_ms"] = self.cpu[1] - self.start_cpu[1]
        self.figures["wall_ms"] = (self.wall - self.start_wall) * 1000.0


async def run_execs(sandbox: Sandbox, count: int):
    for _ in range(count):
        execution = await sandbox.commands.run("echo hi")
        stdout = [m.text for m in execution.logs.stdout]
        if execution.exit_code != 0 or stdout != ["hi"]:
            raise RuntimeError(f"echo hi in {sandbox.id}: exit code {execution.exit_code}, "
                               f"stdout {stdout}, error {execution.error}")


async def kill_all(sandboxes: list[Sandbox]) -> list[BaseException]:
    async def kill(sandbox: Sandbox):
        try:
            await sandbox.kill()
        finally:
            await sandbox.close()

    results = await asyncio.gather(*(kill(s) for s in sandboxes), return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


async def workload(args) -> dict:
    config = ConnectionConfig(domain=args.domain, request_timeout=timedelta(seconds=120))
    phases = Phases()
    created = await asyncio.gather(
        *(Sandbox.create(args.image, timeout=timedelta(minutes=30),
                         ready_timeout=timedelta(seconds=120), connection_config=config,
                         metadata={"bench": "opensandbox_vs_python"})
          for _ in range(args.sandboxes)),
        return_exceptions=True)
    sandboxes = [s for s in created if isinstance(s, Sandbox)]
    failures = [e for e in created if isinstance(e, BaseException)]
    try:
        if failures:
            raise RuntimeError(f"{len(failures)} of {args.sandboxes} creates failed: "
                               f"{failures[0]!r}")
        phases.mark("create")
        await asyncio.gather(*(run_execs(s, args.execs) for s in sandboxes))
        phases.mark("exec")
    finally:
        close_failures = await kill_all(sandboxes)
    if close_failures:
        raise RuntimeError(f"{len(close_failures)} kills failed: {close_failures[0]!r}")
    phases.mark("close")
    phases.total()
    return {"side": "python", "sandboxes": args.sandboxes, "execs": args.sandboxes * args.execs,
            "python": platform.python_version(), "sdk": importlib.metadata.version("opensandbox"),
            **phases.figures}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--domain", required=True)
    parser.add_argument("--image", default="sbx-busybox:latest")
    parser.add_argument("--sandboxes", type=int, default=4)
    parser.add_argument("--execs", type=int, default=50)
    args = parser.parse_args()
    import_everything()
    try:
        result = asyncio.run(workload(args))
    except Exception as e:  # noqa: BLE001 - reported to the benchmark as one line
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
