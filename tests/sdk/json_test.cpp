#include <doctest/doctest.h>

#include <sbx/sdk/json.hpp>

#include <string>

namespace json = sbx::sdk::json;
using json::Error;

namespace {

// The message of the sdk::json::Error that `fn` throws; fails the test if it throws nothing else.
// The SDK reports each as INVALID_ARGUMENT.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    CHECK(sbx::sdk::detail::exception_to_error(std::current_exception()).status() ==
          SBX_STATUS_INVALID_ARGUMENT);
    return error.what();
  }
  FAIL("expected an sbx::sdk::json::Error");
  return "";
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("parse_object accepts objects and treats blank text as {}") {
  CHECK(json::parse_object("", "cfg").empty());
  CHECK(json::parse_object(" \n\t", "cfg").empty());
  auto object = json::parse_object(R"({"a": 1, "b": {"c": "x"}})", "cfg");
  CHECK(object.at("a").as_int64() == 1);
  CHECK(object.at("b").at("c").as_string() == "x");
  CHECK(json::parse_object("{}\n  ", "cfg").empty());
}

TEST_CASE("parse_object reports what, reason, line and column") {
  std::string message =
      error_of([] { json::parse_object("{\n  \"a\": 1,\n  \"b\" 2\n}", "x.json"); });
  CHECK(message.starts_with("x.json: "));
  CHECK(contains(message, "line 3, column 7"));

  message = error_of([] { json::parse_object("{\"a\": 1", "cfg"); });
  CHECK(message.starts_with("cfg: "));
  CHECK(contains(message, "line 1"));

  message = error_of([] { json::parse_object("{} {}", "cfg"); });
  CHECK(contains(message, "line 1, column 4"));

  message = error_of([] { json::parse_object("[1, 2]", "cfg"); });
  CHECK(contains(message, "expected an object, got array"));
}

TEST_CASE("path_join quotes keys that are not identifiers") {
  CHECK(json::path_join("$", "a") == "$.a");
  CHECK(json::path_join("$.a", "b_2") == "$.a.b_2");
  CHECK(json::path_join("$", "a b") == "$[\"a b\"]");
  CHECK(json::path_join("$", "1x") == "$[\"1x\"]");
  CHECK(json::path_join("$", "q\"uote") == "$[\"q\\\"uote\"]");
  CHECK(json::path_join("$", "") == "$[\"\"]");
  CHECK(json::path_index("$.a", 3) == "$.a[3]");
}

TEST_CASE("getters return values, fallbacks and nullopt for absent or null keys") {
  auto object = json::parse_object(
      R"({"s": "text", "b": true, "i": -7, "f": 2.5, "l": ["x", "y"], "m": {"k": "v"},
          "n": null, "big": 1e3})",
      "cfg");
  json::ObjectReader reader(object, "$.root");
  CHECK(reader.string("s") == "text");
  CHECK(reader.boolean("b") == true);
  CHECK(reader.integer("i") == -7);
  CHECK(reader.integer("big") == 1000);
  CHECK(reader.number("f") == 2.5);
  CHECK(reader.number("i") == -7.0);
  CHECK(reader.string_list("l") == std::vector<std::string>{"x", "y"});
  CHECK(reader.string_map("m") == std::map<std::string, std::string>{{"k", "v"}});
  CHECK_FALSE(reader.string("n").has_value());
  CHECK_FALSE(reader.integer("n").has_value());
  CHECK_FALSE(reader.string("missing").has_value());
  CHECK(reader.string("missing", "fallback") == "fallback");
  CHECK(reader.string("n", "fallback") == "fallback");
  CHECK(reader.boolean("missing", true) == true);
  CHECK(reader.boolean("b", false) == true);
  // value() hands back an explicit null as is, and nullptr only for a missing key.
  REQUIRE(reader.value("n") != nullptr);
  CHECK(reader.value("n")->is_null());
  CHECK(reader.value("missing") == nullptr);
  CHECK_NOTHROW(reader.finish());
}

TEST_CASE("type errors name the path, the expected and the actual type") {
  auto object = json::parse_object(
      R"({"s": 1, "b": "yes", "i": "3", "f": [], "l": "x", "m": 4, "o": true})", "cfg");
  json::ObjectReader reader(object, "$.create");
  CHECK(error_of([&] { reader.string("s"); }) == "$.create.s: expected a string, got number");
  CHECK(error_of([&] { reader.boolean("b"); }) == "$.create.b: expected a boolean, got string");
  CHECK(error_of([&] { reader.integer("i"); }) == "$.create.i: expected an integer, got string");
  CHECK(error_of([&] { reader.number("f"); }) == "$.create.f: expected a number, got array");
  CHECK(error_of([&] { reader.string_list("l"); }) ==
        "$.create.l: expected an array of strings, got string");
  CHECK(error_of([&] { reader.string_map("m"); }) ==
        "$.create.m: expected an object of strings, got number");
  CHECK(error_of([&] { reader.object("o"); }) == "$.create.o: expected an object, got boolean");
}

