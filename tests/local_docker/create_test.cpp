// local_docker create: TTL, entrypoint, startup files, resources, ports and endpoints, volumes,
// pull policies, provider options, config validation, and every failure path leaving nothing.

#include "support.hpp"

#include <sbx/sdk/http.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

using namespace std::chrono_literals;
using ldtest::contains;
using ldtest::create_failure;
using ldtest::docker;
using ldtest::options_with;
using ldtest::provider;
using ldtest::provider_with;
using ldtest::seconds_since;
using ldtest::Tracked;
using ldtest::what_of;

TEST_CASE("TTL: the container ends and removes itself, without close") {
  auto spec = ldtest::spec();
  spec.ttl_s = 2;
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  const auto inspect = docker().inspect(id);
  REQUIRE(inspect);
  CHECK(inspect->at("HostConfig").at("AutoRemove").as_bool());
  CHECK(box.exec("echo alive").stdout_text == "alive\n");
  box.detach();  // the host forgets it: only the TTL can end it now
  CHECK(docker().wait_gone(id, 20s));
}

TEST_CASE("a TTL that ends during a command: NOT_FOUND naming the expiry, not a result") {
  auto spec = ldtest::spec();
  spec.ttl_s = 3;
  sbx::Sandbox box = provider().create(spec);
  const auto start = std::chrono::steady_clock::now();
  std::string out;
  sbx::ExecOptions options;
  options.on_output = [&out](sbx::OutputStream, std::string_view bytes) { out += bytes; };
  // The sandbox is gone (docs/sandbox-semantics.md, "Closed and gone sandboxes"): the agent says
  // why when it kills the command, Docker exec's path asks the daemon.
  try {
    const auto r = box.exec("echo started; sleep 10; echo never", options);
    FAIL("a command the TTL cut short has no result, got " << r.return_code);
  } catch (const sbx::NotFoundError& e) {
    CHECK_MESSAGE(contains(e.what(), "sandbox " + box.id() + " has expired"), e.what());
  }
  const double took = seconds_since(start);
  CHECK(out == "started\n");
  CHECK(took < 8.0);  // ended with the sandbox, not after the sleep
  // A command that ends by itself before the TTL keeps its own status, also a signal's.
  auto short_lived = ldtest::spec();
  short_lived.ttl_s = 30;
  sbx::Sandbox other = provider().create(short_lived);
  const auto killed = other.exec("kill -9 $$");
  CHECK(killed.return_code == 137);
  CHECK_FALSE(killed.error_type);
  other.close();
  box.close();
}

TEST_CASE("no TTL: the keep-alive process, no self-removal") {
  auto spec = ldtest::spec();
  spec.ttl_s.reset();
  sbx::Sandbox box = provider().create(spec);
  const auto inspect = docker().inspect(box.id());
  CHECK_FALSE(inspect->at("HostConfig").at("AutoRemove").as_bool());
  CHECK_FALSE(inspect->at("Config").at("Labels").as_object().contains("sbx.expires_at"));
  box.close();
}

TEST_CASE("entrypoint: runs as the main process, with its arguments intact") {
  auto spec = ldtest::spec();
  spec.ttl_s.reset();
  spec.entrypoint = {"sh", "-c", "echo \"$0|$1\" > /tmp/args; exec sleep 600", "a b", "c'd"};
  sbx::Sandbox box = provider().create(spec);
  CHECK(box.exec("cat /tmp/args").stdout_text == "a b|c'd\n");
  box.close();
}

