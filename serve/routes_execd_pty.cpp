// The execd API's terminals on the gateway (docs/serve.md, "Terminals"), over sbx.pty/1:
//   POST   /pty            {"cwd"?, "command"?} -> 200 {"session_id"}: a terminal, not started yet
//   GET    /pty/{id}       200 {"session_id", "running", "output_offset", "exit_code"?}
//   GET    /pty/{id}/ws    a WebSocket (?pty=0 pipe mode, ?since=N replay, ?takeover=1)
//   DELETE /pty/{id}       200; kills what runs on it
//
// As execd (components/execd/PTY.md), the terminal starts at its first attach, in the mode that
// attach asks for, at 80 x 24 (a client sends a resize after "connected"). Frames from the
// server: text {"type":"connected",...}, binary 0x01 stdout (everything on a TTY), 0x02 stderr
// (pipe mode), 0x03 + an 8-byte big-endian offset + replayed bytes, text {"type":"exit",
// "exit_code"} then a close 1000. From the client: binary 0x00 + stdin; text {"type":"resize",
// "cols","rows"}, {"type":"signal","signal"} and {"type":"ping"}. One holder: a second attach is
// 409 SESSION_IN_USE, unless takeover=1, which closes the first with 4001 TAKEN_OVER.
//
// Over the extension: each WebSocket is one sbx.pty/1 attachment (takeover: the provider keeps
// the output and replays it). While no client holds a started terminal, the server holds an
// attachment of its own (live only), so that GET /pty/{id} sees the output's end and the exit.
// Signals: SIGINT, SIGQUIT and SIGTSTP become the TTY's ^C, ^\ and ^Z (what the line discipline
// turns into them for the foreground job); the extension has no other signal, and pipe mode none.
//
// THREADING: a socket's work runs on its connection's strand; attachment callbacks come on plugin
// threads and post to it. A Terminal is guarded by its mutex. OWNERSHIP: the Entry's PtyTable
// owns its Terminals; a PtySocket owns its WebSocket and is kept alive by its pending operations.

#include "state.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include <spdlog/spdlog.h>

#include <deque>
#include <map>
#include <mutex>

namespace sbx::serve {

namespace json = boost::json;
namespace websocket = boost::beast::websocket;
namespace asio = boost::asio;

namespace {

constexpr std::size_t kMaxTerminals = 64;            // per sandbox, as sbx-agent's bound
constexpr std::size_t kMaxUnsent = 4 * 1024 * 1024;  // a client this far behind is cut
constexpr std::size_t kReplayFrame = 64 * 1024;
constexpr uint16_t kTakenOver = 4001;

class PtySocket;

struct Terminal {
  std::string id;
  std::string cwd, command;
  std::mutex mutex;  // guards what follows
  bool started = false;
  bool tty = true;
  bool deleted = false;
  sbx::Pty pty;                                    // once started
  std::weak_ptr<PtySocket> holder;                 // the attached WebSocket
  std::optional<sbx::Operation<int32_t>> watcher;  // the server's own attachment, while no holder
  uint64_t end = 0;                                // the output's end, as far as seen
  std::optional<int32_t> exit_code;
};

}  // namespace

struct PtyTable {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<Terminal>> terminals;  // by id
  std::deque<std::string> order;                               // oldest first
};

std::shared_ptr<PtyTable> new_pty_table() {
  return std::make_shared<PtyTable>();
}

namespace {

std::shared_ptr<Terminal> find_terminal(const Call& call, const std::string& id) {
  std::lock_guard lock(call.entry->ptys->mutex);
  const auto it = call.entry->ptys->terminals.find(id);
  return it == call.entry->ptys->terminals.end() ? nullptr : it->second;
}

Response terminal_not_found(const Request& request, const std::string& id) {
  return execd_error(request, http::status::not_found, "CONTEXT_NOT_FOUND",
                     "pty session not found: " + id);
}

void note_output(Terminal& t, uint64_t offset, std::size_t n) {
  std::lock_guard lock(t.mutex);
  t.end = std::max(t.end, offset + n);
}

// The server's attachment while no client holds the terminal: it only follows the end and the
// exit. Called with the terminal's mutex held.
void start_watcher(const std::shared_ptr<Terminal>& t) {
  if (!t->started || t->deleted || t->exit_code) return;
  std::weak_ptr<Terminal> weak = t;
  t->watcher = t->pty.attach_async(
      {.since = std::nullopt,
       .takeover = true,
       .on_output = [weak](sbx::OutputStream, uint64_t offset, std::string_view bytes) {
         if (auto t = weak.lock()) note_output(*t, offset, bytes.size());
       }});
  t->watcher->then([weak](sbx::Operation<int32_t>& op) {
    auto t = weak.lock();
    if (!t) return;
    try {
      const int32_t code = op.get();
      std::lock_guard lock(t->mutex);
      t->exit_code = code;
    } catch (const sbx::Error&) {  // taken over by a client, closed, or the sandbox went
    }
  });
}

std::string offset_bytes(uint64_t offset) {
  std::string out;
  for (int shift = 56; shift >= 0; shift -= 8)
    out += static_cast<char>((offset >> shift) & 0xff);
  return out;
}

// One client's WebSocket on a terminal.
class PtySocket : public std::enable_shared_from_this<PtySocket> {
 public:
  PtySocket(Connection connection, std::shared_ptr<const Request> request,
            std::weak_ptr<sbx::Sandbox> box, std::shared_ptr<Terminal> terminal,
            std::optional<uint64_t> since, bool tty)
      : ws_(std::move(connection)),
        request_(std::move(request)),
        box_(std::move(box)),
        terminal_(std::move(terminal)),
        since_(since),
        tty_(tty) {}

