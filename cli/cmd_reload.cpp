// sbx reload: asks a running `sbx serve` to reload (POST /admin/reload, docs/hot-swap.md) and
// prints its answer: the blocks added, changed, removed, or why the reload was refused.

#include "commands.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

namespace sbx::cli {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

struct ReloadFields {
  std::string url = "http://127.0.0.1:8080";
  std::optional<std::string> api_key_env;
  double timeout_s = 600;  // a reload runs canaries: it may take a while
  bool move = false;       // {"sandboxes": "move"}
  bool drain = false;      // {"sandboxes": "drain"}; neither: the server's default
};

// "http://HOST:PORT" (no path): HOST and PORT.
std::pair<std::string, std::string> split_url(const std::string& url) {
  const std::string prefix = "http://";
  if (!url.starts_with(prefix)) {
    throw UsageError("--url must be http://HOST:PORT, got '" + url + "'");
  }
  std::string rest = url.substr(prefix.size());
  while (!rest.empty() && rest.back() == '/')
    rest.pop_back();
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size() ||
      rest.find('/') != std::string::npos) {
    throw UsageError("--url must be http://HOST:PORT, got '" + url + "'");
  }
  std::string host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return {host, rest.substr(colon + 1)};
}

int reload(ReloadFields& f, const Global&) {
  const auto [host, port] = split_url(f.url);
  std::optional<std::string> key;
  if (f.api_key_env) {
    const char* value = std::getenv(f.api_key_env->c_str());
    if (!value || !*value) {
      throw UsageError("--api-key-env: the environment variable " + *f.api_key_env +
                       " is not set or empty");
    }
    key = value;
  }
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  http::response<http::string_body> response;
  try {
    asio::ip::tcp::resolver resolver(ioc);
    stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000)));
    stream.connect(resolver.resolve(host, port));
    http::request<http::string_body> request{http::verb::post, "/admin/reload", 11};
    request.set(http::field::host, host + ":" + port);
    if (key) request.set("OPEN-SANDBOX-API-KEY", *key);
    if (f.move || f.drain) {
      request.set(http::field::content_type, "application/json");
      request.body() =
          boost::json::serialize(boost::json::object{{"sandboxes", f.move ? "move" : "drain"}});
    }
    request.prepare_payload();
    http::write(stream, request);
    beast::flat_buffer buffer;
    http::read(stream, buffer, response);
  } catch (const std::exception& e) {
    std::cerr << "sbx reload: " << f.url << ": " << e.what() << std::endl;
    return 1;
  }
  boost::system::error_code ec;
  const boost::json::value body = boost::json::parse(response.body(), ec);
  const auto* object = ec ? nullptr : body.if_object();
  if (response.result() == http::status::ok && object) {
    for (const char* what : {"added", "changed", "removed", "unchanged"}) {
      std::string names;
      if (const auto* list = object->if_contains(what); list && list->is_array()) {
        for (const auto& n : list->get_array())
          if (n.is_string()) names += (names.empty() ? "" : ", ") + std::string(n.get_string());
      }
      std::cout << what << ": " << (names.empty() ? "-" : names) << "\n";
    }
    if (const auto* moved = object->if_contains("moved"); moved && moved->is_array()) {
      std::cout << "moved: " << moved->get_array().size() << " sandbox(es)\n";
    }
    if (const auto* left = object->if_contains("not_moved"); left && left->is_array()) {
      for (const auto& item : left->get_array()) {
        const auto* o = item.if_object();
        if (!o) continue;
        const auto* id = o->if_contains("id");
        const auto* reason = o->if_contains("reason");
        std::cout << "not moved (drains): "
                  << (id && id->is_string() ? std::string(id->get_string()) : "?") << ": "
                  << (reason && reason->is_string() ? std::string(reason->get_string()) : "")
                  << "\n";
      }
    }
    return 0;
  }
  std::string message = response.body();
  if (object) {
    if (const auto* m = object->if_contains("message"); m && m->is_string()) {
      message = std::string(m->get_string());
    }
  }
  std::cerr << "sbx reload: HTTP " << response.result_int() << ": " << message << std::endl;
  return 1;
}

}  // namespace

Command reload_command() {
  std::vector<Option<ReloadFields>> options;
  options.push_back(value<ReloadFields>(
      "--url", "URL", "The server, http://HOST:PORT (default http://127.0.0.1:8080)",
      [](ReloadFields& f, const Arg& a) { f.url = a.text; }));
  options.push_back(value<ReloadFields>(
      "--api-key-env", "VAR", "Send the API key held by environment variable VAR",
      [](ReloadFields& f, const Arg& a) { f.api_key_env = a.text; }));
  options.push_back(value<ReloadFields>("--timeout", "S",
                                        "Give up after S seconds (default 600: canaries take time)",
                                        [](ReloadFields& f, const Arg& a) {
                                          f.timeout_s = a.number();
                                          if (!(f.timeout_s > 0))
                                            throw UsageError("--timeout must be > 0");
                                        }));
  options.push_back(flag<ReloadFields>(
      "--move", "Move sandboxes held on a replaced generation to the new one (sbx.connect/1)",
      &ReloadFields::move));
  options.push_back(flag<ReloadFields>(
      "--drain",
      "Let sandboxes held on a replaced generation drain there (the default unless\n"
      "the server runs with --move-sandboxes)",
      &ReloadFields::drain));
  return make_command<ReloadFields>({
      .name = "reload",
      .summary = "Make a running sbx serve reload its config and plugin files",
      .usage = "[--url http://HOST:PORT] [--api-key-env VAR] [--move | --drain]",
      .description =
          "Sends POST /admin/reload to a running `sbx serve` (the same as its SIGHUP) and\n"
          "prints what the reload did: provider blocks added, changed, removed, unchanged.\n"
          "A changed block (or a replaced plugin file) is a new generation: new sandboxes go\n"
          "to it, existing ones drain on the old one (or, with --move, move to the new one\n"
          "when both speak sbx.connect/1). A reload that fails anywhere is refused\n"
          "as a whole and the old generation keeps serving; the reason is printed and the\n"
          "exit status is 1 (docs/hot-swap.md).\n",
      .options = std::move(options),
      .check =
          [](ReloadFields& f) {
            split_url(f.url);
            if (f.move && f.drain) throw UsageError("--move and --drain exclude each other");
          },
      .handler = reload,
  });
}

}  // namespace sbx::cli