TEST_CASE("an image whose USER is not root: commands, the entrypoint and connect run as it") {
  // sbx-busybox-user (scripts/docker-up.sh) is busybox with `USER sbx` (uid 1000). Commands that
  // name no user run as sbx, others as whom they name; uploads are root's, as the archive API
  // writes them. With the agent, the agent runs as root in the image user's place.
  auto spec = ldtest::spec();
  spec.image = "sbx-busybox-user:latest";
  spec.ttl_s.reset();
  spec.entrypoint = {"sh", "-c", "id -u > /tmp/ep; exec sleep 600"};
  sbx::Sandbox box = provider().create(spec);
  CHECK(box.exec("id -u").stdout_text == "1000\n");
  CHECK(box.exec("cat /tmp/ep").stdout_text == "1000\n");
  sbx::ExecOptions as_root;
  as_root.user = "root";
  CHECK(box.exec("id -u", as_root).stdout_text == "0\n");
  box.upload_bytes("uploaded", "/tmp/up.txt");
  CHECK(box.exec("stat -c '%u %a' /tmp/up.txt").stdout_text == "0 644\n");
  CHECK(box.download_bytes("/tmp/up.txt") == "uploaded");
  // A handle made elsewhere knows the default user too.
  sbx::Sandbox again = provider().connect(box.serialize());
  CHECK(again.exec("id -u").stdout_text == "1000\n");
  again.detach();
  box.close();
  // Without an entrypoint: the agent's own keep-alive, commands still as the image's user.
  spec.entrypoint.reset();
  sbx::Sandbox plain = provider().create(spec);
  CHECK(plain.exec("id -u").stdout_text == "1000\n");
  plain.close();
}

TEST_CASE("entrypoint with a TTL: the watchdog ends it and the container removes itself") {
  auto spec = ldtest::spec();
  spec.ttl_s = 3;
  spec.entrypoint = {"sh", "-c", "echo started > /tmp/ep; exec sleep 600"};
  sbx::Sandbox box = provider().create(spec);
  const std::string id = box.id();
  CHECK(box.exec("cat /tmp/ep").stdout_text == "started\n");
  // The entrypoint is alive under the watchdog.
  CHECK(box.exec("ps -o args | grep -c '^sleep 600'").stdout_text == "1\n");
  box.detach();
  CHECK(docker().wait_gone(id, 25s));
}

TEST_CASE("entrypoint that exits: create fails with the reason, nothing left behind") {
  Tracked t;
  t.spec.entrypoint = {"sh", "-c", "exit 3"};
  const auto start = std::chrono::steady_clock::now();
  try {
    provider().create(t.spec);
    FAIL("create must fail");
  } catch (const sbx::CreateError& e) {
    CHECK(contains(e.what(), "exit code 3"));
    CHECK(contains(e.what(), "an entrypoint must keep running"));
  }
  CHECK(seconds_since(start) < 15);
  CHECK(t.left().empty());
}

TEST_CASE("an environment the kernel would refuse is INVALID_ARGUMENT up front, nothing created") {
  Tracked t;
  t.spec.env["BIG"] = std::string(1 << 20, 'v');  // 1 MiB in one string: over MAX_ARG_STRLEN
  const auto start = std::chrono::steady_clock::now();
  std::string error = what_of([&] { provider().create(t.spec); });
  CHECK_MESSAGE(contains(error, "spec.env: BIG is 1048580 bytes"), error);
  CHECK(contains(error, "131071"));
  CHECK_FALSE(contains(error, "entrypoint must keep running"));
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(seconds_since(start) < 2.0);  // refused before the daemon did anything
  // Each string within the limit, all together over 1 MiB.
  t.spec.env.clear();
  for (int i = 0; i < 12; ++i)
    t.spec.env["V" + std::to_string(i)] = std::string(100000, 'v');
  error = what_of([&] { provider().create(t.spec); });
  CHECK_MESSAGE(contains(error, "1048576"), error);
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  // An entrypoint argument too long for execve.
  t.spec.env.clear();
  t.spec.entrypoint = {"sh", "-c", "sleep 600; : " + std::string(200000, 'x')};
  error = what_of([&] { provider().create(t.spec); });
  CHECK_MESSAGE(contains(error, "spec.entrypoint[2]"), error);
  CHECK(t.left().empty());
  // Within the limits it works, and every command gets the environment.
  auto fine = ldtest::spec();
  fine.env["BIG"] = std::string(100000, 'v');
  sbx::Sandbox box = provider().create(fine);
  CHECK(box.exec("echo ${#BIG}").stdout_text == "100000\n");
  box.close();
}