  void start() {
    boost::beast::get_lowest_layer(ws_).expires_never();
    ws_.set_option(websocket::stream_base::timeout::suggested(boost::beast::role_type::server));
    ws_.read_message_max(1 << 20);
    ws_.async_accept(*request_, [self = shared_from_this()](boost::beast::error_code ec) {
      if (ec) {
        spdlog::debug("sbx serve: a terminal's WebSocket handshake failed: {}", ec.message());
        return;
      }
      self->accepted();
    });
  }

  // Another client took the terminal over (any thread).
  void evict() {
    asio::post(ws_.get_executor(), [self = shared_from_this()] {
      self->evicted_ = true;
      self->close(kTakenOver, "TAKEN_OVER");
    });
  }

 private:
  struct Out {
    bool text = false;
    bool close = false;
    uint16_t code = 1000;
    std::string data;
  };

  // Strand: the handshake is done; hold the terminal, start it if it is new, then attach.
  void accepted() {
    Terminal& t = *terminal_;
    std::shared_ptr<PtySocket> evicted;
    bool start = false;
    {
      std::lock_guard lock(t.mutex);
      if (t.deleted) {
        close(1000, "session deleted");
        return;
      }
      evicted = t.holder.lock();
      t.holder = weak_from_this();
      if (t.watcher) {
        t.watcher->cancel();  // our attachment takes over anyway; this is only tidier
        t.watcher.reset();
      }
      if (!t.started) {
        t.started = true;
        t.tty = tty_;
        start = true;
      }
      tty_ = t.tty;  // later attaches get the first one's mode
    }
    if (evicted && evicted.get() != this) evicted->evict();
    if (!start) {
      attach(since_);
      return;
    }
    sbx::PtyOptions options;
    if (!t.command.empty()) options.command = t.command;
    if (!t.cwd.empty()) options.cwd = t.cwd;
    options.tty = tty_;
    std::shared_ptr<sbx::Sandbox> box = box_.lock();
    if (!box) {
      fail("the sandbox is gone");
      return;
    }
    try {
      box->open_pty_async(options).then([self = shared_from_this()](sbx::Operation<sbx::Pty>& op) {
        std::optional<sbx::Pty> pty;
        std::string why;
        try {
          pty = op.get();
        } catch (const sbx::Error& e) {
          why = e.what();
        }
        asio::post(self->ws_.get_executor(), [self, pty = std::move(pty), why]() mutable {
          if (!pty) {
            self->fail("cannot start the terminal: " + why);
            return;
          }
          {
            std::lock_guard lock(self->terminal_->mutex);
            self->terminal_->pty = std::move(*pty);
          }
          self->attach(0);  // from its first byte, sent as live output: nothing is lost
        });
      });
    } catch (const sbx::Error& e) {
      fail(std::string("cannot start the terminal: ") + e.what());
    }
  }

