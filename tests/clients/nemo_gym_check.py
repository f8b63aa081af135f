"""NeMo Gym 0.7.0's own OpenSandbox provider against `sbx serve` (tests/clients/nemo_gym.sh runs it).

Settings come from the environment, as harness/with_serve.py sets it (NeMo Gym parses sys.argv
with Hydra when its HTTP layer loads): OPEN_SANDBOX_DOMAIN (host:port of sbx serve),
OPEN_SANDBOX_API_KEY (optional), SBX_CLIENTS_USE_SERVER_PROXY (1: execd through the server);
SBX_NEMO_IMAGE (default sbx-bash:latest: the provider runs a session's command as `bash -c`).

Checks, each printed as "ok NAME" or "FAIL NAME: why" (exit 1 on any failure):
  - create through the provider (its probe included) and status running;
  - exec: stdout, stderr, a nonzero exit, cwd;
  - a 1 MiB single line comes back as exactly that line (execd sends a whole line as one event
    and the provider joins events with a newline: a line in pieces would gain newlines);
  - preserve_background_services=True: a service started by one exec (output redirected) is
    still running for the next exec, which also runs through a session, and after it;
  - upload and download of a file;
  - terminals (sandbox.pty, over execd's /pty WebSocket): the size asked for seen by stty, typed
    input's output, pty.exec's output and exit code, a detach and reattach that replays what was
    missed, another client's attach taking the terminal over (the first then fails) with a
    replay from 0, the exit code, pipe mode's stdout and stderr apart, env;
  - close, then status is not running.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

failures: list[str] = []


def check(name: str, ok: bool, why: str = "") -> None:
    if ok:
        print(f"ok {name}", flush=True)
    else:
        print(f"FAIL {name}: {why}", flush=True)
        failures.append(name)


async def read_until(session, needle: bytes, *, stderr: bool = False, timeout_s: float = 30) -> bytes:
    """What the session printed up to and including `needle` (b"" if it ended or timed out)."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            return b""
        try:
            chunk = await (session.read_stderr if stderr else session.read)(timeout_s=left)
        except (TimeoutError, asyncio.TimeoutError):
            return b""
        if not chunk:
            return seen if needle in seen else b""
        seen += chunk
    return seen


async def check_terminals(box) -> None:
    from nemo_gym.sandbox import SandboxPtyError

    s = await box.pty.create(rows=30, cols=90)
    await s.write(b"stty size\n")
    check("pty: the size asked for", bool(await read_until(s, b"30 90")), "no '30 90'")
    await s.write(b"echo sum=$((40+2))\n")
    check("pty: typed input runs", bool(await read_until(s, b"sum=42")), "no 'sum=42'")

    # (It runs in the live default shell: `exit` there would end the shell itself.)
    r = await box.pty.exec("echo from-exec; sh -c 'exit 5'")
    check(
        "pty.exec: output and exit code",
        r.return_code == 5 and "from-exec" in (r.stdout or ""),
        repr(r),
    )

    await s.detach()
    await box.exec("true")  # time passes; the terminal runs on
    await s.reattach()
    await s.write(b"echo back=$((6*7))\n")
    check("pty: detach and reattach", bool(await read_until(s, b"back=42")), "no 'back=42'")

    other = await box.pty.attach(s.session_id, takeover=True, since=0)
    replay = await read_until(other, b"sum=42")
    check("pty: attach replays from 0", bool(replay), "no replay of 'sum=42'")
    try:
        await s.read(timeout_s=10)
        await s.read(timeout_s=10)
        evicted = False
    except SandboxPtyError:
        evicted = True
    except (TimeoutError, asyncio.TimeoutError):
        evicted = False
    check("pty: the first holder is taken over", evicted, "its reads went on")
    await other.write(b"exit 7\n")
    code = await other.wait_exit(timeout_s=30)
    check("pty: the exit code", code == 7, f"exit code {code}")
    await other.close()
    await s.close()

    p = await box.pty.create(
        "echo to-out-$GREETING; echo to-err >&2; exit 3", env={"GREETING": "hi"}, pty=False
    )
    out = await read_until(p, b"to-out-hi")
    err = await read_until(p, b"to-err", stderr=True)
    code = await p.wait_exit(timeout_s=30)
    check(
        "pty: pipe mode, env, stdout and stderr apart",
        bool(out) and bool(err) and code == 3,
        f"out {out!r}, err {err!r}, exit {code}",
    )
    await p.close()