TEST_CASE("spec strings that are not valid UTF-8 are INVALID_ARGUMENT, nothing created") {
  const std::string bad = "bad\xff";
  struct Case {
    const char* what;
    std::function<void(sbx::SandboxSpec&)> spoil;
  };
  const Case cases[] = {
      {"env value", [&](sbx::SandboxSpec& s) { s.env["GOOD_NAME"] = bad; }},
      {"env name", [&](sbx::SandboxSpec& s) { s.env[bad] = "good value"; }},
      {"metadata value", [&](sbx::SandboxSpec& s) { s.metadata["team"] = bad; }},
      {"metadata key", [&](sbx::SandboxSpec& s) { s.metadata[bad] = "x"; }},
      {"workdir", [&](sbx::SandboxSpec& s) { s.workdir = "/work/" + bad; }},
      {"entrypoint",
       [&](sbx::SandboxSpec& s) {
         s.entrypoint = {"sleep", bad};
       }},
      {"startup file path", [&](sbx::SandboxSpec& s) { s.files["/etc/" + bad] = "x"; }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Tracked t;
    c.spoil(t.spec);
    const std::string error = what_of([&] { provider().create(t.spec); });
    // Refused by the plugin (which shows the bytes as \xNN) or, as the ABI requires UTF-8, by
    // the SDK or the host before it: either way before the daemon sees anything.
    CHECK_MESSAGE(contains(error, "not valid UTF-8"), error);
    CHECK_THROWS_AS(provider().create(t.spec), sbx::InvalidArgumentError);  // by the host
    CHECK(t.left().empty());
  }
  // Valid UTF-8 beyond ASCII arrives byte for byte.
  auto spec = ldtest::spec();
  const std::string text =
      "gr\xc3\xbc\xc3\x9f"
      "e \xf0\x9f\x98\x80";
  spec.env["GREETING"] = text;
  spec.metadata["note"] = text;
  sbx::Sandbox box = provider().create(spec);
  CHECK(box.exec("printf %s \"$GREETING\"").stdout_text == text);
  CHECK(docker().inspect(box.id())->at("Config").at("Labels").at("note").as_string() == text);
  // Commands, exec env and cwd cross the same JSON.
  CHECK_THROWS_AS(box.exec("echo " + bad), sbx::InvalidArgumentError);
  CHECK_THROWS_AS(box.exec("echo", {.env = {{"X", bad}}}), sbx::InvalidArgumentError);
  CHECK_THROWS_AS(box.exec("echo", {.cwd = "/" + bad}), sbx::InvalidArgumentError);
  CHECK(box.exec("echo " + text).stdout_text == text + "\n");
  box.close();
}

TEST_CASE("an image whose environment the kernel refuses: the reason, not the entrypoint hint") {
  // An image with a 1.5 MiB environment string (committed from a container that never ran): the
  // runtime's execve of the container's first process fails with E2BIG.
  const std::string image = "sbx-test-bigenv:" + ldtest::unique();
  const boost::json::object body{
      {"Image", ldtest::kBusybox},
      {"Env", boost::json::array{"BIG=" + std::string(1536 * 1024, 'e')}},
      {"Labels", boost::json::object{{ldtest::kSuiteLabel, "image"}}}};
  const auto created = docker().send("POST", "/containers/create", boost::json::serialize(body));
  REQUIRE_MESSAGE(created.status == 201, created.body);
  const std::string source(boost::json::parse(created.body).at("Id").as_string());
  const auto committed = docker().send(
      "POST", "/commit?container=" + source + "&repo=sbx-test-bigenv&tag=" + image.substr(16),
      "{}");
  docker().remove(source);
  REQUIRE_MESSAGE(committed.status == 201, committed.body);

  Tracked t;
  t.spec.image = image;
  t.spec.ttl_s.reset();  // without AutoRemove the container's output can still be read
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK_MESSAGE(contains(error, "argument list too long"), error);
  CHECK_MESSAGE(!contains(error, "entrypoint must keep running"), error);
  CHECK(t.left().empty());
  docker().untag_image(image);
}

TEST_CASE("startup files: absolute, nested, relative to the workdir, relative without one") {
  auto spec = ldtest::spec();
  spec.workdir = "/work";
  spec.files = {{"/etc/sbx/app.conf", "key=value\n"},
                {"/deep/a/b/c/file.txt", "deep"},
                {"rel/notes.txt", "relative to workdir"},
                {"top.txt", "top"}};
  sbx::Sandbox box = provider().create(spec);
  CHECK(box.exec("cat /etc/sbx/app.conf").stdout_text == "key=value\n");
  CHECK(box.exec("cat /deep/a/b/c/file.txt").stdout_text == "deep");
  CHECK(box.exec("cat /work/rel/notes.txt").stdout_text == "relative to workdir");
  CHECK(box.exec("cat /work/top.txt").stdout_text == "top");
  CHECK(box.exec("stat -c %a /work/top.txt").stdout_text == "644\n");
  box.close();

  auto no_workdir = ldtest::spec();
  no_workdir.files = {{"at-root.txt", "root"}};
  sbx::Sandbox root_box = provider().create(no_workdir);
  CHECK(root_box.exec("cat /at-root.txt").stdout_text == "root");
  root_box.close();
}

TEST_CASE("startup files on a read-only root file system fail create, nothing left behind") {
  sbx::Host host(options_with(R"({"create": {"read_only": true}})"));
  Tracked t;
  t.spec.files = {{"/etc/x.txt", "x"}};
  CHECK_THROWS_AS(provider_with(host).create(t.spec), sbx::CreateError);
  CHECK(t.left().empty());
  // Without files a read-only sandbox works, and cannot write its root.
  auto plain = ldtest::spec();
  sbx::Sandbox box = provider_with(host).create(plain);
  CHECK(box.exec("touch /x").return_code != 0);
  CHECK(box.exec("touch /tmp/x").return_code != 0);
  box.close();
}

TEST_CASE("resources: cpu and memory are applied as a hard cap") {
  auto spec = ldtest::spec();
  spec.resources.cpu = 0.5;
  spec.resources.memory_mib = 64;
  sbx::Sandbox box = provider().create(spec);
  const auto host_config = docker().inspect(box.id())->at("HostConfig").as_object();
  CHECK(host_config.at("NanoCpus").as_int64() == 500'000'000);
  CHECK(host_config.at("Memory").as_int64() == 64 * 1024 * 1024);
  CHECK(host_config.at("MemorySwap").as_int64() == 64 * 1024 * 1024);
  // 16 MB fits; 200 MB in one shell variable does not: the OOM killer ends it.
  CHECK(box.exec("x=$(head -c 16000000 /dev/zero | tr '\\0' a); echo ${#x}").stdout_text ==
        "16000000\n");
  const auto big = box.exec("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}");
  CHECK(big.return_code != 0);
  CHECK(big.stdout_text != "200000000\n");
  box.close();

  sbx::Sandbox unlimited = provider("docker_no_limits").create(spec);
  const auto free_config = docker().inspect(unlimited.id())->at("HostConfig").as_object();
  CHECK(free_config.at("NanoCpus").as_int64() == 0);
  CHECK(free_config.at("Memory").as_int64() == 0);
  unlimited.close();
}

TEST_CASE("invalid resource values are INVALID_ARGUMENT and leave nothing behind") {
  Tracked t;
  t.spec.resources.memory_mib = 1;  // the daemon's minimum is 6 MB
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  t.spec.resources.memory_mib.reset();
  t.spec.resources.cpu = 512;  // more CPUs than the machine has
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  t.spec.resources.cpu = 0;
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  t.spec.resources.cpu = 1e-10;  // would round to NanoCpus 0, which Docker reads as unlimited
  CHECK_THROWS_WITH_AS(provider().create(t.spec), doctest::Contains("0.01"), sbx::CreateError);
  CHECK(t.left().empty());
}

TEST_CASE("disk_gib: refused where the storage driver cannot enforce it, or a warning") {
  Tracked t;
  t.spec.resources.disk_gib = 5;
  if (docker().storage_supports_size_limit()) {
    sbx::Sandbox box = provider().create(t.spec);
    const auto opts = docker().inspect(box.id())->at("HostConfig").at("StorageOpt").as_object();
    CHECK(opts.at("size").as_string() == "5G");
    box.close();
    return;
  }
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "disk_gib=5"));
  CHECK(contains(error, "disk_limit"));
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(t.left().empty());

  sbx::Sandbox box = provider("docker_disk_warn").create(t.spec);
  CHECK(box.exec("echo works").stdout_text == "works\n");
  const auto host_config = docker().inspect(box.id())->at("HostConfig").as_object();
  CHECK((!host_config.contains("StorageOpt") || host_config.at("StorageOpt").is_null() ||
         host_config.at("StorageOpt").as_object().empty()));
  box.close();
}