  // Strand: the connected frame, then the attachment, from `from` (the provider's offset; none:
  // live only).
  void attach(std::optional<uint64_t> from) {
    Terminal& t = *terminal_;
    uint64_t end = 0;
    bool running = true;
    sbx::Pty pty;
    {
      std::lock_guard lock(t.mutex);
      end = t.end;
      running = !t.exit_code;
      pty = t.pty;
    }
    if (!pty.valid()) {  // another client's attach is still starting it
      fail("pty session " + t.id + " is still starting; attach again");
      return;
    }
    live_from_ = since_ ? end : 0;
    json::object hello{{"type", "connected"},
                       {"session_id", t.id},
                       {"mode", tty_ ? "pty" : "pipe"},
                       {"running", running},
                       {"output_offset", end}};
    if (since_) hello["replay_from"] = std::min(*since_, end);
    send_text(json::serialize(hello));
    std::weak_ptr<PtySocket> weak = weak_from_this();
    try {
      attachment_ = pty.attach_async(
          {.since = from,
           .takeover = true,
           .on_output = [weak](sbx::OutputStream stream, uint64_t offset, std::string_view bytes) {
             if (auto self = weak.lock()) self->on_output(stream, offset, bytes);
           }});
    } catch (const sbx::Error& e) {
      fail(e.what());
      return;
    }
    attachment_->then([weak](sbx::Operation<int32_t>& op) {
      auto self = weak.lock();
      if (!self) return;
      std::optional<int32_t> code;
      std::string reason;
      sbx_status status = SBX_STATUS_OK;
      try {
        code = op.get();
      } catch (const sbx::Error& e) {
        status = e.status();
        reason = e.reason();
      }
      asio::post(self->ws_.get_executor(),
                 [self, code, status, reason] { self->attachment_ended(code, status, reason); });
    });
    read();
  }

  // A plugin thread: output for the client.
  void on_output(sbx::OutputStream stream, uint64_t offset, std::string_view bytes) {
    note_output(*terminal_, offset, bytes.size());
    std::string frame;
    if (since_ && offset < live_from_) {
      frame = '\x03' + offset_bytes(offset);
    } else {
      frame = stream == sbx::OutputStream::err ? '\x02' : '\x01';
    }
    frame.append(bytes);
    asio::post(ws_.get_executor(), [self = shared_from_this(), f = std::move(frame)]() mutable {
      self->send(Out{.data = std::move(f)});
    });
  }

  // Strand: the attachment ended.
  void attachment_ended(std::optional<int32_t> code, sbx_status status, const std::string& reason) {
    attachment_.reset();
    if (code) {
      {
        std::lock_guard lock(terminal_->mutex);
        terminal_->exit_code = code;
      }
      send_text(json::serialize(json::object{{"type", "exit"}, {"exit_code", *code}}));
      close(1000, "");
    } else if (reason == "taken_over") {
      close(kTakenOver, "TAKEN_OVER");
    } else if (status == SBX_STATUS_NOT_FOUND) {
      close(1000, "session deleted");
    } else if (status != SBX_STATUS_CANCELLED) {
      fail("the terminal's attachment failed");
    }
  }

  void read() {
    ws_.async_read(in_, [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
      self->on_read(ec);
    });
  }

  void on_read(boost::beast::error_code ec) {
    if (ec) {  // the client closed or went away: detach; the process goes on
      left();
      return;
    }
    const std::string data = boost::beast::buffers_to_string(in_.data());
    in_.consume(in_.size());
    if (!ws_.got_text()) {
      if (!data.empty() && data[0] == '\x00' && data.size() > 1) write_input(data.substr(1));
    } else {
      on_text(data);
    }
    read();
  }

  void write_input(std::string bytes) {
    sbx::Pty pty;
    {
      std::lock_guard lock(terminal_->mutex);
      pty = terminal_->pty;
    }
    try {
      pty.write_async(std::move(bytes));  // in the order started: this strand's order
    } catch (const sbx::Error& e) {
      send_error(e.what());
    }
  }

  void on_text(const std::string& data) {
    boost::system::error_code ec;
    const json::value v = json::parse(data, ec);
    const json::object* o = ec ? nullptr : v.if_object();
    const json::value* type = o ? o->if_contains("type") : nullptr;
    if (!type || !type->is_string()) {
      send_error("expected a JSON object with a type");
      return;
    }
    if (type->as_string() == "ping") {
      send_text(R"({"type":"pong"})");
    } else if (type->as_string() == "resize") {
      auto dimension = [&](const char* name) -> int64_t {
        const json::value* f = o->if_contains(name);
        const std::optional<int64_t> n = f ? integer_of(*f) : std::nullopt;
        return n.value_or(0);
      };
      const int64_t rows = dimension("rows"), cols = dimension("cols");
      if (rows < 1 || cols < 1 || rows > 65535 || cols > 65535) {
        send_error("resize needs rows and cols from 1 to 65535");
        return;
      }
      if (!tty_) return;  // nothing to resize in pipe mode
      sbx::Pty pty;
      {
        std::lock_guard lock(terminal_->mutex);
        pty = terminal_->pty;
      }
      pty.resize_async(static_cast<uint16_t>(rows), static_cast<uint16_t>(cols));
    } else if (type->as_string() == "signal") {
      const json::value* sig = o->if_contains("signal");
      std::string name = sig && sig->is_string() ? std::string(sig->as_string()) : "";
      if (name.starts_with("SIG")) name = name.substr(3);
      const char* key = name == "INT"    ? "\x03"
                        : name == "QUIT" ? "\x1c"
                        : name == "TSTP" ? "\x1a"
                                         : nullptr;
      if (!key || !tty_) {
        send_error("signal " + (name.empty() ? std::string("?") : name) +
                   (tty_ ? " is not supported here: only INT, QUIT and TSTP (the terminal's keys)"
                         : " is not supported in pipe mode"));
        return;
      }
      write_input(key);
    } else {
      send_error("unknown message type: " + std::string(type->as_string()));
    }
  }

