"""A small ordered test runner for the client programs (no test framework to install).

Cases run in the order they were declared and share state through the object they are given
(the sandbox created by the first case is used by the later ones). A case that raises fails; the
others still run. The last line is the plain summary ctest output readers look for:
"N passed, N failed".
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
import traceback

_cases = []


def case(fn):
    _cases.append(fn)
    return fn


def check(condition, message: str = "") -> None:
    """An assertion that still runs under `python -O`."""
    if not condition:
        raise AssertionError(message or "check failed")


def check_eq(actual, expected, what: str = "") -> None:
    if actual != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def run(state, selected=None) -> int:
    """Runs the declared cases (or those named in `selected`); the process exit status."""
    passed = failed = 0
    loop = asyncio.new_event_loop()  # one loop for all cases: the SDK's clients are bound to it
    asyncio.set_event_loop(loop)
    for fn in _cases:
        if selected is not None and fn.__name__ not in selected:
            continue
        start = time.monotonic()
        try:
            result = fn(state)
            if inspect.iscoroutine(result):
                loop.run_until_complete(result)
            passed += 1
            print(f"PASS {fn.__name__} ({time.monotonic() - start:.1f} s)", flush=True)
        except BaseException:  # noqa: BLE001 - every failure is reported, then the next case
            failed += 1
            print(f"FAIL {fn.__name__} ({time.monotonic() - start:.1f} s)", flush=True)
            traceback.print_exc()
            sys.stderr.flush()
    cleanup = getattr(state, "cleanup", None)
    if cleanup is not None:
        try:
            result = cleanup()
            if inspect.iscoroutine(result):
                loop.run_until_complete(result)
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
    loop.close()
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 and passed > 0 else 1