TEST_CASE("gpu: a clear error and nothing left behind (no GPU here); gpu_type is refused") {
  Tracked t;
  t.spec.resources.gpu = 1;
  sbx::Host host(options_with(R"({"create": {"allow_gpu": true}})"));
  const std::string error = what_of([&] { provider_with(host).create(t.spec); });
  CHECK(contains(error, "gpu"));
  CHECK_FALSE(contains(error, "allow_gpu"));  // allowed: the daemon's own refusal
  CHECK_THROWS_AS(provider_with(host).create(t.spec), sbx::CreateError);
  CHECK(t.left().empty());

  t.spec.resources.gpu.reset();
  t.spec.resources.gpu_type = "H100";
  const std::string type_error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(type_error, "gpu_type"));
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(t.left().empty());
}

TEST_CASE("ports: the endpoint reaches a server in the sandbox (network bridge)") {
  auto spec = ldtest::spec();
  spec.ports = {8000, 9000};
  spec.files = {{"/www/index.html", "hello from the sandbox\n"}};
  sbx::Sandbox box = provider("docker_bridge").create(spec);
  REQUIRE(box.exec("httpd -p 8000 -h /www").return_code == 0);

  const sbx::Endpoint endpoint = box.endpoint(8000);
  CHECK(endpoint.url.rfind("http://127.0.0.1:", 0) == 0);
  CHECK(endpoint.headers.empty());
  const auto host_config = docker().inspect(box.id())->at("HostConfig").as_object();
  CHECK(host_config.at("PortBindings").at("8000/tcp").at(0).at("HostIp").as_string() ==
        "127.0.0.1");

  sbx::sdk::http::Client client({.base_url = endpoint.url});
  std::string body;
  for (int attempt = 0; attempt < 50 && body.empty(); ++attempt) {
    try {
      sbx::sdk::http::Request request;
      request.target = "/index.html";
      request.timeout = 5s;
      const auto response = client.send(std::move(request));
      if (response.status == 200) body = response.body;
    } catch (const std::exception&) {
    }
    if (body.empty()) std::this_thread::sleep_for(100ms);
  }
  CHECK(body == "hello from the sandbox\n");
  CHECK(box.endpoint(9000).url != endpoint.url);  // declared, published, nobody listening yet
  CHECK_THROWS_AS(box.endpoint(7000), sbx::InvalidArgumentError);  // not declared
  box.close();
}

