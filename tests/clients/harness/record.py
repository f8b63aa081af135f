"""Records every HTTP exchange an httpx client makes in this process (the Python SDK and the osb
CLI both speak through httpx), for openapi_check.py.

`install()` wraps httpx.HTTPTransport.handle_request and httpx.AsyncHTTPTransport.
handle_async_request: the request is noted as it goes out; the response's byte stream is teed
(the first MAX_BODY bytes kept) and the exchange is appended, as one JSON line, to the file named
by $SBX_CLIENTS_RECORD when the client closes the response. The client sees the same bytes and
the same streaming behaviour (nothing is buffered: a 1 GiB download stays a stream).

Record: {"request": {"method", "url", "headers" (lower-case names; the API key's value
redacted), "json" (the body when it is JSON, else null), "body_bytes" (null when streamed)},
"response": {"status", "headers", "body" (text, the first MAX_BODY bytes), "size",
"complete" (the whole body was read and kept)}}.

THREADING: records are appended under a lock with one write() each; the file is opened in append
mode, so several processes (the CLI runs one per command) may share it.
"""

from __future__ import annotations

import atexit
import json
import os
import threading

import httpx

MAX_BODY = 256 * 1024
_lock = threading.Lock()
_pending: set = set()
_installed = False
REDACTED = "<redacted>"
_SECRET_HEADERS = {"open-sandbox-api-key", "x-execd-access-token", "authorization"}


def _headers(headers) -> dict:
    out = {}
    for k, v in headers.items():
        k = k.lower()
        out[k] = REDACTED if k in _SECRET_HEADERS else v
    return out


def _request_record(request: httpx.Request) -> dict:
    rec = {
        "method": request.method,
        "url": str(request.url),
        "headers": _headers(request.headers),
        "json": None,
        "body_bytes": None,
    }
    try:
        content = request.content  # raises when the body is a stream not read yet
    except httpx.RequestNotRead:
        return rec
    rec["body_bytes"] = len(content)
    if request.headers.get("content-type", "").startswith("application/json") and content:
        try:
            rec["json"] = json.loads(content)
        except ValueError:
            rec["json"] = {"<not json>": content[:200].decode("utf-8", "replace")}
    return rec


def _write(record: dict) -> None:
    path = os.environ.get("SBX_CLIENTS_RECORD")
    if not path:
        return
    line = json.dumps(record) + "\n"
    with _lock:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)


class _Tee:
    """Keeps the start of a body and writes the record once, when the body is closed."""

    def __init__(self, request_rec: dict, response: httpx.Response):
        self.request_rec = request_rec
        self.status = response.status_code
        self.headers = _headers(response.headers)
        self.kept = bytearray()
        self.size = 0
        self.ended = False
        self.written = False
        _pending.add(self)

    def take(self, chunk: bytes) -> None:
        self.size += len(chunk)
        room = MAX_BODY - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def emit(self, note: str | None = None) -> None:
        if self.written:
            return
        self.written = True
        _pending.discard(self)
        response = {
            "status": self.status,
            "headers": self.headers,
            "body": self.kept.decode("utf-8", "replace"),
            "size": self.size,
            "complete": self.ended and self.size <= MAX_BODY,
        }
        record = {"request": self.request_rec, "response": response}
        if note:
            record["note"] = note
        _write(record)


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner, tee: _Tee):
        self.inner, self.tee = inner, tee

    def __iter__(self):
        for chunk in self.inner:
            self.tee.take(chunk)
            yield chunk
        self.tee.ended = True

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.tee.emit()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner, tee: _Tee):
        self.inner, self.tee = inner, tee

    async def __aiter__(self):
        async for chunk in self.inner:
            self.tee.take(chunk)
            yield chunk
        self.tee.ended = True

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.tee.emit()


def install() -> None:
    """Wraps httpx's transports (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    sync_handle = httpx.HTTPTransport.handle_request
    async_handle = httpx.AsyncHTTPTransport.handle_async_request

    def handle_request(self, request):
        rec = _request_record(request)
        try:
            response = sync_handle(self, request)
        except Exception as e:
            _write({"request": rec, "response": None, "error": repr(e)})
            raise
        response.stream = _SyncStream(response.stream, _Tee(rec, response))
        return response

    async def handle_async_request(self, request):
        rec = _request_record(request)
        try:
            response = await async_handle(self, request)
        except Exception as e:
            _write({"request": rec, "response": None, "error": repr(e)})
            raise
        response.stream = _AsyncStream(response.stream, _Tee(rec, response))
        return response

    httpx.HTTPTransport.handle_request = handle_request
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request
    atexit.register(lambda: [t.emit("response never closed") for t in list(_pending)])