  // Strand: the client is gone; the server watches the terminal again.
  void left() {
    if (attachment_) attachment_->cancel();
    std::lock_guard lock(terminal_->mutex);
    if (terminal_->holder.lock().get() == this) {
      terminal_->holder.reset();
      if (!evicted_) start_watcher(terminal_);
    }
  }

  void send_text(std::string text) { send(Out{.text = true, .data = std::move(text)}); }
  void send_error(const std::string& message) {
    send_text(json::serialize(json::object{{"type", "error"}, {"message", message}}));
  }
  void fail(const std::string& message) {
    send_error(message);
    close(1011, "");
  }
  void close(uint16_t code, std::string reason) {
    if (closing_) return;
    closing_ = true;
    out_.push_back(Out{.close = true, .code = code, .data = std::move(reason)});
    pump();
  }

  void send(Out out) {
    if (closing_ || gone_) return;
    unsent_ += out.data.size();
    out_.push_back(std::move(out));
    if (unsent_ > kMaxUnsent) {  // a client this slow is cut; the terminal goes on
      spdlog::info("sbx serve: terminal {}: a client {} bytes behind is cut", terminal_->id,
                   unsent_);
      boost::beast::get_lowest_layer(ws_).close();
      gone_ = true;
      return;
    }
    pump();
  }

  void pump() {
    if (writing_ || out_.empty() || gone_) return;
    writing_ = true;
    Out& next = out_.front();
    auto done = [self = shared_from_this()](boost::beast::error_code ec, std::size_t = 0) {
      self->writing_ = false;
      self->unsent_ -= self->out_.front().data.size();
      const bool was_close = self->out_.front().close;
      self->out_.pop_front();
      if (ec || was_close) {
        if (ec) self->gone_ = true;
        return;
      }
      self->pump();
    };
    if (next.close) {
      ws_.async_close(
          websocket::close_reason(static_cast<websocket::close_code>(next.code), next.data),
          [done](boost::beast::error_code ec) mutable { done(ec); });
      return;
    }
    ws_.text(next.text);
    ws_.async_write(asio::buffer(next.data), std::move(done));
  }

  websocket::stream<Connection> ws_;
  std::shared_ptr<const Request> request_;
  std::weak_ptr<sbx::Sandbox> box_;  // the entry's handle (a moved sandbox keeps the old one)
  std::shared_ptr<Terminal> terminal_;
  std::optional<uint64_t> since_;
  bool tty_;
  uint64_t live_from_ = 0;  // output before this offset is a replay (with since_)
  std::optional<sbx::Operation<int32_t>> attachment_;
  boost::beast::flat_buffer in_;
  std::deque<Out> out_;
  std::size_t unsent_ = 0;
  bool writing_ = false;
  bool closing_ = false;
  bool gone_ = false;
  bool evicted_ = false;
};

}  // namespace

void post_pty(const Call& call) {
  std::string cwd, command;
  const std::string& text = call.request.body();
  if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
    boost::system::error_code ec;
    const json::value v = json::parse(text, ec);
    if (ec || !v.is_object()) {
      call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
                             "invalid request body: the body must be a JSON object"));
      return;
    }
    for (const char* name : {"cwd", "command"}) {
      const json::value* f = v.as_object().if_contains(name);
      if (!f || f->is_null()) continue;
      if (!f->is_string()) {
        call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST_BODY",
                               std::string("invalid request body: ") + name + " must be a string"));
        return;
      }
      (std::string_view(name) == "cwd" ? cwd : command) = std::string(f->as_string());
    }
  }
  auto t = std::make_shared<Terminal>();
  t->id = new_request_id();
  t->cwd = cwd;
  t->command = command;
  std::shared_ptr<Terminal> forgotten;
  {
    std::lock_guard lock(call.entry->ptys->mutex);
    auto& table = *call.entry->ptys;
    if (table.terminals.size() >= kMaxTerminals) {  // the oldest that is not running goes
      for (auto it = table.order.begin(); it != table.order.end(); ++it) {
        auto& candidate = table.terminals.at(*it);
        std::lock_guard t_lock(candidate->mutex);
        if (!candidate->started || candidate->exit_code) {
          forgotten = candidate;
          table.terminals.erase(*it);
          table.order.erase(it);
          break;
        }
      }
      if (!forgotten) {
        call.reply(execd_error(call.request, http::status::service_unavailable, "RUNTIME_ERROR",
                               "too many PTY sessions (" + std::to_string(kMaxTerminals) +
                                   " running): delete one first"));
        return;
      }
    }
    table.terminals[t->id] = t;
    table.order.push_back(t->id);
  }
  if (forgotten) {
    std::lock_guard lock(forgotten->mutex);
    forgotten->deleted = true;
    if (forgotten->started) forgotten->pty.close_async();
  }
  call.reply(json_response(call.request, http::status::ok, json::object{{"session_id", t->id}}));
}