async def main() -> int:
    from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus

    domain = os.environ["OPEN_SANDBOX_DOMAIN"]
    provider = {
        "opensandbox": {
            "connection": {
                "domain": domain,
                "api_key": os.environ.get("OPEN_SANDBOX_API_KEY") or None,
                "protocol": "http",
                "request_timeout_s": 60,
                "use_server_proxy": os.environ.get("SBX_CLIENTS_USE_SERVER_PROXY") == "1",
            },
            "create": {"retries": 0},
        }
    }
    spec = SandboxSpec(
        image=os.environ.get("SBX_NEMO_IMAGE", "sbx-bash:latest"),
        ttl_s=600,
        entrypoint=["sleep", "600"],
        metadata={"sbx-test": "nemo-gym"},
    )
    started = time.monotonic()
    box = await AsyncSandbox(provider, spec).start()
    print(f"created in {time.monotonic() - started:.2f} s", flush=True)
    try:
        check("status running", await box.status() == SandboxStatus.RUNNING, str(await box.status()))

        r = await box.exec("echo out; echo err >&2; exit 3")
        # The provider appends execd's error event to stderr ("CommandExecError: 3").
        check(
            "exec stdout, stderr, exit code",
            r.stdout == "out" and (r.stderr or "").split("\n")[0] == "err" and r.return_code == 3,
            repr(r),
        )
        r = await box.exec("pwd", cwd="/tmp")
        check("exec cwd", r.stdout == "/tmp" and r.return_code == 0, repr(r))

        mib = 1024 * 1024
        r = await box.exec(f"head -c {mib} /dev/zero | tr '\\0' a; echo")
        out = r.stdout or ""
        check(
            "a 1 MiB single line is one line",
            r.return_code == 0 and out == "a" * mib,
            f"return code {r.return_code}, {len(out)} bytes, {out.count(chr(10))} newlines",
        )

        # Issue 35: 1.3 MB of lines failed every time (the stream was cut for a slow reader);
        # the output is held at the provider now and arrives whole.
        r = await box.exec("seq 1 200000")
        lines = (r.stdout or "").split("\n")
        check(
            "seq 1 200000 arrives whole",
            r.return_code == 0 and lines[:200000] == [str(i) for i in range(1, 200001)],
            f"return code {r.return_code}, {len(lines)} lines",
        )

        r = await box.exec(
            "mkdir -p /tmp/svc && cd /tmp/svc && "
            "(sleep 300 </dev/null >/dev/null 2>&1 & echo $! > pid) && echo started",
            preserve_background_services=True,
        )
        check("a service starts (preserve_background_services)", r.stdout == "started", repr(r))
        r = await box.exec(
            "kill -0 $(cat /tmp/svc/pid) && echo running", preserve_background_services=True
        )
        check("the service runs for the next exec (session)", r.stdout == "running", repr(r))
        r = await box.exec("kill -0 $(cat /tmp/svc/pid) && echo running")
        check("the service runs after its session", r.stdout == "running", repr(r))
        r = await box.exec(
            f"head -c {mib} /dev/zero | tr '\\0' b; echo", preserve_background_services=True
        )
        out = r.stdout or ""
        check(
            "a 1 MiB single line through a session",
            r.return_code == 0 and out == "b" * mib,
            f"return code {r.return_code}, {len(out)} bytes, {out.count(chr(10))} newlines",
        )
        r = await box.exec("exit 4", preserve_background_services=True)
        check("a session run's exit code", r.return_code == 4, repr(r))

        with tempfile.TemporaryDirectory(prefix="sbx-nemo-") as tmp:
            local = Path(tmp) / "up.bin"
            payload = bytes(range(256)) * 4096
            local.write_bytes(payload)
            await box.upload(local, "/tmp/up.bin")
            back = Path(tmp) / "down.bin"
            await box.download("/tmp/up.bin", back)
            check("upload and download", back.read_bytes() == payload, "bytes differ")
        await check_terminals(box)
    finally:
        await box.stop()
    check("closed", True)
    return 1 if failures else 0


if __name__ == "__main__":
    code = asyncio.run(main())
    print(f"{len(failures)} failed" if failures else "all passed", flush=True)
    sys.exit(code)
