"""Runs one client test program against a fresh `sbx serve` over local_docker, then checks what
it left and what it said on the wire.

    with_serve.py --sbx BUILD/bin/sbx --plugin-dir DIR [--api-key] [--server-proxy]
                  [--work DIR] [--no-record] -- PROGRAM [ARGS...]

1. Writes a config naming local_docker as provider "docker" and starts
   `sbx serve --config C --provider docker --listen 127.0.0.1:0 --plugin-dir DIR
   [--api-key-env SBX_CLIENTS_SERVER_KEY]`; its first stdout line gives the port and the run id
   (`sbx serve: listening on http://127.0.0.1:PORT (provider docker, sbx.run=RUN)`).
2. Runs PROGRAM with OPEN_SANDBOX_DOMAIN=127.0.0.1:PORT, OPEN_SANDBOX_API_KEY (with --api-key:
   a random key, the server's), SBX_CLIENTS_USE_SERVER_PROXY=0/1, SBX_CLIENTS_RECORD (the JSON
   lines file the program's recorder appends to) and SBX_CLIENTS_WORK (a scratch directory).
3. Checks that no container of this server's run is left (the program must kill what it
   created), stops the server with SIGTERM (it must exit 0), checks that the API key is not in
   the server's log, and validates every recorded exchange against the OpenAPI specs
   (openapi_check.py; no exchange recorded is a failure). With --no-record, for a client whose
   HTTP layer the recorder cannot hook (NeMo Gym's provider), nothing is recorded or validated.

Exit status 0 only when all of that held. The server's log is printed when something failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PORT_LINE = re.compile(r"listening on http://127\.0\.0\.1:(\d+) \(provider \S+, sbx\.run=([^)\s]+)\)")


def log(msg: str) -> None:
    print(f"with_serve: {msg}", flush=True)


def leftover_containers(sbx: str, plugin_dir: str, config: Path, run: str) -> list[str]:
    out = subprocess.run(
        [sbx, "list", "--config", str(config), "--provider", "docker", "--plugin-dir",
         plugin_dir, "--label", f"sbx.run={run}", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sbx list failed ({out.returncode}): {out.stderr.strip()}")
    return [s["id"] for s in json.loads(out.stdout or "[]")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sbx", required=True)
    ap.add_argument("--plugin-dir", required=True)
    ap.add_argument("--api-key", action="store_true")
    ap.add_argument("--server-proxy", action="store_true")
    ap.add_argument("--work", help="scratch directory (default: a new one under the temp dir)")
    ap.add_argument("--no-record", action="store_true",
                    help="the program records no exchange: skip the OpenAPI validation")
    ap.add_argument("program", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        ap.error("no program given after --")

    own_work = args.work is None
    work = Path(args.work or tempfile.mkdtemp(prefix="sbx-clients-"))
    work.mkdir(parents=True, exist_ok=True)
    config = work / "sbx.json"
    config.write_text(json.dumps({"providers": {"docker": {"plugin": "local_docker"}}}))
    record = work / "exchanges.jsonl"
    record.unlink(missing_ok=True)
    serve_log = work / "serve.log"

    env = dict(os.environ)
    cmd = [args.sbx, "serve", "--config", str(config), "--provider", "docker", "--listen",
           "127.0.0.1:0", "--plugin-dir", args.plugin_dir]
    key = None
    if args.api_key:
        key = "k-" + secrets.token_hex(16)
        env["SBX_CLIENTS_SERVER_KEY"] = key
        cmd += ["--api-key-env", "SBX_CLIENTS_SERVER_KEY"]
    with open(serve_log, "wb") as err:
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    first = server.stdout.readline().decode("utf-8", "replace")
    m = PORT_LINE.search(first)
    if not m:
        server.kill()
        server.wait()
        log(f"sbx serve did not start: {first!r}")
        print(serve_log.read_text(errors="replace"))
        return 1
    port, run = m.group(1), m.group(2)
    log(f"sbx serve on 127.0.0.1:{port} (sbx.run={run}, api key: {'yes' if key else 'no'}, "
        f"server proxy: {'yes' if args.server_proxy else 'no'})")

    child_env = dict(os.environ)
    child_env.pop("SBX_CLIENTS_SERVER_KEY", None)
    child_env.update({
        "OPEN_SANDBOX_DOMAIN": f"127.0.0.1:{port}",
        "SBX_CLIENTS_USE_SERVER_PROXY": "1" if args.server_proxy else "0",
        "SBX_CLIENTS_RECORD": str(record),
        "SBX_CLIENTS_WORK": str(work),
    })
    if key:
        child_env["OPEN_SANDBOX_API_KEY"] = key
    else:
        child_env.pop("OPEN_SANDBOX_API_KEY", None)

    failures = []
    child = subprocess.run(program, env=child_env)
    if child.returncode != 0:
        failures.append(f"the program exited {child.returncode}")

    try:
        left = leftover_containers(args.sbx, args.plugin_dir, config, run)
        if left:
            failures.append(f"{len(left)} sandbox(es) still exist after the program: {left}")
    except Exception as e:  # noqa: BLE001 - reported as a failure
        failures.append(f"cannot list the server's sandboxes: {e}")

    server.send_signal(signal.SIGTERM)
    rest = server.stdout.read().decode("utf-8", "replace")
    status = server.wait()
    if status != 0:
        failures.append(f"sbx serve exited {status} after SIGTERM: {rest.strip()!r}")

    if key and key in serve_log.read_text(errors="replace"):
        failures.append("the API key appears in the server's log")

    if not args.no_record:
        import openapi_check  # the clients venv's packages; --no-record runs on any Python 3

        records = openapi_check.load_records(record)
        problems = openapi_check.check(records)
        for p in problems:
            print(f"openapi: {p}")
        log(f"{len(records)} exchanges checked against the OpenAPI specs, {len(problems)} violations")
        if not records:
            failures.append("no HTTP exchange was recorded")
        if problems:
            failures.append(f"{len(problems)} OpenAPI violation(s)")

    if failures:
        for f in failures:
            log(f"FAILED: {f}")
        log(f"sbx serve's log ({serve_log}):")
        print(serve_log.read_text(errors="replace")[-20000:])
        return 1
    log("passed")
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
