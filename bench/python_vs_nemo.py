"""python_vs_nemo: NeMo Gym 0.7.0's AsyncSandbox on three providers, side by side in one process:
the package's provider `sbx` (local_docker with its agent, in process), NeMo Gym's own Docker
provider (the docker CLI) and NeMo Gym's own OpenSandbox provider through `sbx serve` on
local_docker. A trivial command (`true`), in blocks that alternate between the three; prints the
median latency and the client CPU per command (this process's CPU plus its children's: the
docker CLI runs as children) and the ratios to the package's (target: >= 5x less client CPU than
either).

Usage (after a build with -DSBX_PYTHON=ON; NeMo Gym's venv from tests/clients/nemo_gym_venv.sh):
  py=$(tests/clients/nemo_gym_venv.sh ~/.cache/sbx-nemo-gym)
  PYTHONPATH=build/python $py tests/clients/harness/with_serve.py --sbx build/bin/sbx \\
      --plugin-dir build/plugins --no-record -- $py bench/python_vs_nemo.py
Settings by environment (NeMo Gym parses sys.argv): SBX_BENCH_BLOCKS (10), SBX_BENCH_BLOCK (50).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec

BUILD = Path(__file__).resolve().parent.parent / "build"
IMAGE = "sbx-bash:latest"


def cpu_ms() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime) * 1e3


async def main() -> int:
    blocks = int(os.environ.get("SBX_BENCH_BLOCKS", "10"))
    block = int(os.environ.get("SBX_BENCH_BLOCK", "50"))
    providers = {
        "sbx (the package, in process)": {
            "sbx": {"provider": "local_docker", "plugin_dirs": [str(BUILD / "plugins")],
                    "labels": {"sbx.bench": "python_vs_nemo"}}},
        "NeMo Gym's docker (docker CLI)": {"docker": {}},
        "NeMo Gym's opensandbox via sbx serve": {
            "opensandbox": {
                "connection": {"domain": os.environ["OPEN_SANDBOX_DOMAIN"],
                               "api_key": os.environ.get("OPEN_SANDBOX_API_KEY") or None,
                               "protocol": "http", "request_timeout_s": 60},
                "create": {"retries": 0}}},
    }
    boxes = {}
    try:
        for name, config in providers.items():
            spec = SandboxSpec(image=IMAGE, ttl_s=1800, entrypoint=["sleep", "1800"])
            boxes[name] = await AsyncSandbox(config, spec).start()
        for box in boxes.values():  # warm
            for _ in range(10):
                await box.exec("true")
        latency = {name: [] for name in boxes}
        cpu = {name: 0.0 for name in boxes}
        for _ in range(blocks):
            for name, box in boxes.items():
                before = cpu_ms()
                for _ in range(block):
                    start = time.perf_counter()
                    r = await box.exec("true")
                    latency[name].append((time.perf_counter() - start) * 1e3)
                    assert r.return_code == 0, (name, r)
                cpu[name] += cpu_ms() - before
    finally:
        for box in boxes.values():
            await box.stop()

    n = blocks * block
    ours = next(iter(boxes))
    print(f"trivial command through NeMo Gym's AsyncSandbox, {n} per provider in alternating blocks")
    for name in boxes:
        per = cpu[name] / n
        ratio = "" if name == ours else f"; {per / (cpu[ours] / n):.1f}x the package's (target >= 5)"
        print(f"{name}: latency median {statistics.median(latency[name]):.3f} ms, "
              f"client CPU {per:.3f} ms per command{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