void get_pty(const Call& call) {
  const std::string& id = call.params.at(0);
  const auto t = find_terminal(call, id);
  if (!t) {
    call.reply(terminal_not_found(call.request, id));
    return;
  }
  json::object body{{"session_id", id}};
  {
    std::lock_guard lock(t->mutex);
    body["running"] = t->started && !t->exit_code;
    body["output_offset"] = t->end;
    if (t->exit_code) body["exit_code"] = *t->exit_code;
  }
  call.reply(json_response(call.request, http::status::ok, body));
}

void get_pty_ws(const Call& call) {
  const std::string& id = call.params.at(0);
  const auto t = find_terminal(call, id);
  if (!t) {
    call.reply(terminal_not_found(call.request, id));
    return;
  }
  if (!websocket::is_upgrade(call.request)) {
    call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST",
                           "a WebSocket upgrade is expected on /pty/" + id + "/ws"));
    return;
  }
  // The query: since (a byte offset), takeover, pty.
  std::optional<uint64_t> since;
  bool takeover = false, tty = true;
  for (const auto& [k, v] : query_params(call.request)) {
    if (k == "since") {
      if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
        call.reply(execd_error(call.request, http::status::bad_request, "INVALID_REQUEST",
                               "since must be a byte offset"));
        return;
      }
      since = std::stoull(v);
    } else if (k == "takeover") {
      takeover = v == "1" || v == "true";
    } else if (k == "pty") {
      tty = !(v == "0" || v == "false");
    }
  }
  {
    std::lock_guard lock(t->mutex);
    if (!t->holder.expired() && !takeover) {
      call.reply(
          execd_error(call.request, http::status::conflict, "SESSION_IN_USE",
                      "pty session " + id + " is attached elsewhere (takeover=1 evicts it)"));
      return;
    }
  }
  auto request = std::make_shared<const Request>(call.request);
  std::weak_ptr<sbx::Sandbox> box = call.entry->box();
  call.take_connection([request, t, since, tty, box](Connection connection) {
    std::make_shared<PtySocket>(std::move(connection), request, box, t, since, tty)->start();
  });
}

void delete_pty(const Call& call) {
  const std::string& id = call.params.at(0);
  std::shared_ptr<Terminal> t;
  {
    std::lock_guard lock(call.entry->ptys->mutex);
    auto& table = *call.entry->ptys;
    const auto it = table.terminals.find(id);
    if (it != table.terminals.end()) {
      t = it->second;
      table.terminals.erase(it);
      table.order.erase(std::find(table.order.begin(), table.order.end(), id));
    }
  }
  if (!t) {
    call.reply(terminal_not_found(call.request, id));
    return;
  }
  sbx::Pty pty;
  {
    std::lock_guard lock(t->mutex);
    t->deleted = true;
    if (!t->started) {
      call.reply(empty_response(call.request, http::status::ok));
      return;
    }
    pty = t->pty;
  }
  // The holder's attachment ends NOT_FOUND: its socket closes with 1000.
  pty.close_async().then([reply = call.reply, request = std::make_shared<const Request>(
                                                  call.request)](sbx::Operation<void>& op) {
    try {
      op.get();
    } catch (const sbx::NotFoundError&) {  // already gone with its process: deleted all the same
    } catch (const sbx::Error& e) {
      reply(execd_error(*request, http::status::internal_server_error, "RUNTIME_ERROR", e.what()));
      return;
    }
    reply(empty_response(*request, http::status::ok));
  });
}

}  // namespace sbx::serve
