// The official JavaScript SDK (npm @alibaba-group/opensandbox, pinned in package.json) on the
// machine's Node 20 against `sbx serve`: create, a command's stdout and exit code, a failing
// command, write and read a file, kill.
//
// Run by harness/with_serve.py (OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY when the server has
// a key, SBX_CLIENTS_USE_SERVER_PROXY, SBX_CLIENTS_RECORD) with SBX_CLIENTS_NPM = the npm
// prefix the set-up installed the SDK into. Every exchange is recorded (harness/record.mjs) and
// validated against the OpenAPI specs afterwards. Prints "N passed, N failed"; exit 1 on any
// failure.

import { createRequire } from "node:module";
import { join } from "node:path";
import { install, flush } from "./harness/record.mjs";

install(); // before the SDK creates its transport

const prefix = process.env.SBX_CLIENTS_NPM;
if (!prefix) throw new Error("SBX_CLIENTS_NPM is not set (run through tests/clients/run.sh)");
const require = createRequire(join(prefix, "package.json"));
const { Sandbox, ConnectionConfig } = require("@alibaba-group/opensandbox");

const useServerProxy = process.env.SBX_CLIENTS_USE_SERVER_PROXY === "1";
let passed = 0;
let failed = 0;
let sandbox = null;
let killed = false;

function check(condition, message) {
  if (!condition) throw new Error(message);
}
function checkEq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: expected ${e}, got ${a}`);
}
async function testCase(name, fn) {
  const start = Date.now();
  try {
    await fn();
    passed += 1;
    console.log(`PASS ${name} (${((Date.now() - start) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name} (${((Date.now() - start) / 1000).toFixed(1)} s)`);
    console.log(e?.stack ?? String(e));
  }
}
function box() {
  check(sandbox !== null, "no sandbox (create failed)");
  return sandbox;
}

// Domain and key from OPEN_SANDBOX_DOMAIN / OPEN_SANDBOX_API_KEY, as a user's would.
const connectionConfig = new ConnectionConfig({ useServerProxy, requestTimeoutSeconds: 120 });

await testCase("create", async () => {
  sandbox = await Sandbox.create({
    image: "sbx-busybox:latest",
    timeoutSeconds: 1200,
    metadata: { suite: "clients", client: "javascript" },
    readyTimeoutSeconds: 60,
    connectionConfig,
  });
  check(sandbox.id, "no sandbox id");
  const info = await sandbox.getInfo();
  checkEq(info.status.state, "Running", "state after create");
  checkEq(info.metadata, { suite: "clients", client: "javascript" }, "metadata");
  check(await sandbox.isHealthy(), "ping failed");
});

await testCase("command stdout and exit code", async () => {
  const execution = await box().commands.run("echo hello; echo world");
  checkEq(execution.logs.stdout.map((m) => m.text), ["hello", "world"], "stdout lines");
  checkEq(execution.logs.stderr.length, 0, "stderr lines");
  checkEq(execution.exitCode, 0, "exit code");
  check(!execution.error, `unexpected error ${JSON.stringify(execution.error)}`);
  check(execution.id, "no command id from init");
});

await testCase("failing command", async () => {
  const execution = await box().commands.run("echo out; echo oops >&2; exit 3");
  checkEq(execution.logs.stdout.map((m) => m.text), ["out"], "stdout");
  checkEq(execution.logs.stderr.map((m) => m.text), ["oops"], "stderr");
  checkEq(execution.exitCode, 3, "exit code");
  check(execution.error, "no error event");
  checkEq(execution.error.name, "CommandExecError", "error name");
  checkEq(execution.error.value, "3", "error value");
});

await testCase("write and read a file", async () => {
  await box().files.writeFiles([{ path: "/tmp/js/hello.txt", data: "hello from js\n", mode: 644 }]);
  checkEq(await box().files.readFile("/tmp/js/hello.txt"), "hello from js\n", "read back");
  const execution = await box().commands.run("cat /tmp/js/hello.txt");
  checkEq(execution.logs.stdout.map((m) => m.text), ["hello from js"], "cat in the sandbox");
});

await testCase("kill", async () => {
  await box().kill();
  killed = true;
  let status = null;
  try {
    await box().getInfo();
  } catch (e) {
    status = e?.statusCode ?? e?.status ?? e?.error?.statusCode ?? "thrown";
  }
  check(status !== null, "getInfo after kill did not fail");
  checkEq(status, 404, "getInfo after kill");
});

if (sandbox !== null) {
  if (!killed) {
    try {
      await sandbox.kill();
    } catch (e) {
      console.log(`cleanup kill failed: ${e}`);
    }
  }
  await sandbox.close();
}
await flush();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
