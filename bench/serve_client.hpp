// A client of `sbx serve` for the benchmarks: one kept-alive HTTP/1.1 connection (Boost.Beast),
// one request at a time, each step (connect, write, read) bounded by a timeout so that a server
// that stops answering fails the benchmark instead of hanging it; extra headers (the API key) on
// every request; and the OpenSandbox calls the benchmarks make (create a sandbox, run a command
// through the execd routes to the end of its event stream, delete a sandbox).
// Header-only; link Boost::headers and Boost::json.
//
// THREADING: one thread uses a ServeClient (each has its own io_context and connection).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace sbx::bench {

class ServeClient {
 public:
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  explicit ServeClient(int port, std::map<std::string, std::string> headers = {},
                       std::chrono::seconds timeout = std::chrono::seconds(120))
      : port_(port), headers_(std::move(headers)), timeout_(timeout), stream_(ioc_) {
    connect();
  }

  // One request and its whole answer. Throws std::runtime_error when the connection fails or a
  // step takes longer than the timeout (the connection is then dropped; the next call makes one).
  Response call(boost::beast::http::verb verb, const std::string& target,
                const std::string& body = {},
                const std::string& content_type = "application/json") {
    namespace http = boost::beast::http;
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, "127.0.0.1:" + std::to_string(port_));
    for (const auto& [name, value] : headers_)
      req.set(name, value);
    if (!body.empty()) {
      req.set(http::field::content_type, content_type);
      req.body() = body;
    }
    req.prepare_payload();
    if (stream_.socket().is_open() && dropped()) disconnect();
    if (!stream_.socket().is_open()) connect();
    Response res;
    boost::beast::error_code ec;
    stream_.expires_after(timeout_);
    http::async_write(stream_, req, [&](boost::beast::error_code e, size_t) { ec = e; });
    run_io();
    if (!ec) {
      stream_.expires_after(timeout_);
      http::async_read(stream_, buffer_, res, [&](boost::beast::error_code e, size_t) { ec = e; });
      run_io();
    }
    // A server that ends the connection with the answer (Connection: close) gets a new one for
    // the next request, as any client does; the reconnect is part of what the client sees.
    if (ec || !res.keep_alive()) disconnect();
    if (ec) throw std::runtime_error(verb_text(verb) + " " + target + ": " + ec.message());
    return res;
  }

  // POST /command on the sandbox's execd path, read to the end of its event stream; true when the
  // stream ended with execution_complete. A client that sends an API key uses the server-proxy
  // path (/v1/sandboxes/{id}/proxy/44772/...), which takes the key: the direct one takes only the
  // X-EXECD-ACCESS-TOKEN of the sandbox's endpoint.
  bool run(const std::string& sandbox_id, const std::string& command) {
    const std::string prefix = headers_.count("OPEN-SANDBOX-API-KEY") ? "/v1" : "";
    const auto res = call(boost::beast::http::verb::post,
                          prefix + "/sandboxes/" + sandbox_id + "/proxy/44772/command",
                          boost::json::serialize(boost::json::object{{"command", command}}));
    if (res.result() != boost::beast::http::status::ok) return false;
    return res.body().find("\"execution_complete\"") != std::string::npos;
  }

  // POST /v1/sandboxes (image, entrypoint `sleep 3600`, `timeout_s`); the new sandbox's id.
  // Throws std::runtime_error unless it answers 202.
  std::string create_sandbox(const std::string& image, int timeout_s = 1800) {
    namespace json = boost::json;
    const auto res = call(boost::beast::http::verb::post, "/v1/sandboxes",
                          json::serialize(json::object{{"image", json::object{{"uri", image}}},
                                                       {"entrypoint", json::array{"sleep", "3600"}},
                                                       {"timeout", timeout_s},
                                                       {"resourceLimits", json::object{}}}));
    if (res.result() != boost::beast::http::status::accepted) {
      throw std::runtime_error("create answered " + std::to_string(res.result_int()) + ": " +
                               res.body());
    }
    return std::string(json::parse(res.body()).as_object().at("id").as_string());
  }

  // DELETE /v1/sandboxes/{id}; true when it answers 204.
  bool delete_sandbox(const std::string& sandbox_id) {
    return call(boost::beast::http::verb::delete_, "/v1/sandboxes/" + sandbox_id).result() ==
           boost::beast::http::status::no_content;
  }

 private:
  void connect() {
    boost::beast::error_code ec;
    stream_.expires_after(timeout_);
    stream_.async_connect(
        {boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)},
        [&](boost::beast::error_code e) { ec = e; });
    run_io();
    if (ec) {
      disconnect();
      throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port_) + ": " +
                               ec.message());
    }
    stream_.socket().set_option(boost::asio::ip::tcp::no_delay(true));
  }

  // Whether the server closed the kept connection while it was idle (its read timeout): readable
  // with nothing to read. Checked before reuse, as urllib3 and httpx do.
  bool dropped() {
    pollfd p{stream_.socket().native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    char c = 0;
    return ::recv(p.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
  }

  void disconnect() {
    boost::beast::error_code ignored;
    stream_.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    buffer_.clear();
  }

  void run_io() {
    ioc_.restart();
    ioc_.run();
  }

  static std::string verb_text(boost::beast::http::verb verb) {
    return std::string(boost::beast::http::to_string(verb));
  }

  int port_;
  std::map<std::string, std::string> headers_;
  std::chrono::seconds timeout_;
  boost::asio::io_context ioc_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
};

}  // namespace sbx::bench
