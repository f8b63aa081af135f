// sbx._sbx: the host API (core/, sbx/sbx.hpp) for Python, through nanobind. Deliberately thin:
// the Python layer (sbx/_host.py) makes the public API, its awaitables and its errors.
//
// Every call is asynchronous: it takes `done`, a Python callable called exactly once, on a host
// thread with the GIL taken (or at once, when the operation has already ended), as
// done(value, None) or done(None, error), where error is a dict of the sbx::Error (status,
// message, retryable, reason, create_failure). The Python side hands it to its event loop with
// call_soon_threadsafe (no Python thread per call), or to a waiting thread for the blocking forms.
// Each returns an Op whose cancel() asks the provider to stop. No call holds the GIL while the
// host works.
//
// THREADING: every object may be used from any thread, as the C++ objects they hold.
// OWNERSHIP: a Sandbox here holds the sbx::Sandbox (closed when dropped unless detached); every
// object holds the Host it came from (a shared_ptr), so the host outlives its sandboxes.

#include <sbx/sbx.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <boost/json/parse.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

namespace nb = nanobind;

namespace {

nb::dict error_dict(const sbx::Error& e) {
  nb::dict d;
  d["status"] = std::string(e.status_name());
  d["message"] = std::string(e.what());
  d["retryable"] = e.retryable();
  d["reason"] = e.reason();
  d["create_failure"] = e.create_failure();
  return d;
}

// The interpreter's exit. A host thread must not be inside Python once finalization starts (a
// thread that asks for the GIL then is ended by pthread_exit, which unwinds through our GIL
// guards and aborts the process). So an atexit hook (quiesce(), registered at import) stops new
// entries and waits for those under way; from then on callbacks are skipped, and the Python
// objects they hold are left to the exiting process.
std::atomic<bool> g_exiting{false};
std::mutex g_calls_mutex;
std::condition_variable g_calls_done;
int g_calls = 0;  // host threads inside Python through PyCallback (guarded by g_calls_mutex)

bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return g_exiting.load() || Py_IsFinalizing() != 0;
#else
  return g_exiting.load() || _Py_IsFinalizing() != 0;
#endif
}

// Counts a thread in Python for quiesce(); `entered` false when the interpreter is exiting.
class PythonEntry {
 public:
  PythonEntry() {
    std::lock_guard lock(g_calls_mutex);
    entered_ = !finalizing();
    if (entered_) ++g_calls;
  }
  ~PythonEntry() {
    if (!entered_) return;
    std::lock_guard lock(g_calls_mutex);
    if (--g_calls == 0) g_calls_done.notify_all();
  }
  PythonEntry(const PythonEntry&) = delete;
  PythonEntry& operator=(const PythonEntry&) = delete;
  bool entered() const noexcept { return entered_; }

 private:
  bool entered_ = false;
};

// atexit: no host thread enters Python from now on; those inside finish (10 s at most).
void quiesce() {
  {
    std::lock_guard lock(g_calls_mutex);
    g_exiting.store(true);
  }
  nb::gil_scoped_release release;
  std::unique_lock lock(g_calls_mutex);
  g_calls_done.wait_for(lock, std::chrono::seconds(10), [] { return g_calls == 0; });
}

// A Python callable kept by C++ code that calls and drops it on any thread, with the GIL.
// `once`: dropped right after its call (a completion), so whatever still holds this object later
// holds no Python object.
class PyCallback {
 public:
  PyCallback(nb::callable fn, bool once) : fn_(new nb::callable(std::move(fn))), once_(once) {}
  PyCallback(const PyCallback&) = delete;
  PyCallback& operator=(const PyCallback&) = delete;
  ~PyCallback() {
    if (!fn_) return;
    const PythonEntry entry;
    if (!entry.entered()) return;
    nb::gil_scoped_acquire gil;
    delete fn_;
  }
  // Calls it with the arguments `make_args()` returns (a tuple, made with the GIL held); an
  // exception it raises is printed by Python (it has nobody to reach).
  template <class MakeArgs>
  void call(MakeArgs make_args) {
    const PythonEntry entry;
    if (!entry.entered()) return;
    nb::gil_scoped_acquire gil;
    if (!fn_) return;
    try {
      std::apply(*fn_, make_args());
    } catch (nb::python_error& e) {
      e.restore();
      PyErr_WriteUnraisable(fn_->ptr());
    }
    if (once_) {
      delete fn_;
      fn_ = nullptr;
    }
  }