TEST_CASE("ports need a network") {
  Tracked t;
  t.spec.ports = {8000};
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "network"));
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(t.left().empty());
}

TEST_CASE("volumes from provider_options: bind strings and mount objects") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sbx-volume-" + ldtest::unique());
  fs::create_directories(dir);
  std::ofstream(dir / "shared.txt") << "from the host";
  auto spec = ldtest::spec();
  spec.provider_options["volumes"] = boost::json::array{
      (dir.string() + ":/data:ro"),
      boost::json::object{{"source", dir.string()}, {"target", "/rw"}, {"read_only", false}}};
  sbx::Sandbox box = provider("docker_volumes").create(spec);
  CHECK(box.exec("cat /data/shared.txt").stdout_text == "from the host");
  CHECK(box.exec("touch /data/nope").return_code != 0);  // read-only
  CHECK(box.exec("echo written > /rw/out.txt").return_code == 0);
  box.close();
  CHECK(fs::exists(dir / "out.txt"));
  fs::remove_all(dir);

  Tracked t;
  t.spec.provider_options["volumes"] = boost::json::array{"relative-target-only"};
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "provider_options.volumes[0]"));
  CHECK(t.left().empty());
}

TEST_CASE("unknown provider option: INVALID_ARGUMENT naming it and the supported ones") {
  Tracked t;
  t.spec.provider_options["run_args"] = "--privileged";
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "run_args"));
  CHECK(contains(error, "volumes"));
  CHECK(contains(error, "registry_auth"));
  CHECK(contains(error, "image_pull_policy"));
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  t.spec.provider_options = {};
  t.spec.provider_options["image_pull_policy"] = "Sometimes";
  CHECK(contains(what_of([&] { provider().create(t.spec); }), "image_pull_policy"));
  CHECK(t.left().empty());
}

