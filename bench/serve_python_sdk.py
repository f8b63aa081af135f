"""`sbx serve` over local_docker, driven by the official OpenSandbox Python SDK (PyPI opensandbox,
async API, as tests/clients pins it): the latency of `commands.run("true")` with the agent (the
default) and with Docker exec (`"agent": false`), side by side in one run, samples interleaved.

    BUILD/clients/venv/bin/python bench/serve_python_sdk.py --sbx BUILD/bin/sbx \
        --plugin-dir BUILD/plugins [--samples N] [--image IMAGE] [--check]

The venv is the one tests/clients/setup.sh makes (`ctest -R clients` makes it too). Two servers
(`sbx serve --listen 127.0.0.1:0`, one per mode) from one config; one sandbox each, created and
killed through the SDK; 5 warm-up commands per mode, then N samples of each (stdout empty and
exit code 0 checked). Prints the medians, the 90th percentiles and the ratio; target: the agent's
median <= 10 ms. Exit status 1 with --check when the target is missed, 2 when something fails.
Every sandbox created is killed, and both servers are stopped, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig

PORT_LINE = re.compile(r"listening on http://127\.0\.0\.1:(\d+) ")


def start_server(sbx: str, plugin_dir: str, config: Path, provider: str, log: Path):
    """Starts `sbx serve` for `provider`; returns the process and its port (from its first line)."""
    proc = subprocess.Popen(
        [sbx, "serve", "--config", str(config), "--provider", provider, "--listen",
         "127.0.0.1:0", "--plugin-dir", plugin_dir],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    line = proc.stdout.readline()  # the server prints it once it listens
    match = PORT_LINE.search(line)
    if not match:
        proc.kill()
        raise RuntimeError(f"sbx serve ({provider}) did not say where it listens: {line!r}; "
                           f"log: {log.read_text()[-2000:]}")
    return proc, int(match.group(1))


async def timed_true(box: Sandbox) -> float:
    start = time.perf_counter()
    execution = await box.commands.run("true")
    elapsed = (time.perf_counter() - start) * 1000.0
    if execution.exit_code != 0 or execution.logs.stdout:
        raise RuntimeError(f"`true` gave exit code {execution.exit_code}")
    return elapsed


async def measure(ports: dict[str, int], image: str, samples: int) -> dict[str, list[float]]:
    boxes: dict[str, Sandbox] = {}
    try:
        for mode, port in ports.items():
            boxes[mode] = await Sandbox.create(
                image,
                timeout=timedelta(minutes=10),
                connection_config=ConnectionConfig(domain=f"127.0.0.1:{port}",
                                                   request_timeout=timedelta(seconds=120)),
                ready_timeout=timedelta(seconds=60),
            )
        for box in boxes.values():
            for _ in range(5):
                await timed_true(box)
        figures: dict[str, list[float]] = {mode: [] for mode in boxes}
        for _ in range(samples):
            for mode, box in boxes.items():
                figures[mode].append(await timed_true(box))
        return figures
    finally:
        for mode, box in boxes.items():
            try:
                await box.kill()
            except Exception as e:  # noqa: BLE001 - the others are still killed
                print(f"serve_python_sdk: killing the {mode} sandbox failed: {e}", file=sys.stderr)
            await box.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sbx", required=True)
    ap.add_argument("--plugin-dir", required=True)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--image", default="sbx-busybox:latest")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="sbx-bench-serve-") as work_dir:
        work = Path(work_dir)
        config = work / "sbx.json"
        config.write_text(json.dumps({"providers": {
            "agent": {"plugin": "local_docker"},
            "docker_exec": {"plugin": "local_docker", "config": {"agent": False}},
        }}))
        servers = []
        try:
            ports = {}
            for mode in ("agent", "docker_exec"):
                proc, ports[mode] = start_server(args.sbx, args.plugin_dir, config, mode,
                                                 work / f"{mode}.log")
                servers.append(proc)
            figures = asyncio.run(measure(ports, args.image, args.samples))
        except Exception as e:  # noqa: BLE001 - reported, exit 2
            print(f"serve_python_sdk: {e}", file=sys.stderr)
            return 2
        finally:
            for proc in servers:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()

    agent, docker = (statistics.median(figures[m]) for m in ("agent", "docker_exec"))
    p90 = {m: statistics.quantiles(figures[m], n=10)[-1] for m in figures}
    met = agent <= 10
    print(f"sbx serve over local_docker, the OpenSandbox Python SDK's commands.run(\"true\"), "
          f"{args.samples} samples per mode, image {args.image}")
    print(f"{'':28} {'agent':>10} {'Docker exec':>12} {'ratio':>8}  target")
    print(f"{'median, ms':28} {agent:10.2f} {docker:12.2f} {docker / agent:7.1f}x  "
          f"agent <= 10 ms: {'met' if met else 'MISSED'}")
    print(f"{'90th percentile, ms':28} {p90['agent']:10.2f} {p90['docker_exec']:12.2f}")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
