"""Runs the Python snippet of the project's README.md exactly as
printed, against `sbx serve`, and checks what it prints.

Run by harness/with_serve.py (OPEN_SANDBOX_DOMAIN set to the server, as the snippet's reader
would export it). The snippet is the first ```python block after the marker line
`<!-- readme-snippet -->`; it runs in a fresh interpreter of the client venv, with only the
exchange recorder (harness/record.py) installed in front of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = "<!-- readme-snippet -->"
EXPECTED = "hello from Linux\n"


def snippet() -> str:
    text = (HERE.parent.parent / "README.md").read_text()
    at = text.find(MARKER)
    if at < 0:
        raise SystemExit(f"no {MARKER} in README.md")
    m = re.search(r"```python\n(.*?)```", text[at:], re.S)
    if not m:
        raise SystemExit("no ```python block after the marker")
    return m.group(1)


def main() -> int:
    code = snippet()
    print(code)
    runner = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import record; record.install(); "
              "exec(compile(sys.argv.pop(1), 'README snippet', 'exec'), {'__name__': '__main__'})")
    result = subprocess.run([sys.executable, "-c", runner, str(HERE / "harness"), code],
                            capture_output=True, text=True, timeout=600)
    print(f"exit status {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr}")
    ok = result.returncode == 0 and result.stdout == EXPECTED
    print(f"{1 if ok else 0} passed, {0 if ok else 1} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
