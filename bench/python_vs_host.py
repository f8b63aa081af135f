"""python_vs_host: the Python package against the C++ host API on the same provider, side by side.

A trivial command (`true`) on local_docker with its agent, in blocks that alternate: B commands
through the package (`await provider.exec`, one at a time, in this process), then B through the
C++ host API (build/bin/exec_loop, a process of its own driven over a pipe). Prints the medians
and p90 of the latency, the client CPU per command (this process's CPU over the package's blocks;
exec_loop's own over its blocks) and the ratios (targets: latency within 1.2x, client CPU within
2x of the C++ host API).

Usage (after a build with -DSBX_PYTHON=ON):
  PYTHONPATH=build/python $(scripts/python-env.sh) bench/python_vs_host.py [--blocks N] [--block B]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sbx

BUILD = Path(__file__).resolve().parent.parent / "build"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--image", default="sbx-busybox:latest")
    args = parser.parse_args()

    config = {"providers": {"docker": {"plugin": "local_docker"}}}
    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / "sbx.json"
        config_file.write_text(json.dumps(config))
        host = sbx.Host(config, plugin_dirs=[BUILD / "plugins"], labels={"sbx.bench": "python_vs_host"})
        docker = host.provider("docker")
        box = await docker.create(sbx.SandboxSpec(image=args.image, ttl_s=1800))
        cpp = subprocess.Popen(
            [BUILD / "bin" / "exec_loop", config_file, "docker", args.image],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert cpp.stdout.readline().strip() == "ready"
            for _ in range(20):  # warm both
                await docker.exec(box, "true")
            cpp.stdin.write("20\n")
            cpp.stdin.flush()
            cpp.stdout.readline()

            py_ms: list[float] = []
            cpp_ms: list[float] = []
            py_cpu = cpp_cpu = 0.0
            for _ in range(args.blocks):
                cpu = time.process_time()
                for _ in range(args.block):
                    start = time.perf_counter()
                    r = await docker.exec(box, "true")
                    py_ms.append((time.perf_counter() - start) * 1e3)
                    assert r.return_code == 0
                py_cpu += (time.process_time() - cpu) * 1e3
                cpp.stdin.write(f"{args.block}\n")
                cpp.stdin.flush()
                block = json.loads(cpp.stdout.readline())
                cpp_ms.extend(block["ms"])
                cpp_cpu += block["cpu_ms"]
        finally:
            cpp.stdin.write("\n")
            cpp.stdin.flush()
            cpp.wait(timeout=60)
            await docker.close(box)

    n = args.blocks * args.block
    py_med, cpp_med = statistics.median(py_ms), statistics.median(cpp_ms)
    print(f"trivial command on local_docker (agent), {n} each way in alternating blocks of {args.block}")
    print(f"latency, Python package: median {py_med:.3f} ms, p90 {percentile(py_ms, 0.9):.3f} ms")
    print(f"latency, C++ host API:   median {cpp_med:.3f} ms, p90 {percentile(cpp_ms, 0.9):.3f} ms")
    print(f"latency ratio Python / C++: {py_med / cpp_med:.2f}x (target <= 1.2)")
    print(f"client CPU per command, Python package: {py_cpu / n:.3f} ms")
    print(f"client CPU per command, C++ host API:   {cpp_cpu / n:.3f} ms")
    print(f"client CPU ratio Python / C++: {py_cpu / cpp_cpu:.2f}x (target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