TEST_CASE("pull policy Never: a missing image is a clear NOT_FOUND error") {
  Tracked t;
  t.spec.image = "127.0.0.1:5000/sbx/never-pulled-" + t.run + ":latest";
  t.spec.provider_options["image_pull_policy"] = "Never";
  try {
    provider().create(t.spec);
    FAIL("create must fail");
  } catch (const sbx::CreateError& e) {  // as every failure of create; the reason is NOT_FOUND
    CHECK(e.status() == SBX_STATUS_NOT_FOUND);
    CHECK(e.reason() == SBX_REASON_IMAGE_PULL_FAILED);  // the image cannot be had, as a pull
    CHECK(contains(e.what(), "is not present and image_pull_policy is Never"));
    CHECK(contains(e.what(), *t.spec.image));
  }
  CHECK(t.left().empty());
}

TEST_CASE("OpenSandbox extensions (as sbx serve passes them): the pull policy, poolRef refused") {
  Tracked t;
  t.spec.image = "127.0.0.1:5000/sbx/never-pulled-" + t.run + ":latest";
  // Either key names the pull policy: Never makes the missing image a NOT_FOUND without a pull.
  for (const char* key : {"imagePullPolicy", "opensandbox.extensions.image-pull-policy"}) {
    CAPTURE(key);
    t.spec.provider_options = {};
    t.spec.provider_options["extensions"] = boost::json::object{{key, "Never"}, {"hint", "x"}};
    CHECK(create_failure(provider(), t.spec) == SBX_STATUS_NOT_FOUND);
    CHECK(contains(what_of([&] { provider().create(t.spec); }), "image_pull_policy is Never"));
  }
  t.spec.provider_options["extensions"] = boost::json::object{{"imagePullPolicy", "Sometimes"}};
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(contains(what_of([&] { provider().create(t.spec); }),
                 "provider_options.extensions.imagePullPolicy: must be one of"));
  t.spec.provider_options["extensions"] = boost::json::object{{"poolRef", "pool-a"}};
  CHECK(contains(what_of([&] { provider().create(t.spec); }), "poolRef: is not supported"));
  t.spec.provider_options["extensions"] = boost::json::object{{"imagePullPolicy", 1}};
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_INVALID_ARGUMENT);
  CHECK(t.left().empty());
}

TEST_CASE("pull policies Always and IfNotPresent pull from the local registry") {
  auto spec = ldtest::spec(ldtest::kRegistryBusybox);
  docker().untag_image(ldtest::kRegistryBusybox);
  REQUIRE_FALSE(docker().image_exists(ldtest::kRegistryBusybox));
  spec.provider_options["image_pull_policy"] = "IfNotPresent";
  sbx::Sandbox first = provider().create(spec);
  CHECK(docker().image_exists(ldtest::kRegistryBusybox));
  CHECK(first.exec("echo pulled").stdout_text == "pulled\n");
  first.close();

  docker().untag_image(ldtest::kRegistryBusybox);
  sbx::Sandbox always = provider().create([&] {
    auto s = ldtest::spec("docker://" + std::string(ldtest::kRegistryBusybox));
    s.provider_options["image_pull_policy"] = "Always";
    return s;
  }());
  CHECK(docker().image_exists(ldtest::kRegistryBusybox));
  always.close();
}

