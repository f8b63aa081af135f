// What a create request may ask of the host (plugins/local_docker/policy.hpp): no host path, named
// volume or GPU unless the operator's config allows it, host paths judged after resolving symlinks,
// and none of Docker's loosening settings from a request at all. Each refusal is PERMISSION_DENIED
// before the daemon sees anything, so nothing is left behind.

#include "support.hpp"

#include "../common/test_helpers.hpp"

#include <filesystem>
#include <fstream>

using ldtest::contains;
using ldtest::create_failure;
using ldtest::options_with;
using ldtest::provider;
using ldtest::provider_with;
using ldtest::Tracked;
using ldtest::what_of;

namespace fs = std::filesystem;

namespace {

// Host options allowing these prefixes (and nothing else of the host).
sbx::Host::Options allowing(const std::vector<std::string>& prefixes) {
  boost::json::array list;
  for (const auto& p : prefixes)
    list.emplace_back(p);
  return options_with(R"({"create": {"allowed_host_paths": )" + boost::json::serialize(list) +
                      "}}");
}

// The create's failure status and message with `volumes` as the only option.
struct Refusal {
  sbx_status status;
  std::string message;
};
Refusal refusal(const sbx::Provider& p, const boost::json::value& volumes) {
  Tracked t;
  t.spec.provider_options["volumes"] = volumes;
  const Refusal r{create_failure(p, t.spec), what_of([&] { p.create(t.spec); })};
  CHECK(t.left().empty());
  return r;
}

}  // namespace

TEST_CASE("by default no request mounts a host path, in either form") {
  for (const boost::json::value& volumes :
       {boost::json::value(boost::json::array{"/:/host:ro"}),
        boost::json::value(boost::json::array{"/etc:/rw"}),
        boost::json::value(boost::json::array{"/var/run/docker.sock:/docker.sock"}),
        boost::json::value(
            boost::json::array{boost::json::object{{"source", "/"}, {"target", "/host"}}})}) {
    CAPTURE(boost::json::serialize(volumes));
    const Refusal r = refusal(provider(), volumes);
    CHECK(r.status == SBX_STATUS_PERMISSION_DENIED);
    CHECK(contains(r.message, "provider_options.volumes"));
    CHECK(contains(r.message, "create.allowed_host_paths"));
  }
}

TEST_CASE("allowed prefixes are judged after resolving symlinks; the resolved path is mounted") {
  sbx::testing::TempDir allowed("sbx-ld-policy");
  fs::create_directories(allowed.path / "data");
  std::ofstream(allowed.path / "data" / "file.txt") << "inside";
  fs::create_symlink("/", allowed.path / "escape");
  fs::create_symlink("/etc", allowed.path / "etc");
  fs::create_symlink(allowed.path / "nowhere", allowed.path / "dangling");
  const fs::path sibling = allowed.path.string() + "-sibling";  // shares the prefix's text only
  fs::create_directories(sibling);
  sbx::Host host(allowing({allowed.path.string()}));
  const sbx::Provider p = provider_with(host);

  SUBCASE("a directory under the prefix is mounted, a missing one is made there") {
    auto spec = ldtest::spec();
    spec.provider_options["volumes"] =
        boost::json::array{(allowed.path / "data").string() + ":/d:ro",
                           (allowed.path / "new" / "sub").string() + ":/n"};
    sbx::Sandbox box = p.create(spec);
    CHECK(box.exec("cat /d/file.txt").stdout_text == "inside");
    CHECK(box.exec("echo out > /n/made.txt").return_code == 0);
    box.close();
    CHECK(sbx::testing::read_file(allowed.path / "new" / "sub" / "made.txt") == "out\n");
  }
  SUBCASE("a symlink out of the prefix is refused, naming where it leads") {
    for (const std::string& source :
         {(allowed.path / "escape").string(), (allowed.path / "escape" / "etc").string(),
          (allowed.path / "etc").string(), sibling.string()}) {
      CAPTURE(source);
      const Refusal r = refusal(p, boost::json::array{source + ":/h:ro"});
      CHECK(r.status == SBX_STATUS_PERMISSION_DENIED);
      CHECK(contains(r.message, "'" + source + "'"));
      CHECK(contains(r.message, "not under an allowed prefix"));
    }
    CHECK(
        contains(refusal(p, boost::json::array{(allowed.path / "escape").string() + ":/h"}).message,
                 "(resolved: '/')"));
  }
  SUBCASE("'..' and a link to nothing are refused as invalid") {
    for (const std::string& source :
         {allowed.path.string() + "/../../etc", allowed.path.string() + "/./data",
          (allowed.path / "dangling").string(), (allowed.path / "dangling" / "below").string()}) {
      CAPTURE(source);
      CHECK(
          refusal(p, boost::json::array{boost::json::object{{"source", source}, {"target", "/h"}}})
              .status == SBX_STATUS_INVALID_ARGUMENT);
    }
    CHECK_FALSE(fs::exists(allowed.path / "nowhere"));  // the daemon made nothing through it
  }
  SUBCASE("an allowed prefix that is itself a symlink allows where it leads") {
    sbx::testing::TempDir links("sbx-ld-policy-links");
    fs::create_directory_symlink(allowed.path, links.path / "link");
    sbx::Host via_link(allowing({(links.path / "link").string()}));
    auto spec = ldtest::spec();
    spec.provider_options["volumes"] = boost::json::array{
        (links.path / "link" / "data").string() + ":/a:ro",
        boost::json::object{
            {"source", (allowed.path / "data").string()}, {"target", "/b"}, {"read_only", true}}};
    sbx::Sandbox box = provider_with(via_link).create(spec);
    CHECK(box.exec("cat /a/file.txt /b/file.txt").stdout_text == "insideinside");
    // What the daemon mounts is the resolved path, not the link.
    const auto mounts = ldtest::docker().inspect(box.id())->at("HostConfig").at("Binds");
    CHECK(boost::json::serialize(mounts).find((allowed.path / "data").string() + ":/a:ro") !=
          std::string::npos);
    box.close();
  }
  fs::remove_all(sibling);
}