 private:
  nb::callable* fn_;  // guarded by the GIL
  bool once_;
};

// Completes `done` from an Operation<T>: `convert` turns the value into a Python object (under
// the GIL).
template <class T, class Convert>
void complete_with(const sbx::Operation<T>& op, nb::callable done, Convert convert) {
  auto callback = std::make_shared<PyCallback>(std::move(done), true);
  op.then([callback, convert](sbx::Operation<T>& finished) mutable {
    std::optional<sbx::Error> error;
    std::optional<std::conditional_t<std::is_void_v<T>, std::monostate, T>> value;
    try {
      if constexpr (std::is_void_v<T>) {
        finished.get();
        value.emplace();
      } else {
        value.emplace(finished.get());
      }
    } catch (const sbx::Error& e) {
      error.emplace(e);
    } catch (const std::exception& e) {
      error.emplace(SBX_STATUS_INTERNAL, e.what());
    }
    callback->call([&] {
      if (error) return std::make_tuple(nb::object(nb::none()), nb::object(error_dict(*error)));
      if constexpr (std::is_void_v<T>) {
        return std::make_tuple(nb::object(nb::none()), nb::object(nb::none()));
      } else {
        return std::make_tuple(nb::object(nb::cast(convert(std::move(*value)))),
                               nb::object(nb::none()));
      }
    });
  });
}

// What an asynchronous call returns: its cancellation.
struct Op {
  std::function<void()> cancel_fn;
  void cancel() const {
    if (cancel_fn) cancel_fn();
  }
};

template <class T>
Op op_of(const sbx::Operation<T>& op) {
  return Op{[op] { op.cancel(); }};
}

// Starts an operation with the GIL released (`start` returns its Operation) and completes
// `done` from it with `convert`'s Python value (unused for Operation<void>).
template <class Start, class Convert>
Op start_op(Start start, nb::callable done, Convert convert) {
  decltype(start()) op;
  {
    nb::gil_scoped_release release;
    op = start();
  }
  complete_with(op, std::move(done), convert);
  return op_of(op);
}

constexpr auto kNoValue = [] {};

}  // namespace

namespace {

// The holders are destroyed by Python with the GIL held; what they hold may wait for host
// threads (a closing sandbox, the host joining its pool) whose callbacks need the GIL, so the
// last reference goes with the GIL released.
template <class T>
void release_without_gil(std::shared_ptr<T>& p) {
  if (p && p.use_count() == 1 && PyGILState_Check() && !finalizing()) {
    nb::gil_scoped_release release;
    p.reset();
  }
  p.reset();
}

struct HostHolder {
  std::shared_ptr<sbx::Host> host;
  ~HostHolder() { release_without_gil(host); }
};

// A sandbox from create() is closed when its last holder goes (as a C++ sbx::Sandbox is); one
// from connect() is left running (`owned` false): its owner is elsewhere.
struct SandboxHolder {
  std::shared_ptr<sbx::Host> host;
  std::shared_ptr<sbx::Sandbox> box;
  bool owned = true;
  ~SandboxHolder() {
    if (!owned && box && box.use_count() == 1) box->detach();
    release_without_gil(box);
    release_without_gil(host);
  }
};

struct ProviderHolder {
  std::shared_ptr<sbx::Host> host;
  sbx::Provider provider;
  ~ProviderHolder() { release_without_gil(host); }
};

// A persistent shell (sbx.session/1) or a terminal (sbx.pty/1) of a sandbox; each keeps the host.
struct SessionHolder {
  std::shared_ptr<sbx::Host> host;
  sbx::Session session;
  ~SessionHolder() { release_without_gil(host); }
};

struct PtyHolder {
  std::shared_ptr<sbx::Host> host;
  sbx::Pty pty;
  ~PtyHolder() { release_without_gil(host); }
};

nb::dict result_dict(const sbx::ExecResult& r) {
  nb::dict d;
  d["stdout"] = nb::bytes(r.stdout_text.data(), r.stdout_text.size());
  d["stderr"] = nb::bytes(r.stderr_text.data(), r.stderr_text.size());
  d["return_code"] = r.return_code;
  d["error_type"] = r.error_type;
  return d;
}

sbx::ExecOptions exec_options(std::optional<std::string> cwd,
                              std::map<std::string, std::string> env,
                              std::optional<double> timeout_s, std::optional<std::string> user,
                              std::optional<nb::callable> on_output) {
  sbx::ExecOptions options;
  options.cwd = std::move(cwd);
  options.env = std::move(env);
  options.timeout_s = timeout_s;
  options.user = std::move(user);
  if (on_output) {
    auto callback = std::make_shared<PyCallback>(std::move(*on_output), false);
    options.on_output = [callback](sbx::OutputStream stream, std::string_view bytes) {
      callback->call([&] {
        return std::make_tuple(stream == sbx::OutputStream::err ? 2 : 1,
                               nb::bytes(bytes.data(), bytes.size()));
      });
    };
  }
  return options;
}

}  // namespace