TEST_CASE("a pull that fails: a clear error, nothing left behind") {
  Tracked t;
  t.spec.image = "127.0.0.1:5000/sbx/does-not-exist-" + t.run + ":latest";
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "pulling image " + *t.spec.image));
  CHECK(contains(error, "not found"));
  // The reason says it was the pull, whatever the status (ABI 1.2; sbx serve answers the real
  // server's DOCKER::SANDBOX_IMAGE_PULL_FAILED from it).
  const auto reason_of = [&] {
    try {
      provider().create(t.spec);
    } catch (const sbx::Error& e) {
      CHECK(e.create_failure());
      return e.reason();
    }
    return std::string("(created)");
  };
  CHECK(reason_of() == SBX_REASON_IMAGE_PULL_FAILED);
  // A registry that is not there at all.
  t.spec.image = "127.0.0.1:5999/sbx/busybox:latest";
  t.spec.provider_options["image_pull_policy"] = "Always";
  CHECK_THROWS_AS(provider().create(t.spec), sbx::CreateError);
  CHECK(reason_of() == SBX_REASON_IMAGE_PULL_FAILED);
  CHECK(t.left().empty());
}

TEST_CASE("registry_auth is accepted and validated") {
  auto spec = ldtest::spec(ldtest::kRegistryBusybox);
  spec.provider_options["image_pull_policy"] = "Always";
  spec.provider_options["registry_auth"] = boost::json::object{
      {"username", "u"}, {"password", "secret-pw"}, {"serveraddress", "127.0.0.1:5000"}};
  sbx::Sandbox box = provider().create(spec);  // the open registry ignores the credentials
  box.close();
  Tracked t;
  t.spec.provider_options["registry_auth"] = boost::json::object{{"username", "only-user"}};
  const std::string error = what_of([&] { provider().create(t.spec); });
  CHECK(contains(error, "provider_options.registry_auth"));
  CHECK_FALSE(contains(error, "secret-pw"));
}

