"""Checks recorded HTTP exchanges against the OpenSandbox OpenAPI specs (tests/clients/specs).

A record (one JSON object, see record.py) holds the request (method, url, headers, JSON body
when there is one) and the response (status, headers, body: the first bytes of it, and whether
that is all of it). `check(records)` returns the list of violations, one string each:

- the route (method + path) is an operation of sandbox-lifecycle.yml (under /v1 or at the root,
  as the real server mounts both) or of execd-api.yaml (behind the gateway's execd prefixes
  /sandboxes/{id}/proxy/44772 and /v1/sandboxes/{id}/proxy/44772);
- required query parameters are present and integer/boolean ones parse;
- a JSON request body validates against the operation's requestBody schema;
- the response status is one the operation declares, or one of KNOWN_DEVIATIONS (statuses the
  real server answers although the spec does not list them, from the wire transcript, which wins
  where the two differ);
- the response Content-Type is one the status declares; a status that declares no content has
  an empty body;
- a complete JSON response body validates against the declared schema, and every event of a
  text/event-stream body (bare JSON objects separated by blank lines) against ServerStreamEvent.

One operation is not in the vendored spec: `POST /metrics/events`, the create-latency telemetry
the 1.1.1 SDKs send to the lifecycle server after each create (their generated lifecycle client
has it: a MetricsEvent body, 204). It is checked by `_check_metrics_event` instead.

Schemas are OpenAPI 3.1 (JSON Schema 2020-12 + the OpenAPI vocabulary), checked with
openapi-schema-validator's OAS31Validator; `$ref`s resolve inside their own spec document.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml
from openapi_schema_validator import OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_DIR = Path(__file__).resolve().parent.parent / "specs"
EXECD_PORT = "44772"
_EXECD_PREFIX = re.compile(r"^(?:/v1)?/sandboxes/[^/]+/proxy/" + EXECD_PORT + r"(/.*)?$")
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")

# Statuses the real server answers that the spec does not list (opensandbox-wire-transcript.md):
# FastAPI's request validation answers 422 {"detail": [...]} on any lifecycle route with a body
# or typed parameters, and a runtime without a feature answers 501 SANDBOX::API_NOT_SUPPORTED
# (as the real server's snapshot routes do; sbx serve does it for a provider without the
# extension a route needs); execd answers 401 on any route when its access token is wrong.
KNOWN_DEVIATIONS = {
    ("lifecycle", "*"): {"422", "501"},
    ("execd", "*"): {"401"},
}


def _pointer_escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class Spec:
    """One OpenAPI document: its operations by (method, path template) and a $ref registry."""

    def __init__(self, name: str, path: Path):
        self.name = name
        self.uri = f"urn:opensandbox:{name}"
        self.doc = yaml.safe_load(path.read_text())
        self.registry = Registry().with_resource(
            self.uri, Resource.from_contents(self.doc, default_specification=DRAFT202012)
        )
        self.routes = []  # (regex, literal segment count, template, {method: operation})
        for template, item in self.doc["paths"].items():
            regex = re.compile(
                "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
            )
            literal = sum(1 for seg in template.split("/") if seg and not seg.startswith("{"))
            ops = {m: op for m, op in item.items() if m in _METHODS}
            self.routes.append((regex, literal, template, ops, item.get("parameters", [])))

    def resolve(self, node):
        """Follows a local `$ref` (components/responses, components/parameters, ...)."""
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"non-local $ref {ref}")
            node = self.doc
            for token in ref[2:].split("/"):
                node = node[token.replace("~1", "/").replace("~0", "~")]
        return node

    def validator(self, pointer: str) -> OAS31Validator:
        """A validator for the schema at JSON pointer `pointer` of this document."""
        return OAS31Validator({"$ref": f"{self.uri}#{pointer}"}, registry=self.registry)

    def find(self, method: str, path: str):
        """(template, operation, path-level parameters) or None; the most literal match wins."""
        best = None
        for regex, literal, template, ops, params in self.routes:
            if regex.match(path) and method in ops:
                if best is None or literal > best[0]:
                    best = (literal, template, ops[method], params)
        return None if best is None else best[1:]


_SPECS: dict[str, Spec] = {}


def specs() -> dict[str, Spec]:
    if not _SPECS:
        _SPECS["lifecycle"] = Spec("lifecycle", SPEC_DIR / "sandbox-lifecycle.yml")
        _SPECS["execd"] = Spec("execd", SPEC_DIR / "execd-api.yaml")
    return _SPECS


def split_route(path: str) -> tuple[str, str]:
    """('execd', path inside execd) or ('lifecycle', path without /v1)."""
    m = _EXECD_PREFIX.match(path)
    if m:
        return "execd", m.group(1) or "/"
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:] or "/"
    return "lifecycle", path


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _schema_errors(spec: Spec, pointer: str, value) -> list[str]:
    errors = sorted(spec.validator(pointer).iter_errors(value), key=lambda e: list(e.path))
    out = []
    for e in errors[:5]:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        out.append(f"{where}: {e.message}")
    return out


def _check_parameters(spec, params, query, label, problems):
    for p in params:
        p = spec.resolve(p)
        if p.get("in") != "query":
            continue
        values = query.get(p["name"])
        if values is None:
            if p.get("required"):
                problems.append(f"{label}: required query parameter '{p['name']}' is missing")
            continue
        kind = (p.get("schema") or {}).get("type")
        for v in values:
            if kind == "integer" and not re.fullmatch(r"-?\d+", v):
                problems.append(f"{label}: query '{p['name']}={v}' is not an integer")
            if kind == "boolean" and v not in ("true", "false", "True", "False"):
                problems.append(f"{label}: query '{p['name']}={v}' is not a boolean")


def _check_metrics_event(label: str, req: dict, res: dict | None) -> list[str]:
    """POST /metrics/events, as the SDKs' generated client declares it: a MetricsEvent body
    (eventType "sandbox.create", createDurationMs >= 0, success, sandboxId?, image?), 204."""
    problems = []
    event = req.get("json")
    if not isinstance(event, dict):
        problems.append(f"{label}: request body is not a JSON object")
    else:
        if event.get("eventType") != "sandbox.create":
            problems.append(f"{label}: eventType {event.get('eventType')!r}")
        duration = event.get("createDurationMs")
        if not isinstance(duration, int) or isinstance(duration, bool) or duration < 0:
            problems.append(f"{label}: createDurationMs {duration!r}")
        if not isinstance(event.get("success"), bool):
            problems.append(f"{label}: success {event.get('success')!r}")
    if res is None:
        problems.append(f"{label}: no response recorded")
    elif res["status"] != 204:
        problems.append(f"{label}: status {res['status']}, expected 204")
    return problems


def check_record(record: dict) -> list[str]:
    req, res = record["request"], record.get("response")
    url = urlsplit(req["url"])
    method = req["method"].lower()
    api, path = split_route(url.path)
    spec = specs()[api]
    label = f"{req['method']} {url.path} ({api} {path})"
    if api == "lifecycle" and method == "post" and path == "/metrics/events":
        return _check_metrics_event(label, req, res)
    found = spec.find(method, path)
    if found is None:
        return [f"{label}: no such operation in {spec.name} spec"]
    template, op, path_params = found
    op_ptr = f"/paths/{_pointer_escape(template)}/{method}"
    label = f"{req['method']} {url.path} ({api} {template})"
    problems: list[str] = []

    query = parse_qs(url.query, keep_blank_values=True)
    _check_parameters(spec, list(path_params) + list(op.get("parameters", [])), query, label,
                      problems)

    body = op.get("requestBody")
    req_media = _media(req["headers"].get("content-type"))
    if body is not None:
        body = spec.resolve(body)
        declared = body.get("content", {})
        if body.get("required") and req.get("body_bytes") == 0:
            problems.append(f"{label}: request has no body but the spec requires one")
        if req_media and req_media not in declared:
            problems.append(f"{label}: request Content-Type {req_media} not in {list(declared)}")
        if req.get("json") is not None and "application/json" in declared:
            ptr = f"{op_ptr}/requestBody/content/application~1json/schema"
            if "$ref" in op["requestBody"]:
                ref = op["requestBody"]["$ref"][1:]
                ptr = f"{ref}/content/application~1json/schema"
            for err in _schema_errors(spec, ptr, req["json"]):
                problems.append(f"{label}: request body: {err}")

    if res is None:
        problems.append(f"{label}: no response recorded ({record.get('error', 'unknown')})")
        return problems
    status = str(res["status"])
    responses = op.get("responses", {})
    if status not in responses:
        allowed = KNOWN_DEVIATIONS.get((api, "*"), set()) | KNOWN_DEVIATIONS.get(
            (api, f"{method.upper()} {template}"), set()
        )
        if status not in allowed:
            problems.append(f"{label}: status {status} not declared (declared: {list(responses)})")
        return problems
    resp_ptr = f"{op_ptr}/responses/{status}"
    response = responses[status]
    if "$ref" in response:
        resp_ptr = response["$ref"][1:]
    response = spec.resolve(response)
    declared = response.get("content") or {}
    media = _media(res["headers"].get("content-type"))
    raw = res.get("body", "")
    if not declared:
        if raw:
            problems.append(f"{label}: status {status} declares no content but the body is "
                            f"{raw[:80]!r}")
        return problems
    if media not in declared:
        problems.append(f"{label}: response Content-Type '{media}' not in {list(declared)}")
        return problems
    schema_ptr = f"{resp_ptr}/content/{_pointer_escape(media)}/schema"
    if "schema" not in declared[media]:
        return problems
    if media == "application/json":
        if not res.get("complete", False):
            return problems  # only the start of a long body was kept
        try:
            value = json.loads(raw)
        except ValueError as e:
            problems.append(f"{label}: response is not JSON ({e}): {raw[:80]!r}")
            return problems
        for err in _schema_errors(spec, schema_ptr, value):
            problems.append(f"{label}: response body: {err}")
    elif media == "text/event-stream":
        events = raw.replace("\r\n", "\n").split("\n")
        if not res.get("complete", False) and events:
            events = events[:-1]  # the last line may be cut
        for line in events:
            line = line.strip()
            if not line or line.startswith((":", "event:", "id:", "retry:")):
                continue
            if line.startswith("data:"):
                problems.append(f"{label}: event has a 'data:' prefix (execd sends bare JSON)")
                line = line[5:].strip()
            try:
                value = json.loads(line)
            except ValueError as e:
                problems.append(f"{label}: event is not JSON ({e}): {line[:80]!r}")
                continue
            for err in _schema_errors(spec, schema_ptr, value):
                problems.append(f"{label}: event {line[:60]!r}: {err}")
    return problems


def check(records: list[dict]) -> list[str]:
    problems = []
    for r in records:
        problems.extend(check_record(r))
    return problems


def load_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    records = []
    for name in argv[1:]:
        records.extend(load_records(Path(name)))
    problems = check(records)
    for p in problems:
        print(f"openapi: {p}")
    print(f"openapi: {len(records)} exchanges checked, {len(problems)} violations")
    return 1 if problems or not records else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
