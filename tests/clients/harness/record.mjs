// Records every HTTP exchange made through the global fetch (the JavaScript SDK's transport) in
// the same JSON-lines format as record.py, for openapi_check.py.
//
// install() replaces globalThis.fetch; it must run before the SDK builds its ConnectionConfig
// transport (which captures `fetch` then). The request is noted as it goes out (a JSON body is
// kept); the response is cloned and the clone read to its end in the background, keeping the
// first MAX_BODY bytes; flush() waits for those reads and appends the records to
// $SBX_CLIENTS_RECORD. Single-threaded (Node's event loop); call flush() once, at the end.

import { appendFileSync } from "node:fs";

const MAX_BODY = 256 * 1024;
const SECRET = new Set(["open-sandbox-api-key", "x-execd-access-token", "authorization"]);
const pending = [];

function headerObject(headers) {
  const out = {};
  for (const [k, v] of new Headers(headers ?? {}).entries()) {
    out[k.toLowerCase()] = SECRET.has(k.toLowerCase()) ? "<redacted>" : v;
  }
  return out;
}

async function readCapped(response) {
  const kept = [];
  let keptBytes = 0;
  let size = 0;
  if (!response.body) return { body: "", size: 0, complete: true };
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (keptBytes < MAX_BODY) {
      const part = value.subarray(0, MAX_BODY - keptBytes);
      kept.push(part);
      keptBytes += part.length;
    }
  }
  return { body: Buffer.concat(kept).toString("utf8"), size, complete: size <= MAX_BODY };
}

async function requestRecord(input, init) {
  const request = input instanceof Request ? input : null;
  const method = (init?.method ?? request?.method ?? "GET").toUpperCase();
  const url = request ? request.url : String(input);
  const headers = headerObject(init?.headers ?? request?.headers);
  const body = init?.body ?? request?.body ?? null;
  // fetch sets a FormData body's Content-Type (with its boundary) itself.
  if (!headers["content-type"] && body instanceof FormData) {
    headers["content-type"] = "multipart/form-data";
  }
  let bodyBytes = null; // unknown (a stream, a form)
  if (body === null) bodyBytes = 0;
  else if (typeof body === "string") bodyBytes = Buffer.byteLength(body);
  let json = null;
  const type = headers["content-type"] ?? "";
  if (type.startsWith("application/json")) {
    try {
      if (typeof init?.body === "string") json = JSON.parse(init.body);
      else if (request && request.body) json = JSON.parse(await request.clone().text());
    } catch {
      json = { "<not json>": true };
    }
  }
  return { method, url, headers, json, body_bytes: bodyBytes };
}

export function install() {
  const original = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const req = await requestRecord(input, init);
    let response;
    try {
      response = await original(input, init);
    } catch (e) {
      pending.push(Promise.resolve({ request: req, response: null, error: String(e) }));
      throw e;
    }
    const copy = response.clone();
    pending.push(
      readCapped(copy).then(
        (body) => ({
          request: req,
          response: { status: response.status, headers: headerObject(response.headers), ...body },
        }),
        (e) => ({
          request: req,
          response: { status: response.status, headers: headerObject(response.headers), body: "",
                      size: 0, complete: false },
          note: `body not read: ${e}`,
        }),
      ),
    );
    return response;
  };
}

// Waits up to `timeoutMs` for the background reads; a body still open then is recorded as cut.
export async function flush(timeoutMs = 60000) {
  const path = process.env.SBX_CLIENTS_RECORD;
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve(null), timeoutMs);
  });
  const records = (await Promise.all(pending.splice(0).map((p) => Promise.race([p, late]))))
    .filter((r) => r !== null);
  clearTimeout(timer);
  if (!path) return;
  for (const r of records) appendFileSync(path, JSON.stringify(r) + "\n");
}