TEST_CASE("spec.image is required") {
  auto spec = ldtest::spec();
  spec.image.reset();
  CHECK_THROWS_WITH_AS(provider().create(spec), doctest::Contains("spec.image is required"),
                       sbx::CreateError);
  CHECK(create_failure(provider(), spec) == SBX_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("invalid configs are refused with the JSON path") {
  struct Case {
    const char* config;
    const char* path;
  };
  const Case cases[] = {
      {R"({"bogus": 1})", "$.bogus"},
      {R"({"create": {"pids_limit": 0}})", "$.create.pids_limit"},
      {R"({"create": {"start_timeout_s": 0}})", "$.create.start_timeout_s"},
      {R"({"create": {"publish_host": "localhost"}})", "$.create.publish_host"},
      {R"({"create": {"disk_limit": "maybe"}})", "$.create.disk_limit"},
      {R"({"create": {"name_prefix": "bad/prefix"}})", "$.create.name_prefix"},
      {R"({"create": {"unknown_knob": true}})", "$.create.unknown_knob"},
      {R"({"exec": {"shell": ""}})", "$.exec.shell"},
      {R"({"exec": {"concurrency": 0}})", "$.exec.concurrency"},
      {R"({"exec": {"default_timeout_s": -1}})", "$.exec.default_timeout_s"},
      {R"({"probe": {"stable_count": 0}})", "$.probe.stable_count"},
      {R"({"probe": {"timeout_s": 0}})", "$.probe.timeout_s"},
      {R"({"image_pull_policy": "Sometimes"})", "$.image_pull_policy"},
      {R"({"api_version": "v2"})", "$.api_version"},
      {R"({"api_version": "1.12"})", "$.api_version"},
      {R"({"request_timeout_s": "fast"})", "$.request_timeout_s"},
      {R"({"reaper": {"interval_s": 0}})", "$.reaper.interval_s"},
      {R"({"reaper": {"interval_s": 7200}})", "$.reaper.interval_s"},
      {R"({"reaper": {"enabled": "yes"}})", "$.reaper.enabled"},
      {R"({"reaper": {"every": 2}})", "$.reaper.every"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.config);
    sbx::Host host(options_with(c.config));
    const std::string error = what_of([&] { provider_with(host); });
    // The plugin's "$.x" is shown from the config file's root.
    CHECK(contains(error, "test: $.providers.p.config" + std::string(c.path).substr(1)));
    CHECK_THROWS_AS(provider_with(host), sbx::InvalidArgumentError);
  }
  // Valid: a probe disabled with null, a pinned API version, IPv6 publish host.
  sbx::Host ok(options_with(
      R"({"probe": {"command": null, "timeout_s": 0}, "api_version": "1.41",
          "create": {"publish_host": "::1", "pids_limit": 64}})"));
  sbx::Sandbox box = provider_with(ok).create(ldtest::spec());
  CHECK(docker().inspect(box.id())->at("HostConfig").at("PidsLimit").as_int64() == 64);
  box.close();
}

TEST_CASE("DOCKER_HOST: a unix socket is used, anything else is refused") {
  ::setenv("DOCKER_HOST", "tcp://127.0.0.1:2375", 1);
  {
    sbx::Host host(options_with("{}"));
    const std::string error = what_of([&] { provider_with(host); });
    CHECK(contains(error, "DOCKER_HOST"));
  }
  ::setenv("DOCKER_HOST", "unix:///var/run/docker.sock", 1);
  {
    sbx::Host host(options_with("{}"));
    sbx::Sandbox box = provider_with(host).create(ldtest::spec());
    box.close();
  }
  ::unsetenv("DOCKER_HOST");
}

TEST_CASE("daemon unreachable: UNAVAILABLE naming the socket, quickly, at create") {
  sbx::Provider p = provider("docker_unreachable");  // constructing contacts nothing
  const auto start = std::chrono::steady_clock::now();
  try {
    p.create(ldtest::spec());
    FAIL("create must fail");
  } catch (const sbx::CreateError& e) {  // as every failure of create; the reason is UNAVAILABLE
    CHECK(e.status() == SBX_STATUS_UNAVAILABLE);
    CHECK(contains(e.what(), "/nonexistent/sbx-test/docker.sock"));
    CHECK(e.retryable());
  }
  CHECK(seconds_since(start) < 5.0);
}

TEST_CASE("readiness probe failure: CreateVerificationError, container removed") {
  Tracked t;
  try {
    provider("docker_bad_probe").create(t.spec);
    FAIL("create must fail");
  } catch (const sbx::CreateVerificationError& e) {
    CHECK(contains(e.what(), "probe"));
    CHECK(contains(e.what(), "not ready"));  // the probe's output is in the message
  }
  CHECK(t.left().empty());
}

TEST_CASE("spec.ready_timeout bounds start and probe") {
  Tracked t;
  t.spec.ready_timeout_s = 1.0;  // the probe needs 3 s
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(provider("docker_slow_probe").create(t.spec), sbx::CreateVerificationError);
  CHECK(seconds_since(start) < 10.0);
  CHECK(t.left().empty());
  t.spec.ready_timeout_s = 30.0;
  sbx::Sandbox box = provider("docker_slow_probe").create(t.spec);
  box.close();
}

TEST_CASE("cancelling a create leaves nothing behind") {
  Tracked t;
  auto op = provider("docker_slow_probe").create_async(t.spec);
  std::this_thread::sleep_for(1500ms);  // container created, probe running
  CHECK_FALSE(t.left().empty());
  op.cancel();
  CHECK_THROWS_AS(op.get(), sbx::CancelledError);
  CHECK(t.left().empty());
}
