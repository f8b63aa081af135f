"""The official `osb` CLI (PyPI opensandbox-cli, pinned in requirements.txt) against `sbx serve`:
create, command run (a succeeding and a failing command), file write and cat, kill.

Run by harness/with_serve.py, which sets OPEN_SANDBOX_DOMAIN / OPEN_SANDBOX_API_KEY (the CLI
reads both, as a user's shell would give them) and SBX_CLIENTS_USE_SERVER_PROXY. Each `osb`
invocation is its own process, started as the installed `osb` entry point would start it, with
harness/record.py installed first so its HTTP exchanges are recorded for the OpenAPI check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "harness"))
from runner import case, check, check_eq, run  # noqa: E402

# `osb` is opensandbox_cli.main:cli; the recorder is installed before it imports httpx clients.
OSB = [
    sys.executable, "-c",
    "import sys; sys.path.insert(0, sys.argv.pop(1)); import record; record.install(); "
    "from opensandbox_cli.main import cli; sys.argv[0] = 'osb'; cli()",
    str(HERE / "harness"),
]


def json_output(text: str):
    """The JSON document in an osb output (anything printed before it, a spinner say, skipped)."""
    start = text.find("{")
    check(start >= 0, f"no JSON in {text!r}")
    return json.JSONDecoder().raw_decode(text[start:])[0]


class State:
    def __init__(self):
        work = Path(os.environ.get("SBX_CLIENTS_WORK", "/tmp"))
        # A config file of its own (absent: defaults), so no ~/.opensandbox/config.toml is read.
        self.globals = ["--no-color", "--config", str(work / "osb-config.toml"),
                        "--request-timeout", "120"]
        if os.environ.get("SBX_CLIENTS_USE_SERVER_PROXY") == "1":
            self.globals.append("--use-server-proxy")
        self.sandbox_id: str | None = None
        self.killed = False

    def osb(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        argv = OSB + self.globals + list(args)
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=600)
        print(f"  $ osb {' '.join(args)} -> exit {result.returncode}")
        if result.returncode != 0:
            print(f"    stdout: {result.stdout.strip()[:2000]}")
            print(f"    stderr: {result.stderr.strip()[:2000]}")
        return result

    def id(self) -> str:
        check(self.sandbox_id is not None, "no sandbox (create failed)")
        return self.sandbox_id

    def cleanup(self):
        if self.sandbox_id and not self.killed:
            self.osb("sandbox", "kill", self.sandbox_id)


@case
def create(state: State):
    result = state.osb("sandbox", "create", "--image", "sbx-busybox:latest", "--timeout", "20m",
                       "--metadata", "suite=clients", "--metadata", "client=osb",
                       "--ready-timeout", "60s", "-o", "json")
    check_eq(result.returncode, 0, "osb sandbox create exit status")
    created = json_output(result.stdout)
    check(created.get("id"), f"no id in {created}")
    state.sandbox_id = created["id"]
    got = state.osb("sandbox", "get", state.sandbox_id, "-o", "json")
    check_eq(got.returncode, 0, "osb sandbox get exit status")
    info = json_output(got.stdout)
    check_eq(info["status"]["state"], "Running", "state")


@case
def command_run(state: State):
    result = state.osb("command", "run", state.id(), "--", "echo", "hello-from-osb")
    check_eq(result.returncode, 0, "exit status")
    check_eq(result.stdout.strip(), "hello-from-osb", "stdout")


@case
def failing_command_run(state: State):
    result = state.osb("command", "run", state.id(), "--", "sh", "-c", "echo bad >&2; exit 3")
    check(result.returncode != 0, "a failing command gave exit status 0")
    check("bad" in result.stderr, f"stderr: {result.stderr!r}")
    check("CommandExecError" in result.stdout + result.stderr, "no CommandExecError reported")


@case
def file_write_and_cat(state: State):
    write = state.osb("file", "write", state.id(), "/tmp/osb/hello.txt", "--content",
                      "hello file from osb\n")
    check_eq(write.returncode, 0, "file write exit status")
    cat = state.osb("file", "cat", state.id(), "/tmp/osb/hello.txt")
    check_eq(cat.returncode, 0, "file cat exit status")
    check_eq(cat.stdout, "hello file from osb\n", "file cat output")


@case
def kill(state: State):
    result = state.osb("sandbox", "kill", state.id())
    check_eq(result.returncode, 0, "kill exit status")
    state.killed = True
    gone = state.osb("sandbox", "get", state.id(), "-o", "json")
    check(gone.returncode != 0, "osb sandbox get succeeded after kill")


if __name__ == "__main__":
    sys.exit(run(State()))