TEST_CASE("named volumes only when the config allows them") {
  const std::string name = "sbx-test-volume-" + ldtest::unique();
  for (const boost::json::value& volumes :
       {boost::json::value(boost::json::array{name + ":/v"}),
        boost::json::value(
            boost::json::array{boost::json::object{{"source", name}, {"target", "/v"}}})}) {
    const Refusal r = refusal(provider(), volumes);
    CHECK(r.status == SBX_STATUS_PERMISSION_DENIED);
    CHECK(contains(r.message, "create.allow_named_volumes"));
  }
  CHECK(ldtest::docker().send("GET", "/volumes/" + name).status == 404);  // none was made

  sbx::Host host(options_with(R"({"create": {"allow_named_volumes": true}})"));
  auto spec = ldtest::spec();
  spec.provider_options["volumes"] = boost::json::array{name + ":/v"};
  sbx::Sandbox box = provider_with(host).create(spec);
  CHECK(box.exec("echo kept > /v/f && cat /v/f").stdout_text == "kept\n");
  box.close();
  // Docker made the volume for this test's sandbox; it outlives the sandbox, so remove it here.
  CHECK(ldtest::docker().send("DELETE", "/volumes/" + name).status == 204);
}

// OpenSandbox's Volume shape (what `sbx serve` passes from a create's `volumes`): a host path with
// its subPath is a bind, a pvc a named volume, each under the same policy as the other forms.
TEST_CASE(
    "OpenSandbox-shaped volumes: host with subPath, pvc; the policy holds; bad shapes named") {
  namespace json = boost::json;
  sbx::testing::TempDir allowed("sbx-ld-policy-os");
  fs::create_directories(allowed.path / "data" / "sub");
  std::ofstream(allowed.path / "data" / "sub" / "file.txt") << "from host";
  const auto host_volume = [&](const std::string& path, json::object extra = {}) {
    json::object v{{"name", "data"}, {"host", json::object{{"path", path}}}, {"mountPath", "/d"}};
    for (const auto& [k, x] : extra)
      v[k] = x;
    return v;
  };
  // Refused by default, as any host path.
  const Refusal by_default =
      refusal(provider(), json::array{host_volume((allowed.path / "data").string())});
  CHECK(by_default.status == SBX_STATUS_PERMISSION_DENIED);
  CHECK(contains(by_default.message, "create.allowed_host_paths"));

  sbx::Host host(allowing({allowed.path.string()}));
  const sbx::Provider p = provider_with(host);
  {
    auto spec = ldtest::spec();
    spec.provider_options["volumes"] = json::array{
        host_volume((allowed.path / "data").string(), {{"subPath", "sub"}, {"readOnly", true}})};
    sbx::Sandbox box = p.create(spec);
    CHECK(box.exec("cat /d/file.txt").stdout_text == "from host");
    CHECK(box.exec("touch /d/new 2>/dev/null").return_code != 0);  // read-only
    box.close();
  }
  // A subPath that climbs out is invalid before any policy; so are the other bad shapes.
  const std::vector<std::pair<json::value, std::string>> bad{
      {host_volume((allowed.path / "data").string(), {{"subPath", "../../etc"}}), "subPath"},
      {host_volume((allowed.path / "data").string(), {{"subPath", "/etc"}}), "subPath"},
      {host_volume("relative"), "path"},
      {json::object{
           {"name", "Bad_Name"}, {"host", json::object{{"path", "/x"}}}, {"mountPath", "/d"}},
       "name"},
      {json::object{{"name", "n"}, {"host", json::object{{"path", "/x"}}}, {"mountPath", "d"}},
       "mountPath"},
      {json::object{{"name", "n"}, {"mountPath", "/d"}}, "exactly one backend"},
      {json::object{{"name", "n"},
                    {"host", json::object{{"path", "/x"}}},
                    {"pvc", json::object{{"claimName", "v"}}},
                    {"mountPath", "/d"}},
       "exactly one backend"},
      {json::object{{"name", "n"}, {"ossfs", json::object{{"bucket", "b"}}}, {"mountPath", "/d"}},
       "not supported by local_docker"},
      {json::object{{"name", "n"},
                    {"pvc", json::object{{"claimName", "v"}, {"createIfNotExists", false}}},
                    {"mountPath", "/d"}},
       "createIfNotExists"},
      {json::object{{"name", "n"},
                    {"pvc", json::object{{"claimName", "v"}}},
                    {"mountPath", "/d"},
                    {"subPath", "s"}},
       "subPath"},
      {host_volume("/x", {{"unknown", 1}}), "unknown"}};
  for (const auto& [volume, why] : bad) {
    CAPTURE(json::serialize(volume));
    const Refusal r = refusal(p, json::array{volume});
    CHECK(r.status == SBX_STATUS_INVALID_ARGUMENT);
    CHECK(contains(r.message, why));
  }

  // A pvc is a named volume: refused unless the config allows them, then made by Docker.
  const std::string name = "sbx-test-os-volume-" + ldtest::unique();
  const json::object pvc{{"name", "cache"},
                         {"pvc", json::object{{"claimName", name}, {"storage", "1Gi"}}},
                         {"mountPath", "/v"}};
  CHECK(refusal(provider(), json::array{pvc}).status == SBX_STATUS_PERMISSION_DENIED);
  sbx::Host named(options_with(R"({"create": {"allow_named_volumes": true}})"));
  auto spec = ldtest::spec();
  spec.provider_options["volumes"] = json::array{pvc};
  sbx::Sandbox box = provider_with(named).create(spec);
  CHECK(box.exec("echo kept > /v/f && cat /v/f").stdout_text == "kept\n");
  box.close();
  CHECK(ldtest::docker().send("DELETE", "/volumes/" + name).status == 204);
}