TEST_CASE("element errors in lists and maps name the element's path") {
  auto object = json::parse_object(R"({"l": ["a", 2], "m": {"ok": "v", "bad key": false}})", "c");
  json::ObjectReader reader(object);
  CHECK(error_of([&] { reader.string_list("l"); }) == "$.l[1]: expected a string, got number");
  CHECK(error_of([&] { reader.string_map("m"); }) ==
        "$.m[\"bad key\"]: expected a string, got boolean");
}

TEST_CASE("range errors name the path, the bound and the value") {
  auto object = json::parse_object(
      R"({"pids_limit": 0, "i": 11, "frac": 1.5, "huge": 1e30, "u": 18446744073709551615,
          "neg": -1, "zero": 0.0, "x": 5.5})",
      "cfg");
  json::ObjectReader reader(object, "$.create");
  CHECK(error_of([&] { reader.integer("pids_limit", 1); }) ==
        "$.create.pids_limit: must be >= 1, got 0");
  CHECK(error_of([&] { reader.integer("i", INT64_MIN, 10); }) ==
        "$.create.i: must be <= 10, got 11");
  CHECK(error_of([&] { reader.integer("i", 1, 10); }) ==
        "$.create.i: must be between 1 and 10, got 11");
  CHECK(error_of([&] { reader.integer("frac"); }) == "$.create.frac: expected an integer, got 1.5");
  CHECK(error_of([&] { reader.integer("huge"); }) ==
        "$.create.huge: must be a 64-bit integer, got 1e+30");
  CHECK(error_of([&] { reader.integer("u"); }) ==
        "$.create.u: must be a 64-bit integer, got 18446744073709551615");
  CHECK(error_of([&] { reader.number("neg", 0); }) == "$.create.neg: must be >= 0, got -1");
  CHECK(error_of([&] { reader.number("zero", 0, 1e308, true); }) ==
        "$.create.zero: must be > 0, got 0");
  CHECK(error_of([&] { reader.number("x", 0, 5); }) == "$.create.x: must be <= 5, got 5.5");
  // In-range values at the bounds pass.
  CHECK(reader.integer("i", 11, 11) == 11);
  CHECK(reader.number("zero", 0) == 0.0);
}

TEST_CASE("nested readers report paths below their parent and check their own keys") {
  auto object = json::parse_object(
      R"({"create": {"limits": {"cpu": "two"}, "image": "busybox"}, "weird key": {"x": 1}})",
      "cfg");
  json::ObjectReader root(object);
  auto create = root.object("create");
  REQUIRE(create.has_value());
  CHECK(create->path() == "$.create");
  CHECK(create->string("image") == "busybox");
  auto limits = create->object("limits");
  REQUIRE(limits.has_value());
  CHECK(error_of([&] { limits->number("cpu"); }) ==
        "$.create.limits.cpu: expected a number, got string");
  auto weird = root.object("weird key");
  REQUIRE(weird.has_value());
  CHECK(error_of([&] { weird->finish(); }) ==
        "$[\"weird key\"].x: unknown key; this object takes no keys");
  CHECK_NOTHROW(create->finish());
  CHECK_NOTHROW(root.finish());
  CHECK_FALSE(root.object("absent").has_value());
}

TEST_CASE("finish() names the unknown key and lists the known ones") {
  auto object = json::parse_object(R"({"image": "x", "imagee": "y", "n": null})", "cfg");
  json::ObjectReader reader(object, "$.provider");
  reader.string("image");
  reader.integer("n");  // null counts as absent but the key is known
  reader.boolean("tty");
  CHECK(error_of([&] { reader.finish(); }) ==
        "$.provider.imagee: unknown key; known keys: image, n, tty");
  reader.string("imagee");
  CHECK_NOTHROW(reader.finish());
}

TEST_CASE("fail() throws invalid_argument with the key's path") {
  auto object = json::parse_object(R"({"a": 1})", "cfg");
  json::ObjectReader reader(object, "$.p");
  CHECK(error_of([&] { reader.fail("a", "is odd"); }) == "$.p.a: is odd");
  CHECK(reader.path_of("a b") == "$.p[\"a b\"]");
}

TEST_CASE("kind_name") {
  CHECK(json::kind_name(boost::json::value(nullptr)) == "null");
  CHECK(json::kind_name(boost::json::value(true)) == "boolean");
  CHECK(json::kind_name(boost::json::value(1)) == "number");
  CHECK(json::kind_name(boost::json::value(1u)) == "number");
  CHECK(json::kind_name(boost::json::value(1.5)) == "number");
  CHECK(json::kind_name(boost::json::value("s")) == "string");
  CHECK(json::kind_name(boost::json::value(boost::json::array{})) == "array");
  CHECK(json::kind_name(boost::json::value(boost::json::object{})) == "object");
}

TEST_CASE("duplicate keys are refused with their path, at any depth") {
  CHECK(error_of([] { json::parse_object(R"({"a": 1, "a": 2})", "config"); }) ==
        "config: $.a: duplicate key");
  CHECK(error_of([] { json::parse_object(R"({"x": [{"k": 1}, {"k": 1, "k": 2}]})", "config"); }) ==
        "config: $.x[1].k: duplicate key");
  // The same key in different objects is fine.
  CHECK_NOTHROW(json::parse_object(R"({"a": {"k": 1}, "b": {"k": 1}, "k": [1, 1]})", "config"));
}
