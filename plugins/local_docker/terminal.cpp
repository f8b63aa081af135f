// ExecTerminal (terminal.hpp): a terminal as a Docker exec on a hijacked connection.

#include "terminal.hpp"

#include "exec.hpp"

#include <boost/json/serialize.hpp>

#include <chrono>

namespace sbx::local_docker {
namespace {

namespace json = boost::json;

constexpr std::chrono::milliseconds kTimeout{10'000};  // the start's answer, a send, a resize

// The script the exec's shell runs: the size first (an exec gets its console size only after it
// has started, and the command may look at once: API 1.42's ConsoleSize is not in 1.41), then
// the command, or an interactive shell: bash when the image has it, else the shell itself ($0).
std::string terminal_script(const sdk::PtyRequest& request) {
  std::string script;
  if (request.tty) {
    script = "stty rows " + std::to_string(request.rows) + " cols " + std::to_string(request.cols) +
             " 2>/dev/null\n";
  }
  if (request.command) return script + *request.command;
  return script + "command -v bash >/dev/null 2>&1 && exec bash\nexec \"$0\"";
}

// What a pipe-mode terminal's multiplexed stream writes: stdout and stderr, in order.
struct PipeOutput {
  sdk::TerminalOutput& output;
  void begin_frame(uint8_t, uint64_t) {}
  void write(uint8_t stream, std::string_view bytes) {
    output.append(stream == 2 ? sdk::StdStream::err : sdk::StdStream::out, bytes);
  }
  void end_frame() {}
};

}  // namespace

ExecTerminal::ExecTerminal(DockerApi& api, std::string container, std::string shell,
                           const sdk::PtyRequest& request, std::optional<std::string> user,
                           sdk::Logger log, const sdk::CancelToken& cancel)
    : api_(api),
      container_(std::move(container)),
      shell_(std::move(shell)),
      user_(std::move(user)),
      tag_(random_hex(16)),
      tty_(request.tty),
      log_(log) {
  ExecParams params;
  params.argv = {shell_, "-c", terminal_script(request), shell_};
  params.env = request.env;
  if (request.tty) params.env.emplace("TERM", "xterm-256color");  // unless set: as the agent does
  params.cwd = request.cwd;
  params.user = user_;
  params.tty = request.tty;
  params.open_stdin = true;
  if (const auto message = oversized_argument(params)) throw sdk::Error::invalid_argument(*message);
  exec_id_ = create_exec(api_, container_, params, tag_, cancel);
  id_ = "x" + exec_id_.substr(0, 16);
  sdk::UpgradedStream::Request start{
      .method = "POST",
      .target = api_.versioned("/exec/" + exec_id_ + "/start", cancel),
      .protocol = "tcp",
      .headers = {{"Content-Type", "application/json"}},
      .body = json::serialize(json::object{{"Detach", false}, {"Tty", request.tty}})};
  try {
    stream_.emplace(sdk::UpgradedStream::open({.unix_socket = api_.socket()}, start, kTimeout));
  } catch (const sdk::Error& e) {
    throw sdk::Error(e.status(), "starting a terminal in sandbox " + container_ + ": " + e.what());
  }
  reader_ = std::thread([this] { read_loop(); });
}

ExecTerminal::~ExecTerminal() {
  closing_.store(true);
  stream_->shutdown();
  if (reader_.joinable()) reader_.join();
  output_.close();
}

void ExecTerminal::check_running() const {
  if (const auto code = output_.exit_code()) {
    throw sdk::Error::failed_precondition("terminal " + id_ + " has exited (code " +
                                          std::to_string(*code) + ")");
  }
}

void ExecTerminal::write(std::string_view input) {
  check_running();
  std::lock_guard lock(send_mutex_);
  stream_->send(input);
}

void ExecTerminal::resize(uint16_t rows, uint16_t cols) {
  check_running();
  if (!tty_) return;  // a pipe has no size
  api_.call(
      "POST",
      "/exec/" + exec_id_ + "/resize?h=" + std::to_string(rows) + "&w=" + std::to_string(cols), "",
      "resizing terminal " + id_ + " in sandbox " + container_, sdk::CancelToken(), kTimeout);
}

void ExecTerminal::kill() {
  kill_tagged(api_, container_, shell_, user_, tag_, log_);
}

void ExecTerminal::read_loop() {
  std::string chunk;
  PipeOutput pipe{output_};
  FrameDecoder<PipeOutput> frames(pipe);
  try {
    while (stream_->read_some(chunk)) {
      if (tty_) {
        output_.append(sdk::StdStream::out, chunk);
      } else {
        frames.feed(chunk);
      }
      chunk.clear();
    }
  } catch (const std::exception& e) {  // a stream that is not Docker's frames
    log_.warn("terminal ", id_, " of sandbox ", container_, ": ", e.what());
    stream_->shutdown();
    output_.close();
    return;
  }
  // The end of the stream: the process exited, or the stream was shut (the handle is going, the
  // container was removed): then there is no exit code to ask for, and the attachment ends
  // NOT_FOUND.
  if (closing_.load()) return;
  try {
    const ExecState state = wait_exit_code(api_, exec_id_, container_, sdk::CancelToken());
    output_.exited(*state.exit_code);
  } catch (const sdk::Error& e) {
    log_.debug("terminal ", id_, " of sandbox ", container_,
               " ended without an exit code: ", e.what());
    output_.close();
  }
}

void ExecTerminals::add(std::shared_ptr<ExecTerminal> terminal) {
  std::lock_guard lock(mutex_);
  terminals_.emplace(terminal->id(), std::move(terminal));
}

std::shared_ptr<ExecTerminal> ExecTerminals::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  if (it == terminals_.end()) throw sdk::Error::not_found("terminal " + id + " not found");
  return it->second;
}

std::shared_ptr<ExecTerminal> ExecTerminals::take(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = terminals_.find(id);
  if (it == terminals_.end()) throw sdk::Error::not_found("terminal " + id + " not found");
  auto terminal = std::move(it->second);
  terminals_.erase(it);
  return terminal;
}

void ExecTerminals::clear() {
  std::map<std::string, std::shared_ptr<ExecTerminal>> gone;
  {
    std::lock_guard lock(mutex_);
    gone.swap(terminals_);
  }
  // Destroyed here, outside the lock: each joins its reader.
}

}  // namespace sbx::local_docker