NB_MODULE(_sbx, m) {
  m.doc() = "The sbx host API (sbx/sbx.hpp) for the Python package; use the `sbx` package instead.";

  static nb::object host_error =
      nb::steal(PyErr_NewException("sbx._sbx.HostError", PyExc_RuntimeError, nullptr));
  m.attr("HostError") = host_error;
  m.def("_quiesce", &quiesce);
  nb::module_::import_("atexit").attr("register")(m.attr("_quiesce"));
  // A synchronous call's sbx::Error: HostError(dict), mapped by the Python layer.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const sbx::Error& e) {
      PyErr_SetObject(host_error.ptr(), error_dict(e).ptr());
    }
  });

  nb::class_<Op>(m, "Op").def("cancel", &Op::cancel);

  nb::class_<SandboxHolder>(m, "Sandbox")
      .def_prop_ro("id", [](const SandboxHolder& s) { return s.box->id(); })
      .def_prop_ro("provider_name", [](const SandboxHolder& s) { return s.box->provider_name(); })
      .def("supports",
           [](const SandboxHolder& s, const std::string& id) { return s.box->supports(id); })
      .def(
          "exec",
          [](const SandboxHolder& s, std::string command, std::optional<std::string> cwd,
             std::map<std::string, std::string> env, std::optional<double> timeout_s,
             std::optional<std::string> user, std::optional<nb::callable> on_output,
             nb::callable done) {
            auto options = exec_options(std::move(cwd), std::move(env), timeout_s, std::move(user),
                                        std::move(on_output));
            return start_op(
                [&] { return s.box->exec_async(std::move(command), std::move(options)); },
                std::move(done), [](sbx::ExecResult r) { return result_dict(r); });
          },
          nb::arg("command"), nb::arg("cwd").none(), nb::arg("env"), nb::arg("timeout_s").none(),
          nb::arg("user").none(), nb::arg("on_output").none(), nb::arg("done"))
      .def("upload",
           [](const SandboxHolder& s, std::string local, std::string remote, nb::callable done) {
             return start_op([&] { return s.box->upload_async(local, std::move(remote)); },
                             std::move(done), kNoValue);
           })
      .def("upload_bytes",
           [](const SandboxHolder& s, nb::bytes data, std::string remote, nb::callable done) {
             std::string contents(data.c_str(), data.size());
             return start_op(
                 [&] { return s.box->upload_bytes_async(std::move(contents), std::move(remote)); },
                 std::move(done), kNoValue);
           })
      .def("download",
           [](const SandboxHolder& s, std::string remote, std::string local, nb::callable done) {
             return start_op([&] { return s.box->download_async(std::move(remote), local); },
                             std::move(done), kNoValue);
           })
      .def("status",
           [](const SandboxHolder& s, nb::callable done) {
             return start_op(
                 [&] { return s.box->status_async(); }, std::move(done),
                 [](sbx::SandboxStatus status) { return std::string(sbx::to_string(status)); });
           })
      .def("pause",
           [](const SandboxHolder& s, nb::callable done) {
             return start_op([&] { return s.box->pause_async(); }, std::move(done), kNoValue);
           })
      .def("resume",
           [](const SandboxHolder& s, nb::callable done) {
             return start_op([&] { return s.box->resume_async(); }, std::move(done), kNoValue);
           })
      .def("serialize",
           [](const SandboxHolder& s, nb::callable done) {
             return start_op([&] { return s.box->serialize_async(); }, std::move(done),
                             [](std::string text) { return text; });
           })
      .def("renew",
           [](const SandboxHolder& s, double ttl_s, nb::callable done) {
             return start_op(
                 [&] {
                   if (!(ttl_s > 0) || !std::isfinite(ttl_s)) {
                     throw sbx::InvalidArgumentError("renew ttl_s must be a finite number > 0");
                   }
                   // Clamped as the host's own renew(ttl_s) does: no duration overflows.
                   const auto at = std::chrono::system_clock::now() + sbx::Deadlines::ms(ttl_s);
                   return s.box->renew_async(at);
                 },
                 std::move(done),
                 [](std::chrono::system_clock::time_point at) {
                   return std::chrono::duration<double>(at.time_since_epoch()).count();
                 });
           })
      .def("endpoint",
           [](const SandboxHolder& s, int64_t port, nb::callable done) {
             return start_op([&] { return s.box->endpoint_async(port); }, std::move(done),
                             [](sbx::Endpoint e) {
                               return std::make_pair(std::move(e.url), std::move(e.headers));
                             });
           })
      .def("close",
           [](const SandboxHolder& s, nb::callable done) {
             return start_op([&] { return s.box->close_async(); }, std::move(done), kNoValue);
           })
      .def("detach", [](const SandboxHolder& s) { s.box->detach(); })
      .def(
          "open_session",
          [](const SandboxHolder& s, std::optional<std::string> cwd,
             std::map<std::string, std::string> env, std::optional<std::string> user,
             nb::callable done) {
            sbx::SessionOptions options{
                .cwd = std::move(cwd), .env = std::move(env), .user = std::move(user)};
            return start_op([&] { return s.box->open_session_async(std::move(options)); },
                            std::move(done),
                            [host = s.host](sbx::Session session) {
                              return SessionHolder{host, std::move(session)};
                            });
          },
          nb::arg("cwd").none(), nb::arg("env"), nb::arg("user").none(), nb::arg("done"))
      .def("session",
           [](const SandboxHolder& s, std::string id) {
             return SessionHolder{s.host, s.box->session(std::move(id))};
           })
      .def(
          "open_pty",
          [](const SandboxHolder& s, std::optional<std::string> command,
             std::optional<std::string> cwd, std::map<std::string, std::string> env,
             std::optional<std::string> user, uint16_t rows, uint16_t cols, bool tty,
             nb::callable done) {
            sbx::PtyOptions options{.command = std::move(command),
                                    .cwd = std::move(cwd),
                                    .env = std::move(env),
                                    .user = std::move(user),
                                    .rows = rows,
                                    .cols = cols,
                                    .tty = tty};
            return start_op([&] { return s.box->open_pty_async(std::move(options)); },
                            std::move(done),
                            [host = s.host](sbx::Pty pty) {
                              return PtyHolder{host, std::move(pty)};
                            });
          },
          nb::arg("command").none(), nb::arg("cwd").none(), nb::arg("env"), nb::arg("user").none(),
          nb::arg("rows"), nb::arg("cols"), nb::arg("tty"), nb::arg("done"))
      .def("pty", [](const SandboxHolder& s, std::string id) {
        return PtyHolder{s.host, s.box->pty(std::move(id))};
      });

  nb::class_<SessionHolder>(m, "Session")
      .def_prop_ro("id", [](const SessionHolder& h) { return h.session.id(); })
      .def(
          "run",
          [](SessionHolder& h, std::string command, std::optional<std::string> cwd,
             std::map<std::string, std::string> env, std::optional<double> timeout_s,
             std::optional<nb::callable> on_output, nb::callable done) {
            auto options = exec_options(std::move(cwd), std::move(env), timeout_s, std::nullopt,
                                        std::move(on_output));
            return start_op(
                [&] { return h.session.run_async(std::move(command), std::move(options)); },
                std::move(done), [](sbx::ExecResult r) { return result_dict(r); });
          },
          nb::arg("command"), nb::arg("cwd").none(), nb::arg("env"), nb::arg("timeout_s").none(),
          nb::arg("on_output").none(), nb::arg("done"))
      .def("close", [](SessionHolder& h, nb::callable done) {
        return start_op([&] { return h.session.close_async(); }, std::move(done), kNoValue);
      });

  nb::class_<PtyHolder>(m, "Pty")
      .def_prop_ro("id", [](const PtyHolder& h) { return h.pty.id(); })
      .def(
          "attach",
          [](PtyHolder& h, std::optional<uint64_t> since, bool takeover,
             std::optional<nb::callable> on_attached, nb::callable on_output, nb::callable done) {
            auto callback = std::make_shared<PyCallback>(std::move(on_output), false);
            sbx::PtyAttachOptions options{
                .since = since,
                .takeover = takeover,
                .on_output = [callback](sbx::OutputStream stream, uint64_t offset,
                                        std::string_view bytes) {
                  callback->call([&] {
                    return std::make_tuple(stream == sbx::OutputStream::err ? 2 : 1, offset,
                                           nb::bytes(bytes.data(), bytes.size()));
                  });
                }};
            if (on_attached) {
              auto in_place = std::make_shared<PyCallback>(std::move(*on_attached), true);
              options.on_attached = [in_place] { in_place->call([] { return std::tuple<>(); }); };
            }
            return start_op([&] { return h.pty.attach_async(std::move(options)); }, std::move(done),
                            [](int32_t code) { return code; });
          },
          nb::arg("since").none(), nb::arg("takeover"), nb::arg("on_attached").none(),
          nb::arg("on_output"), nb::arg("done"))
      .def("write",
           [](PtyHolder& h, nb::bytes data, nb::callable done) {
             std::string input(data.c_str(), data.size());
             return start_op([&] { return h.pty.write_async(std::move(input)); }, std::move(done),
                             kNoValue);
           })
      .def("resize",
           [](PtyHolder& h, uint16_t rows, uint16_t cols, nb::callable done) {
             return start_op([&] { return h.pty.resize_async(rows, cols); }, std::move(done),
                             kNoValue);
           })
      .def("close", [](PtyHolder& h, nb::callable done) {
        return start_op([&] { return h.pty.close_async(); }, std::move(done), kNoValue);
      });

  nb::class_<ProviderHolder>(m, "Provider")
      .def_prop_ro("name", [](const ProviderHolder& p) { return p.provider.name(); })
      .def("create",
           [](const ProviderHolder& p, const std::string& spec_json, nb::callable done) {
             return start_op(
                 [&] {
                   return p.provider.create_async(
                       sbx::SandboxSpec::from_json(boost::json::parse(spec_json)));
                 },
                 std::move(done),
                 [host = p.host](sbx::Sandbox box) {
                   return SandboxHolder{host, std::make_shared<sbx::Sandbox>(std::move(box))};
                 });
           })
      .def("connect", [](const ProviderHolder& p, std::string descriptor, nb::callable done) {
        return start_op(
            [&] { return p.provider.connect_async(std::move(descriptor)); }, std::move(done),
            [host = p.host](sbx::Sandbox box) {
              return SandboxHolder{host, std::make_shared<sbx::Sandbox>(std::move(box)), false};
            });
      });

  nb::class_<HostHolder>(m, "Host")
      .def(
          "__init__",
          [](HostHolder* self, const std::string& config_json, const std::string& origin,
             std::vector<std::string> plugin_dirs, bool use_default_plugin_dirs,
             std::map<std::string, std::string> labels, std::string probe_program) {
            sbx::Host::Options options;
            options.config = sbx::Config::parse(config_json, origin);
            for (auto& dir : plugin_dirs)
              options.plugin_dirs.emplace_back(std::move(dir));
            options.use_default_plugin_dirs = use_default_plugin_dirs;
            options.labels = std::move(labels);
            options.probe_program = probe_program;
            std::shared_ptr<sbx::Host> host;
            {
              nb::gil_scoped_release release;
              host = std::make_shared<sbx::Host>(std::move(options));
            }
            new (self) HostHolder{std::move(host)};
          },
          nb::arg("config_json"), nb::arg("origin"), nb::arg("plugin_dirs"),
          nb::arg("use_default_plugin_dirs"), nb::arg("labels"), nb::arg("probe_program"))
      .def("provider", [](const HostHolder& h, const std::string& name) {
        nb::gil_scoped_release release;
        return ProviderHolder{h.host, h.host->provider(name)};
      });
}
