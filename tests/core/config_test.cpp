// Config files: named provider blocks, errors naming the JSON path, env substitution, unknown
// provider names listing the available ones, default_metadata and labels.

#include <doctest/doctest.h>

#include <sbx/sbx.hpp>

#include <cstdlib>
#include <string>

namespace {

std::string parse_error(const std::string& json) {
  try {
    sbx::Config::parse(json, "test.json");
  } catch (const sbx::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError for " << json);
  return {};
}

sbx::Host test_host(const std::string& json) {
  sbx::Host::Options options;
  options.config = sbx::Config::parse(json, "test.json");
  options.plugin_dirs = {SBX_TEST_PLUGIN_DIR};
  options.use_default_plugin_dirs = false;
  return sbx::Host(std::move(options));
}

}  // namespace

TEST_CASE("a valid config with named blocks") {
  const auto c = sbx::Config::parse(R"({
    "labels": {"team": "infra"},
    "default_provider": "a",
    "providers": {
      "a": {"plugin": "test_processes", "config": {"default_timeout_s": 5},
            "default_metadata": {"owner": "ci"}},
      "b": {"plugin": "x/y.so#z"}
    }})");
  REQUIRE(c.providers.size() == 2);
  CHECK(c.providers.at("a").plugin == "test_processes");
  CHECK(c.providers.at("a").config.at("default_timeout_s").as_int64() == 5);
  CHECK(c.providers.at("a").default_metadata.at("owner") == "ci");
  CHECK(c.labels.at("team") == "infra");
  CHECK(*c.default_provider == "a");
}

TEST_CASE("errors name the file and the JSON path") {
  CHECK(parse_error(R"({"providers": {"a": {"plugin": 3}}})") ==
        "test.json: $.providers.a.plugin: expected a string, got number");
  CHECK(parse_error(R"({"providers": {"a": {"plugin": "p", "confg": {}}}})")
            .find("$.providers.a.confg") != std::string::npos);
  CHECK(parse_error(R"({"provider": {}})").find("$.provider") != std::string::npos);
  CHECK(parse_error(R"({"providers": {"a": {}}})").find("$.providers.a.plugin") !=
        std::string::npos);
  CHECK(parse_error(R"({"providers": {"a": {"plugin": "p", "default_metadata": {"k": 1}}}})")
            .find("$.providers.a.default_metadata.k") != std::string::npos);
  CHECK(parse_error(R"({"providers": [1]})").find("$.providers") != std::string::npos);
  CHECK(parse_error("{not json").find("test.json: JSON") == 0);
  CHECK(
      parse_error(R"({"default_provider": "nope", "providers": {}})").find("$.default_provider") !=
      std::string::npos);
}

TEST_CASE("${env:NAME} strings in a block's config come from the environment") {
  ::setenv("SBX_TEST_SECRET", "s3cret", 1);
  const auto c = sbx::Config::parse(
      R"({"providers": {"a": {"plugin": "p", "config": {"auth": {"token": "${env:SBX_TEST_SECRET}"}}}}})");
  CHECK(c.providers.at("a").config.at("auth").at("token").as_string() == "s3cret");
  ::unsetenv("SBX_TEST_SECRET_MISSING");
  const std::string error = parse_error(
      R"({"providers": {"a": {"plugin": "p", "config": {"list": ["${env:SBX_TEST_SECRET_MISSING}"]}}}})");
  CHECK(error.find("$.providers.a.config.list[0]") != std::string::npos);
  CHECK(error.find("SBX_TEST_SECRET_MISSING is not set") != std::string::npos);
}

TEST_CASE("an unknown provider name lists the available ones") {
  sbx::Host host = test_host(R"({"providers": {"mine": {"plugin": "test_processes"}}})");
  try {
    host.provider("nope");
    FAIL("expected an error");
  } catch (const sbx::InvalidArgumentError& e) {
    CHECK(std::string(e.what()) ==
          "Unknown sandbox provider 'nope'. Available providers: mine, test_processes");
  }
}

TEST_CASE("a provider's own config errors come back with the JSON path") {
  sbx::Host host = test_host(
      R"({"providers": {"bad": {"plugin": "test_processes", "config": {"no_such_key": 1}}}})");
  try {
    host.provider("bad");
    FAIL("expected an error");
  } catch (const sbx::InvalidArgumentError& e) {
    // The path from the file's root, as for every other config error.
    CHECK(std::string(e.what()).find("test.json: $.providers.bad.config.no_such_key") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("provider 'bad'") != std::string::npos);
  }
}

TEST_CASE("a relative plugin file path is relative to the config file, not the working dir") {
  const auto config = sbx::Config::parse(
      R"({"providers": {"a": {"plugin": "plugins/mine.so#x"}, "b": {"plugin": "local_docker"}}})",
      "/etc/sbx/sbx.json", "/etc/sbx");
  CHECK(config.providers.at("a").plugin == "/etc/sbx/plugins/mine.so#x");
  CHECK(config.providers.at("b").plugin == "local_docker");  // an id stays an id
}

TEST_CASE("a block naming an unknown provider id says which directories were searched") {
  sbx::Host host = test_host(R"({"providers": {"x": {"plugin": "no_such_provider"}}})");
  try {
    host.provider("x");
    FAIL("expected an error");
  } catch (const sbx::ConfigError& e) {
    CHECK(std::string(e.what()).find("no plugin offers provider id 'no_such_provider'") !=
          std::string::npos);
    CHECK(std::string(e.what()).find(SBX_TEST_PLUGIN_DIR) != std::string::npos);
  }
}

TEST_CASE("providers are cached; default provider; providers listing") {
  sbx::Host host = test_host(R"({"providers": {"only": {"plugin": "test_processes"}}})");
  sbx::Provider a = host.provider("only");
  sbx::Provider b = host.default_provider();
  CHECK(a.name() == "only");
  CHECK(b.name() == "only");
  const auto listed = host.providers();
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].name == "only");
  CHECK(listed[0].configured);
  CHECK(listed[1].name == "test_processes");
  CHECK_FALSE(listed[1].configured);
}

TEST_CASE("host labels: sbx.run and sbx.host are always there, config labels added") {
  sbx::Host host = test_host(R"({"labels": {"team": "infra"}, "providers": {}})");
  CHECK(host.labels().at("team") == "infra");
  CHECK(host.labels().at("sbx.run").size() >= 1);
  CHECK_FALSE(host.labels().at("sbx.host").empty());
}

TEST_CASE("a provider block named twice is an error, not the last one silently") {
  CHECK(parse_error(R"({"providers": {"a": {"plugin": "p"}, "a": {"plugin": "q"}}})") ==
        "test.json: JSON: $.providers.a: duplicate key");
}

TEST_CASE("the serve section is kept as written for sbx serve, which reads it") {
  const auto c = sbx::Config::parse(R"({"serve": {"listen": "127.0.0.1:8080", "anything": 1}})",
                                    "test.json");
  REQUIRE(c.serve);
  CHECK(c.serve->at("listen") == "127.0.0.1:8080");
  CHECK(c.serve->at("anything") == 1);  // checked by sbx serve (tests/serve), not the host
  CHECK(c.source == "test.json");
  CHECK_FALSE(sbx::Config::parse("{}").serve);
  CHECK(parse_error(R"({"serve": []})").starts_with("test.json: $.serve: expected an object"));
}
