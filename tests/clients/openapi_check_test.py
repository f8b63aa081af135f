"""The OpenAPI checker (harness/openapi_check.py) itself, without a server: the exchanges of the
real server's wire transcript pass, and exchanges that break the specs are caught (so a client
test that reports "0 violations" means something).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "harness"))
import openapi_check  # noqa: E402
from runner import case, check, check_eq, run  # noqa: E402

SID = "22bc0a20-1cb1-49dc-ba46-a6da37a42f22"
STATUS = ('{"state":"Running","reason":"CONTAINER_RUNNING","message":"Sandbox container is '
          'running.","lastTransitionAt":"2026-11-30T23:17:59.695416Z"}')
SANDBOX = (f'{{"id":"{SID}","image":{{"uri":"sbx-busybox:latest"}},"status":{STATUS},'
           '"metadata":{"team":"infra"},"entrypoint":["tail","-f","/dev/null"],'
           '"expiresAt":"2026-11-30T23:27:59.680153Z","createdAt":"2026-11-30T23:17:59.695416Z"}')
CREATE_REQ = {"image": {"uri": "sbx-busybox:latest"}, "entrypoint": ["tail", "-f", "/dev/null"],
              "resourceLimits": {"cpu": "1", "memory": "2Gi"}, "timeout": 600,
              "secureAccess": False}


def rec(method, target, status, body="", ctype="application/json", req=None, req_type=None,
        complete=True, req_bytes=None):
    headers = {"content-type": req_type} if req_type else {}
    if req_bytes is None and req is not None:
        req_bytes = len(json.dumps(req))
    return {
        "request": {"method": method, "url": "http://127.0.0.1:18080" + target,
                    "headers": headers, "json": req, "body_bytes": req_bytes},
        "response": {"status": status, "headers": {"content-type": ctype} if ctype else {},
                     "body": body, "complete": complete},
    }


EXECD = f"/sandboxes/{SID}/proxy/44772"
PROXY = f"/v1/sandboxes/{SID}/proxy/44772"
STREAM = ('{"type":"init","text":"bdf5","timestamp":1796080684455}\n\n'
          '{"type":"ping","text":"pong","timestamp":1796080684456}\n\n'
          '{"type":"stdout","text":"out","timestamp":1796080684457}\n\n'
          '{"type":"error","timestamp":1796080684457,"error":{"ename":"CommandExecError",'
          '"evalue":"3","traceback":["exit status 3"]}}\n\n')

GOOD = [
    rec("POST", "/v1/sandboxes", 202,
        f'{{"id":"{SID}","status":{STATUS},"metadata":{{"team":"infra"}},'
        '"expiresAt":"2026-11-30T23:27:59.680153Z","createdAt":"2026-11-30T23:17:59.680153Z",'
        '"entrypoint":["tail","-f","/dev/null"]}', req=CREATE_REQ, req_type="application/json"),
    rec("GET", f"/v1/sandboxes/{SID}", 200, SANDBOX),
    rec("GET", "/v1/sandboxes?metadata=team%3Dinfra&pageSize=10", 200,
        f'{{"items":[{SANDBOX}],"pagination":{{"page":1,"pageSize":10,"totalItems":1,'
        '"totalPages":1,"hasNextPage":false}}'),
    rec("GET", f"/v1/sandboxes/{SID}/endpoints/44772?use_server_proxy=false", 200,
        f'{{"endpoint":"127.0.0.1:18080{EXECD}","headers":{{"X-EXECD-ACCESS-TOKEN":"ab"}}}}'),
    rec("GET", f"/v1/sandboxes/{SID}/endpoints/18080?use_server_proxy=true", 200,
        f'{{"endpoint":"127.0.0.1:18080/v1/sandboxes/{SID}/proxy/18080"}}'),
    rec("POST", f"/v1/sandboxes/{SID}/renew-expiration", 200, '{"expiresAt":"2026-12-01T01:00:00Z"}',
        req={"expiresAt": "2026-12-01T01:00:00Z"}, req_type="application/json"),
    rec("POST", f"/v1/sandboxes/{SID}/pause", 202, "", ctype=None),
    rec("POST", f"/v1/sandboxes/{SID}/resume", 202, "", ctype=None),
    rec("DELETE", f"/v1/sandboxes/{SID}", 204, "", ctype=None),
    rec("DELETE", f"/v1/sandboxes/{SID}", 404,
        f'{{"code":"DOCKER::SANDBOX_NOT_FOUND","message":"Sandbox {SID} not found."}}'),
    rec("POST", "/v1/sandboxes", 422, '{"detail":[{"type":"missing","loc":["body"],"msg":"x"}]}',
        req=None, req_type="application/json"),
    rec("GET", f"{EXECD}/ping", 200, "", ctype=None),
    rec("POST", f"{EXECD}/command", 200, STREAM, ctype="text/event-stream",
        req={"command": "echo out; exit 3", "timeout": 60000}, req_type="application/json"),
    rec("POST", f"{PROXY}/command", 200, STREAM[:120], ctype="text/event-stream",
        req={"command": "x", "background": True}, req_type="application/json", complete=False),
    rec("GET", f"{EXECD}/command/status/1b53", 200,
        '{"id":"1b53","content":"echo bg","running":false,"exit_code":0,'
        '"started_at":"2026-11-30T23:18:09.534396427Z",'
        '"finished_at":"2026-11-30T23:18:10.538725873Z"}',
        ctype="application/json; charset=utf-8"),
    rec("GET", f"{EXECD}/command/1b53/logs?cursor=0", 200, "bg\ndone\n",
        ctype="text/plain; charset=utf-8"),
    rec("GET", f"{EXECD}/command/status/nope", 404,
        '{"code":"INVALID_REQUEST_BODY","message":"command not found: nope"}',
        ctype="application/json; charset=utf-8"),
    rec("POST", f"{EXECD}/files/upload", 200, "", ctype=None,
        req_type="multipart/form-data; boundary=b"),
    rec("GET", f"{EXECD}/files/download?path=/tmp/up/hello.txt", 200, "hello file\n",
        ctype="application/octet-stream"),
    rec("GET", f"{PROXY}/files/download?path=/tmp/up/hello.txt", 206, "file\n",
        ctype="application/octet-stream"),
    rec("GET", f"{EXECD}/files/info?path=/tmp/up/hello.txt", 200,
        '{"/tmp/up/hello.txt":{"path":"/tmp/up/hello.txt","type":"file","size":11,'
        '"modified_at":"2026-11-30T23:18:17.296973512Z","created_at":'
        '"2026-11-30T23:18:17.296973512Z","owner":"0","group":"0","mode":644}}',
        ctype="application/json; charset=utf-8"),
    rec("DELETE", f"{EXECD}/command?id=1b53", 200, "", ctype=None),
]

BAD = {
    "a Sandbox without status": (
        rec("GET", f"/v1/sandboxes/{SID}", 200, f'{{"id":"{SID}"}}'), "'status' is a required"),
    "pause answered 200": (
        rec("POST", f"/v1/sandboxes/{SID}/pause", 200, "", ctype=None), "status 200 not declared"),
    "an event with a data: prefix": (
        rec("POST", f"{EXECD}/command", 200, 'data: {"type":"init","text":"x","timestamp":1}\n\n',
            ctype="text/event-stream", req={"command": "x"}, req_type="application/json"),
        "'data:' prefix"),
    "an event with a string timestamp": (
        rec("POST", f"{EXECD}/command", 200, '{"type":"init","text":"x","timestamp":"soon"}\n\n',
            ctype="text/event-stream", req={"command": "x"}, req_type="application/json"),
        "is not of type 'integer'"),
    "an unknown route": (rec("GET", "/v1/sandboxes-nope", 200, "{}"), "no such operation"),
    "a non-boolean use_server_proxy": (
        rec("GET", f"/v1/sandboxes/{SID}/endpoints/44772?use_server_proxy=maybe", 200,
            '{"endpoint":"x"}'), "is not a boolean"),
    "an endpoint that is a number": (
        rec("GET", f"/v1/sandboxes/{SID}/endpoints/44772", 200, '{"endpoint":5}'),
        "is not of type 'string'"),
    "a create request without entrypoint type": (
        rec("POST", "/v1/sandboxes", 400, '{"code":"x","message":"y"}',
            req={**CREATE_REQ, "entrypoint": "sh"}, req_type="application/json"),
        "request body"),
    "ping with a JSON body": (rec("GET", f"{EXECD}/ping", 200, '{"ok":true}'), "declares no content"),
    "status with the wrong content type": (
        rec("GET", f"{EXECD}/command/status/x", 200, "{}", ctype="text/html"),
        "not in ['application/json']"),
    "logs without the cursor's parameter type": (
        rec("GET", f"{EXECD}/command/x/logs?cursor=abc", 200, "", ctype="text/plain"),
        "is not an integer"),
    "a command without a body": (
        rec("POST", f"{EXECD}/command", 400, '{"code":"INVALID_REQUEST_BODY","message":"x"}',
            req_bytes=0), "no body but the spec requires one"),
    "a lifecycle 404 without code": (
        rec("GET", f"/v1/sandboxes/{SID}", 404, '{"message":"gone"}'), "'code' is a required"),
    "no response": ({"request": {"method": "GET", "url": f"http://h/v1/sandboxes/{SID}",
                                 "headers": {}, "json": None}, "response": None,
                     "error": "ConnectError"}, "no response recorded"),
}


@case
def transcript_exchanges_pass(_):
    for r in GOOD:
        problems = openapi_check.check_record(r)
        check_eq(problems, [], f"{r['request']['method']} {r['request']['url']}")


@case
def violations_are_caught(_):
    for name, (r, needle) in BAD.items():
        problems = openapi_check.check_record(r)
        check(any(needle in p for p in problems), f"{name}: {problems} lacks {needle!r}")


@case
def routes_split_on_the_execd_prefixes(_):
    check_eq(openapi_check.split_route(f"{PROXY}/files/info"), ("execd", "/files/info"), "proxy")
    check_eq(openapi_check.split_route(f"{EXECD}/ping"), ("execd", "/ping"), "direct")
    check_eq(openapi_check.split_route(f"/v1/sandboxes/{SID}"), ("lifecycle", f"/sandboxes/{SID}"),
             "lifecycle under /v1")
    check_eq(openapi_check.split_route("/sandboxes"), ("lifecycle", "/sandboxes"), "at the root")


if __name__ == "__main__":
    sys.exit(run(None))