TEST_CASE("no request sets Docker's loosening settings: each is PERMISSION_DENIED, named") {
  for (const char* key : {"privileged",
                          "cap_add",
                          "capabilities",
                          "devices",
                          "device_requests",
                          "device_cgroup_rules",
                          "network",
                          "network_mode",
                          "pid",
                          "pid_mode",
                          "ipc",
                          "ipc_mode",
                          "uts_mode",
                          "userns_mode",
                          "cgroupns_mode",
                          "cgroup_parent",
                          "security_opt",
                          "sysctls",
                          "runtime",
                          "group_add",
                          "host_config",
                          "binds",
                          "mounts",
                          "volumes_from"}) {
    CAPTURE(key);
    Tracked t;
    t.spec.provider_options[key] = true;
    CHECK(create_failure(provider(), t.spec) == SBX_STATUS_PERMISSION_DENIED);
    const std::string message = what_of([&] { provider().create(t.spec); });
    CHECK(contains(message, std::string("provider_options.") + key));
    CHECK(contains(message, "operator"));
    CHECK(t.left().empty());
  }
}

TEST_CASE("GPUs only when the config allows them") {
  Tracked t;
  t.spec.resources.gpu = 1;
  CHECK(create_failure(provider(), t.spec) == SBX_STATUS_PERMISSION_DENIED);
  CHECK(contains(what_of([&] { provider().create(t.spec); }), "create.allow_gpu"));
  CHECK(t.left().empty());
}

TEST_CASE("the config's allowed_host_paths must be absolute") {
  const std::string message = what_of([] {
    sbx::Host host(options_with(R"({"create": {"allowed_host_paths": ["relative/dir"]}})"));
    provider_with(host).create(ldtest::spec());
  });
  CHECK(contains(message, "allowed_host_paths"));
  CHECK(contains(message, "relative/dir"));
}

TEST_CASE("sbx run refuses a host mount with the reason, exit 125, nothing left") {
  sbx::testing::TempDir dir("sbx-ld-policy-cli");
  const std::string run = ldtest::unique();
  const std::string err = (dir.path / "stderr").string();
  ldtest::Child child(
      {.argv = {ldtest::sbx_binary(), "run", "--provider", "local_docker", "--image",
                ldtest::kBusybox, "--metadata", "sbx.test.run=" + run, "--provider-options",
                R"({"volumes": ["/:/host:ro"]})", "--", "cat", "/host/etc/hostname"},
       .stderr_path = err});
  CHECK(child.wait_for(std::chrono::seconds(120)) == 125);
  CHECK(contains(sbx::testing::read_file(err), "create.allowed_host_paths"));
  CHECK(ldtest::leftovers("sbx.test.run", run).empty());
}
