// xmesh._core: the pybind11 face of libxmesh. Everything that waits releases the GIL and
// waits in slices of at most 100 ms, checking for signals between slices, so Ctrl-C works
// in the middle of a wait (DESIGN §4).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <mutex>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include "call.hpp"
#include "data_node.hpp"
#include "data_plane.hpp"
#include "device_memory.hpp"
#include "ibverbs_probe.hpp"
#include "rdma_nic.hpp"
#include "keys.hpp"
#include "inbox.hpp"
#include "log_router.hpp"
#include "bodies.hpp"
#include "body_bindings.hpp"
#include "json_py.hpp"
#include "layout.hpp"
#include "log_record.hpp"
#include "node.hpp"
#include "waker.hpp"
#include "output_marker.hpp"
#include "process.hpp"
#include "shape.hpp"
#include "util.hpp"
#include "wire.hpp"

namespace py = pybind11;
using namespace xmesh;

namespace {

// The CUDA driver for device memory (runtime/data/device_memory.hpp), or a RuntimeError saying why
// there is none.
std::shared_ptr<DeviceMemory> cuda_or_throw() {
  std::string why;
  auto driver = load_cuda_driver(&why);
  if (!driver) throw std::runtime_error(why);
  return driver;
}

// ---- Payload frames --------------------------------------------------------------------
// Large buffers are sent without copying: ZeroMQ keeps a pointer to the Python buffer and
// calls free_buffer when done, possibly on its own I/O thread where the GIL cannot be taken.
// Releases are queued and done on the next call into the module that holds the GIL.
struct HeldBuffer {
  Py_buffer view;
};
std::mutex g_release_mu;
std::vector<HeldBuffer*> g_release;
// Python objects whose memory a data thread used (a transfer's source or destination), let go
// the same way: the thread that finished with them cannot take the GIL.
std::vector<PyObject*> g_release_objects;

void free_buffer(void*, void* hint) {
  std::lock_guard<std::mutex> g(g_release_mu);
  g_release.push_back(static_cast<HeldBuffer*>(hint));
}

void drain_releases() {
  std::vector<HeldBuffer*> todo;
  std::vector<PyObject*> objects;
  {
    std::lock_guard<std::mutex> g(g_release_mu);
    todo.swap(g_release);
    objects.swap(g_release_objects);
  }
  for (auto* h : todo) {
    PyBuffer_Release(&h->view);
    delete h;
  }
  for (auto* o : objects) Py_DECREF(o);
}

constexpr size_t kZeroCopyMin = 64 * 1024;

std::vector<zmq::message_t> to_frames(const py::handle& frames) {
  drain_releases();
  std::vector<zmq::message_t> out;
  if (frames.is_none()) return out;
  for (auto f : frames) {
    auto* h = new HeldBuffer;
    if (PyObject_GetBuffer(f.ptr(), &h->view, PyBUF_SIMPLE) != 0) {
      delete h;
      PyErr_Clear();
      // PickleBuffers of non-contiguous data and the like: fall back to a contiguous copy.
      py::bytes b = py::module_::import("builtins").attr("bytes")(py::module_::import("builtins").attr("memoryview")(f));
      std::string s = b;
      out.emplace_back(s.data(), s.size());
      continue;
    }
    if (static_cast<size_t>(h->view.len) < kZeroCopyMin) {
      out.emplace_back(h->view.buf, static_cast<size_t>(h->view.len));
      PyBuffer_Release(&h->view);
      delete h;
    } else {
      out.emplace_back(h->view.buf, static_cast<size_t>(h->view.len), free_buffer, h);
    }
  }
  return out;
}

// A received payload frame, exposed to Python through the buffer protocol (writable, so
// numpy arrays rebuilt on top of it without a copy are ordinary writable arrays).
struct Frame {
  zmq::message_t msg;
};

py::list frames_to_py(std::vector<zmq::message_t>& frames) {
  py::list l;
  for (auto& f : frames) {
    if (f.size() < kZeroCopyMin) {  // small: a bytes copy is cheaper than a Frame object
      l.append(py::bytes(static_cast<const char*>(f.data()), f.size()));
      continue;
    }
    auto fr = std::make_unique<Frame>();
    fr->msg.move(f);
    l.append(py::cast(std::move(fr)));
  }
  frames.clear();
  return l;
}

// A message handed to Python; payload frames move out on first access.
struct PyMessage {
  Message m;
  py::object frames_cache;
};

// Waits in slices, releasing the GIL, checking signals between slices.
template <class F>
bool wait_sliced(F ready_within_ms, double timeout_s) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                                     timeout_s < 0 ? 0.0 : timeout_s));
  while (true) {
    int slice = 100;
    if (timeout_s >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      slice = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(100, left)));
    }
    // Not py::gil_scoped_release: its destructor is noexcept, and a daemon thread that takes the
    // GIL back while the interpreter finalizes is ended with a forced unwind (std::terminate
    // through a noexcept frame). Such a thread parks instead; the process is exiting.
    PyThreadState* ts = PyEval_SaveThread();
    bool ok = ready_within_ms(slice);
    if (_Py_IsFinalizing())
      for (;;) pause();
    PyEval_RestoreThread(ts);
    if (ok) return true;
    drain_releases();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout_s >= 0 && clock::now() >= deadline) return false;
  }
}

double opt_timeout(const py::object& t) { return t.is_none() ? -1.0 : t.cast<double>(); }

py::object pop_inbox(Inbox& box, const py::object& timeout) {
  std::optional<Message> got;
  bool ok = wait_sliced(
      [&](int ms) {
        got = box.pop(ms);
        return got.has_value() || box.closed();
      },
      opt_timeout(timeout));
  if (!ok || !got) return py::none();
  auto pm = std::make_unique<PyMessage>();
  pm->m = std::move(*got);
  return py::cast(std::move(pm));
}

Header make_header(int kind, const py::object& body, const std::string& actor, const std::string& method,
                   uint64_t corr, int64_t index, const py::object& ctx) {
  if (!kind_known(kind)) throw py::value_error("unknown message kind " + std::to_string(kind));
  Header h;
  h.kind = static_cast<Kind>(kind);
  h.body = from_py(body);
  if (!h.body.is_null() && !h.body.is_object()) throw py::type_error("message body must be a dict");
  h.actor = actor;
  h.method = method;
  h.corr = corr;
  h.index = index;
  h.ctx = from_py(ctx);
  return h;
}

void translate_shape_error(const ShapeError& e) {
  switch (e.type) {
    case ShapeError::TypeErr: PyErr_SetString(PyExc_TypeError, e.what()); return;
    case ShapeError::IndexErr: PyErr_SetString(PyExc_IndexError, e.what()); return;
    case ShapeError::KeyErr: PyErr_SetString(PyExc_KeyError, e.what()); return;
    default: PyErr_SetString(PyExc_ValueError, e.what()); return;
  }
}

// ---- Running a function on the main thread --------------------------------------------------
// Py_AddPendingCall runs it between two bytecodes of the main thread, as for a signal handler:
// the kernel prints remote output there while a cell computes (only the main thread may print).
std::mutex g_main_call_mu;
py::object* g_main_call = nullptr;  // the function to run; set and cleared with the GIL held
bool g_main_call_scheduled = false;

int run_main_call(void*) {
  py::object* fn;
  {
    std::lock_guard<std::mutex> g(g_main_call_mu);
    g_main_call_scheduled = false;
    fn = g_main_call;
  }
  if (fn && !fn->is_none()) {
    PyObject* r = PyObject_CallNoArgs(fn->ptr());
    if (!r) PyErr_WriteUnraisable(fn->ptr());  // never raise into the user's code
    Py_XDECREF(r);
  }
  return 0;
}

py::object decode_text(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

}  // namespace

void bind_debugger(py::module_& m);  // debugger_bindings.cpp
void bind_workspace(py::module_& m);  // workspace_bindings.cpp

// Versions, directories, names, process helpers.
void bind_process(py::module_& m) {
  m.def("protocol_version", &protocol_version);
  m.def("version", []() { return version_string(); });
  m.def("build_id", []() { return build_id(); });
  m.def("runtime_dir", &runtime_dir);
  m.def("ensure_private_dir", [](const std::string& path) {
    try {
      make_dirs(path, 0700);
      check_private_dir(path);
    } catch (const std::runtime_error& e) {
      throw py::value_error(e.what());
    }
  }, "Creates path (0700) if needed; PermissionError if it belongs to another user.");
  m.def("hostname", &hostname);
  m.def(
      "process_status",
      [](int64_t pid) -> py::object {
        auto st = process_status(static_cast<pid_t>(pid));
        if (!st) return py::none();
        return py::make_tuple(std::string(1, st->state), st->start_ticks, st->unusual());
      },
      py::arg("pid"),
      "(state letter, start time in ticks, what is unusual: 'stopped', 'in the kernel' or '') from /proc, "
      "or None when no such process runs (a zombie included).");
  m.def("name_os_thread", [](const std::string& name) {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // Linux keeps 15 bytes
  }, "Names the calling thread for top -H, perf and gdb (Python 3.11 does not).");
  m.def("random_hex", &random_hex);
  // Key files for hosts over TCP (runtime/transport/keys.hpp); a bad file raises KeyFileError naming why.
  m.def("curve_available", &curve_available);
  m.def("write_new_key_file", [](const std::string& path, bool overwrite) {
    auto keys = generate_curve_keys();
    write_key_file(path, keys, overwrite);
    return keys.public_z85;
  }, py::arg("path"), py::arg("overwrite") = false, "Writes a fresh keypair (mode 0600); returns its public key.");
  m.def("key_file_public_key", [](const std::string& path) { return read_key_file(path).public_z85; },
        py::arg("path"), "Checks a key file (owner, mode, a valid pair) and returns its public key.");
  m.def("key_file_cluster_cookie", [](const std::string& path) { return cluster_cookie(read_key_file(path)); },
        py::arg("path"), "The cookie a controller holding this key presents to host agents over TCP.");
  m.def("drain_releases", &drain_releases);
  m.def("libxmesh_path", []() {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&protocol_version), &info) && info.dli_fname) return std::string(info.dli_fname);
    return std::string();
  });
  m.def("spawn_detached", [](const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    return spawn_detached(argv, env);
  });
  m.def("set_parent_death_signal", &set_parent_death_signal, py::arg("sig"), py::arg("expected_parent"));
  m.def("signal_name", &signal_name);
  m.def("format_bytes", &format_bytes, py::arg("n"), "'1.5 MiB': the one way sizes are written.");
}

// The protocol's enums, generated from runtime/protocol/kinds.def and errors.def.
void bind_protocol(py::module_& m) {
  py::enum_<Kind> kinds(m, "Kind", py::arithmetic());  // from runtime/protocol/kinds.def, the one list
#define XMESH_KIND(name, number, wire_name) kinds.value(#name, Kind::name);
#include "kinds.def"
#undef XMESH_KIND
  m.def("error_kinds", []() {
    std::vector<std::pair<std::string, std::string>> out;  // (Name, wire name), from errors.def
#define XMESH_ERROR(name, wire_name) out.emplace_back(#name, wire_name);
#include "errors.def"
#undef XMESH_ERROR
    return out;
  }, "The error kinds of runtime/protocol/errors.def as (name, wire name): xmesh._protocol.ErrorKind.");
}

// Received messages: payload frames (buffer protocol, no copy), Message, Inbox.
template <class T>
T parse_body(PyMessage& p) {
  return body_py::from_json_checked<T>(p.m.header.body);
}

// The typed message bodies (runtime/protocol/bodies.hpp), each a class made from its own field list
// (body_bindings.hpp); a received message reads its body with `msg.cancel()` and the like.
void bind_bodies(py::module_& m) {
  bind_body<ErrorBody>(m, "ErrorBody", "A failed reply's body, a supervision error, a Fault.");
  bind_body<ProcExitedBody>(m, "ProcExitedBody", "ProcExited: a proc ended.");
  bind_body<LogBody>(m, "LogBody", "Log: complete lines of one proc stream.");
  bind_body<PeerDeadBody>(m, "PeerDeadBody", "PeerDead: a peer address died.");
  bind_body<ReloadBody>(m, "ReloadBody", "Reload: reload the modules of these synced files.");
  bind_body<CancelBody>(m, "CancelBody", "Cancel: cancel one target of a call.");
  bind_body<ConfigureBody>(m, "ConfigureBody", "Configure: settings for procs; only those given change.");
  bind_body<AdoptBody>(m, "AdoptBody", "Adopt: a controller adopts a proc.");
  bind_body<SpawnRank>(m, "SpawnRank", "One rank of a SpawnProcs request.");
  bind_body<SpawnProcsBody>(m, "SpawnProcsBody", "SpawnProcs: start an allocation's procs on a host.");
  bind_body<ProcEntry>(m, "ProcEntry", "A proc an agent started or runs.");
  bind_body<SpawnProcsReply>(m, "SpawnProcsReply", "What an agent started.");
  bind_body<StopProcsBody>(m, "StopProcsBody", "StopProcs: stop an allocation, by id or name.");
  bind_body<StopProcsReply>(m, "StopProcsReply", "Which allocation an agent stops.");
  bind_body<AttachBody>(m, "AttachBody", "Attach: take over (or observe) a live named allocation.");
  bind_body<PreviousOwner>(m, "PreviousOwner", "The controller that owned an allocation before.");
  bind_body<AttachReply>(m, "AttachReply", "What a controller needs to reach an attached allocation.");
  bind_body<AllocationStatus>(m, "AllocationStatus", "One allocation of an agent's Status.");
  bind_body<BufferLeaseBody>(m, "BufferLeaseBody", "BufferLease: a lease on a range of an RDMA buffer, for reading or writing.");
  bind_body<BufferLeaseReply>(m, "BufferLeaseReply", "Where a leased range is: the owner's pid, the address there, the lease.");
  bind_body<BufferReleaseBody>(m, "BufferReleaseBody", "BufferRelease / BufferDrop: a lease ended, or a buffer lent no more.");
  bind_body<PortCounts>(m, "PortCounts", "What an agent's one TCP port did: connections relayed, lanes handed over, refused.");
  bind_body<StatusReply>(m, "StatusReply", "What an agent runs.");
  bind_body<CallBody>(m, "CallBody", "Call: the message's point when not the actor's own, and a port for the reply.");
  bind_body<SpawnActorBody>(m, "SpawnActorBody", "SpawnActor: create one actor of a mesh on a proc.");
  bind_body<ActorRecord>(m, "ActorRecord", "A live actor as its proc describes it.");
  bind_body<RefuseBody>(m, "RefuseBody", "Refuse: why a connection is refused.");
  bind_body<ReloadReply>(m, "ReloadReply", "What a Reload did in one process.");
  bind_body<ReadLogBody>(m, "ReadLogBody", "ReadLog: list a log directory of a host agent, or read part of a file.");
  bind_body<LogFileEntry>(m, "LogFileEntry", "One file of a log directory: name and size.");
  bind_body<ReadLogReply>(m, "ReadLogReply", "ReadLog's answer: the files, or the size of the file read (bytes: payload).");
  bind_body<ProcInfoBody>(m, "ProcInfoBody", "ProcInfo: ask a proc its pid and actors.");
  bind_body<ProcInfoReply>(m, "ProcInfoReply", "A proc's pid and actors.");
  bind_body<DumpStacksReply>(m, "DumpStacksReply", "Every thread's stack of a proc, answered by its I/O thread.");
  bind_body<FlushOutputReply>(m, "FlushOutputReply", "The output marker a FlushOutput wrote.");
  bind_body<DebugEventBody>(m, "DebugEventBody", "DebugEvent: a pdb session stopped, runs, ended or asks for sources.");
  bind_body<DebugCommandBody>(m, "DebugCommandBody", "DebugCommand: a pdb command for one session.");
  bind_body<SyncStepBody>(m, "SyncStepBody", "Sync: one step of a workspace sync.");
  bind_body<SyncReply>(m, "SyncReply", "A host's answer to a Sync step.");
  bind_body<RankMeta>(m, "RankMeta", "One rank in procs.json.");
  bind_body<AllocationMeta>(m, "AllocationMeta", "procs.json: an allocation's log directory described.");
}

void bind_messages(py::module_& m) {
  py::class_<Frame>(m, "Frame", py::buffer_protocol())
      .def_buffer([](Frame& f) {
        return py::buffer_info(f.msg.data(), 1, py::format_descriptor<uint8_t>::format(), 1, {f.msg.size()}, {1},
                               /*readonly=*/false);
      })
      .def("__len__", [](Frame& f) { return f.msg.size(); })
      .def("bytes", [](Frame& f) { return py::bytes(static_cast<const char*>(f.msg.data()), f.msg.size()); });

  py::class_<PyMessage>(m, "Message")
      .def_property_readonly("kind", [](PyMessage& p) { return p.m.header.kind; })
      .def_property_readonly("sender", [](PyMessage& p) { return p.m.header.sender; })
      .def_property_readonly("sender_addr", [](PyMessage& p) { return p.m.sender_addr; })
      .def_property_readonly("gathered", [](PyMessage& p) { return p.m.gathered; },
                             "It came through a cast tree: its answer goes up the tree (node.reply).")
      .def_property_readonly("corr", [](PyMessage& p) { return p.m.header.corr; })
      .def_property_readonly("index", [](PyMessage& p) { return p.m.header.index; })
      .def_property_readonly("actor", [](PyMessage& p) { return p.m.header.actor; })
      .def_property_readonly("method", [](PyMessage& p) { return p.m.header.method; })
      .def_property_readonly("body", [](PyMessage& p) { return to_py(p.m.header.body.is_null() ? json::object() : p.m.header.body); })
      .def_property_readonly("ctx", [](PyMessage& p) { return to_py(p.m.header.ctx); })
      .def_property_readonly("frames", [](PyMessage& p) {
        if (!p.frames_cache) p.frames_cache = frames_to_py(p.m.frames);
        return p.frames_cache;
      })
      // The typed bodies (runtime/protocol/bodies.hpp); ValueError naming a bad field.
      .def("proc_exited", &parse_body<ProcExitedBody>)
      .def("cancel", &parse_body<CancelBody>)
      .def("configure", &parse_body<ConfigureBody>)
      .def("adopt", &parse_body<AdoptBody>)
      .def("peer_dead", &parse_body<PeerDeadBody>)
      .def("reload", &parse_body<ReloadBody>)
      .def("fault", &parse_body<ErrorBody>)
      .def("proc_info", &parse_body<ProcInfoBody>)
      .def("spawn_actor", &parse_body<SpawnActorBody>)
      .def("call_body", &parse_body<CallBody>)
      .def_property_readonly("has_body", [](PyMessage& p) {
        return p.m.header.body.is_object() && !p.m.header.body.empty();
      })
      .def("refuse", &parse_body<RefuseBody>)
      .def("debug_event", &parse_body<DebugEventBody>)
      .def("debug_command", &parse_body<DebugCommandBody>)
      .def("__repr__", [](PyMessage& p) {
        return std::string("<xmesh message ") + kind_name(p.m.header.kind) + " from " + p.m.header.sender + ">";
      });


  py::class_<Inbox, std::shared_ptr<Inbox>>(m, "Inbox")
      .def("pop", &pop_inbox, py::arg("timeout") = py::none(),
           "Waits for the next message (None on timeout or when closed and empty).")
      .def("fileno", &Inbox::fd)
      .def("close", &Inbox::close)
      .def_property_readonly("closed", &Inbox::closed)
      .def("__len__", &Inbox::size);

  py::enum_<WaitOutcome>(m, "WaitOutcome")
      .value("Ready", WaitOutcome::Ready)
      .value("Woken", WaitOutcome::Woken)
      .value("Timeout", WaitOutcome::Timeout);
}

// The runtime directory's layout (runtime/base/layout.hpp), defined once in C++.
void bind_layout(py::module_& m) {
  m.def("layout_workspace_root", &layout::workspace_root, py::arg("runtime_dir"));
  m.def("layout_named_space", &layout::named_space, py::arg("name"));
  m.def("layout_controller_space", &layout::controller_space, py::arg("controller_id"));
  m.def("layout_hostd_socket", &layout::hostd_socket, py::arg("runtime_dir"));
  m.def("layout_hostd_pid_file", &layout::hostd_pid_file, py::arg("runtime_dir"));
  m.def("layout_hostd_log", &layout::hostd_log, py::arg("runtime_dir"));
  m.def("layout_cookie_file", &layout::cookie_file, py::arg("runtime_dir"));
  m.def("layout_proc_address", &layout::proc_address, py::arg("runtime_dir"), py::arg("alloc"), py::arg("rank"));
  m.def("layout_controller_dir", &layout::controller_dir, py::arg("runtime_dir"));
  m.def("layout_logs_root", &layout::logs_root, py::arg("runtime_dir"));
  m.def("layout_log_dir", &layout::log_dir, py::arg("runtime_dir"), py::arg("name"), py::arg("alloc"));
  m.def("layout_sync_cache_dir", &layout::sync_cache_dir, py::arg("runtime_dir"));
  m.def("layout_rank_log_file", &layout::rank_log_file, py::arg("log_dir"), py::arg("rank"));
  m.def("layout_procs_meta_file", &layout::procs_meta_file, py::arg("log_dir"));
  m.def("layout_rank_log_of", &layout::rank_log_of, py::arg("filename"),
        "(rank, rotation) of a rank's log file name (rotation 0: the live file), or None.");
  // The log record format (runtime/output/log_record.hpp): (time, stream, partial, actor, text), or None.
  m.def("parse_log_record", [](py::bytes line) -> py::object {
    std::string_view v = line;
    auto r = parse_record(v);
    if (!r) return py::none();
    auto text = [](const std::string& s) {  // as Python's decode("utf-8", "replace")
      return py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
    };
    return py::make_tuple(r->time, r->stream, r->partial, text(r->actor), text(r->text));
  }, py::arg("line"));
}

// Calls and the one wait (runtime/node/call.hpp, waker.hpp).
void bind_calls(py::module_& m) {
  m.def("wake_main", []() { main_waker().notify(); },
        "Wakes the main thread's wait (output to show, a debugger stop); kept if nobody waits.");
  m.def("take_wake", []() { return main_waker().take(); }, "True if wake_main() came since the last take.");
  m.def("wake_fd", []() { return main_waker().fd(); }, "An fd readable while a wake_main() is pending.");
  py::class_<Call, std::shared_ptr<Call>>(m, "Call")
      .def_property_readonly("id", &Call::id)
      .def("__len__", &Call::size)
      .def_property_readonly("done", &Call::done)
      .def_property_readonly("received", &Call::received)
      .def_property_readonly("fatal", &Call::fatal)
      .def_property_readonly("is_port", &Call::is_port)
      .def("target_addr", &Call::target_addr)
      .def("wait", [](Call& c, const py::object& timeout) {
        return wait_sliced([&](int ms) { return c.wait_done(ms); }, opt_timeout(timeout));
      }, py::arg("timeout") = py::none())
      .def("wait_for", [](const std::shared_ptr<Call>& c, const py::object& timeout, bool any, bool wakeable) {
        // wakeable: the main thread's wait, which main_waker().notify() interrupts (Woken).
        struct Leave {
          bool on;
          ~Leave() { if (on) main_waker().leave(); }
        } leave{wakeable};
        if (wakeable) main_waker().enter(c);
        WaitOutcome out = WaitOutcome::Timeout;
        bool ended = wait_sliced([&](int ms) {
          out = c->wait_for(any, ms);
          return out != WaitOutcome::Timeout;
        }, opt_timeout(timeout));
        return ended ? out : WaitOutcome::Timeout;
      }, py::arg("timeout"), py::arg("any") = false, py::arg("wakeable") = false,
         "The one wait (see runtime/node/call.hpp wait_for): Ready, Woken or Timeout.")
      .def("take", [](Call& c) {
        py::list out;
        for (auto& r : c.take())
          out.append(py::make_tuple(r.index, r.ok, to_py(r.body.is_null() ? json::object() : r.body), frames_to_py(r.frames)));
        return out;
      })
      .def("missing", &Call::missing, "indexes of the targets that have not answered")
      .def("fail_all", [](Call& c, const py::object& err) { return c.fail_all(from_py(err)); })
      .def("fileno", &Call::fd);
}

// The process's node (runtime/node/node.hpp).
void bind_node(py::module_& m) {
  py::class_<NodeStats>(m, "NodeStats")
      .def_readonly("sent", &NodeStats::sent)
      .def_readonly("received", &NodeStats::received)
      .def_readonly("rejected", &NodeStats::rejected)
      .def_readonly("malformed", &NodeStats::malformed)
      .def_readonly("gaps", &NodeStats::gaps)
      .def_readonly("duplicates", &NodeStats::duplicates)
      .def_readonly("resent", &NodeStats::resent)
      .def_readonly("reconnects", &NodeStats::reconnects)
      .def_readonly("unacked", &NodeStats::unacked)
      .def_readonly("evicted", &NodeStats::evicted)
      .def_readonly("too_large", &NodeStats::too_large)
      .def_readonly("peers", &NodeStats::peers)
      .def_readonly("ring_sent", &NodeStats::ring_sent)
      .def_readonly("ring_received", &NodeStats::ring_received)
      .def_readonly("rings_out", &NodeStats::rings_out)
      .def_readonly("rings_in", &NodeStats::rings_in)
      .def_readonly("relayed", &NodeStats::relayed)
      .def_readonly("order_held", &NodeStats::order_held)
      .def_readonly("order_late", &NodeStats::order_late)
      .def_readonly("order_dropped", &NodeStats::order_dropped)
      .def_readonly("deferred", &NodeStats::deferred)
      .def_readonly("lane_sent", &NodeStats::lane_sent)
      .def_readonly("lane_received", &NodeStats::lane_received)
      .def_readonly("lanes_out", &NodeStats::lanes_out)
      .def_readonly("lanes_in", &NodeStats::lanes_in)
      .def_readonly("lane_breaks", &NodeStats::lane_breaks);

  py::class_<Node, std::shared_ptr<Node>>(m, "Node")
      .def(py::init([](std::string role, std::string bind, std::string cookie, std::string key_file, std::string adv) {
             auto node = std::make_shared<Node>(role, bind, cookie, key_file, adv);
             // The data plane's owner side, and its RDMA NIC: the device the ibverbs probe finds
             // working, if any.
             DataNode::attach(*node).set_rdma_nic_source(&open_ibverbs_nic);
             return node;
           }),
           py::arg("role"), py::arg("bind_addr"), py::arg("accept_cookie"), py::arg("key_file") = "",
           py::arg("advertise") = "")
      .def("listen_tcp", &Node::listen_tcp, py::arg("bind_addr"), py::arg("key_file"), py::arg("advertise") = "",
           "A second address on TCP (CURVE with the key file); returns it.")
      .def_property_readonly("tcp_addr", &Node::tcp_addr)
      .def("retarget", &Node::retarget, py::arg("call"), py::arg("index"), py::arg("addr"))
      .def("start", &Node::start)
      .def("stop", &Node::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("id", &Node::id)
      .def_property_readonly("addr", &Node::addr)
      .def_property_readonly("incarnation", &Node::incarnation)
      .def_property_readonly("running", &Node::running)
      .def_property_readonly("max_message_bytes", &Node::max_message_bytes)
      .def("set_peer_cookie", &Node::set_peer_cookie)
      .def("set_default_cookie", &Node::set_default_cookie)
      .def("add_accepted_cookie", &Node::add_accepted_cookie)
      .def("expect_listening", &Node::expect_listening, py::arg("addr"),
           "The node at addr listens already (a host agent): failing to connect to it is a refusal at once.")
      .def("refuse_calls_from",
           [](Node& n, const std::string& addr, const py::object& err) { n.refuse_calls_from(addr, from_py(err)); })
      .def("send", [](Node& n, const std::string& addr, int kind, const py::object& body, const py::object& frames,
                      const std::string& actor, const std::string& method, uint64_t corr, int64_t index,
                      const py::object& ctx, bool ok) {
        Header h = make_header(kind, body, actor, method, corr, index, ctx);
        h.ok = ok;
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        n.send(addr, std::move(h), std::move(fr));
      }, py::arg("addr"), py::arg("kind"), py::arg("body") = py::none(), py::arg("frames") = py::none(),
         py::arg("actor") = "", py::arg("method") = "", py::arg("corr") = 0, py::arg("index") = -1,
         py::arg("ctx") = py::none(), py::arg("ok") = false)
      .def("call", [](Node& n, const std::vector<std::pair<std::string, std::string>>& targets, int kind,
                      const std::string& method, const py::object& body, const py::object& frames, bool expect_reply,
                      const py::object& ctx) {
        Header h = make_header(kind, body, "", method, 0, -1, ctx);
        std::vector<Target> ts;
        ts.reserve(targets.size());
        for (auto& t : targets) ts.push_back({t.first, t.second});
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        return n.call(ts, std::move(h), std::move(fr), expect_reply);
      }, py::arg("targets"), py::arg("kind"), py::arg("method"), py::arg("body") = py::none(),
         py::arg("frames") = py::none(), py::arg("expect_reply") = true, py::arg("ctx") = py::none())
      .def("reply", [](Node& n, PyMessage& msg, bool ok, const py::object& body, const py::object& frames) {
        json b = from_py(body);
        auto fr = to_frames(frames);
        py::gil_scoped_release release;
        n.reply(msg.m, ok, std::move(b), std::move(fr));
      }, py::arg("msg"), py::arg("ok"), py::arg("body") = py::none(), py::arg("frames") = py::none())
      .def_property("cast_fanout", &Node::cast_fanout, &Node::set_cast_fanout,
                    "Calls to more targets on other hosts than this go through a cast tree (0 or 1: never); "
                    "XMESH_CAST_FANOUT at start.")
      .def_property("cast_local", &Node::cast_local, &Node::set_cast_local,
                    "Whether this host's procs go through cast trees too (XMESH_CAST_TREE=all at start).")
      .def("expect", &Node::expect, py::call_guard<py::gil_scoped_release>())
      .def("open_port", &Node::open_port, py::arg("once") = false)
      .def("forget_call", &Node::forget_call)
      .def_property_readonly("control", [](Node& n) { return &n.control(); }, py::return_value_policy::reference_internal)
      .def_property_readonly("logs", [](Node& n) { return &n.logs(); }, py::return_value_policy::reference_internal)
      .def_property_readonly("actor_events", [](Node& n) { return &n.actor_events(); },
                             py::return_value_policy::reference_internal)
      .def("actor_inbox", &Node::actor_inbox)
      .def("remove_actor", &Node::remove_actor)
      .def("mark_dead", [](Node& n, const std::string& addr, const py::object& err) { n.mark_dead(addr, from_py(err)); })
      .def("dead_reason", [](Node& n, const std::string& addr) -> py::object {
        json e;
        if (!n.is_dead(addr, &e)) return py::none();
        return to_py(e);
      })
      .def("revive", &Node::revive)
      .def("add_supervision_subscriber", &Node::add_supervision_subscriber)
      .def("remove_supervision_subscriber", &Node::remove_supervision_subscriber)
      .def("watch_host", &Node::watch_host, py::arg("hostd_addr"), py::arg("pid") = 0, py::arg("host") = "")
      .def(
          "host_state",
          [](const Node& n, const std::string& addr) -> py::object {
            auto st = n.host_state(addr);
            if (!st) return py::none();
            py::dict d;
            d["alive"] = st->alive;
            d["answering"] = st->answering;
            d["stopped"] = st->stopped;
            d["silent_ms"] = st->silent_ms;
            return d;
          },
          py::arg("hostd_addr"))
      .def("unwatch_host", &Node::unwatch_host)
      .def("add_dependent", &Node::add_dependent)
      .def("lose_host", &Node::lose_host)
      .def("stats", &Node::stats)
      .def("lend_buffer", [](Node& n, uintptr_t addr, uint64_t size, bool writable, bool device) {
        return DataNode::of(n).buffers().lend(reinterpret_cast<void*>(addr), size, writable, device ? cuda_or_throw() : nullptr);
      }, py::arg("addr"), py::arg("size"), py::arg("writable"), py::arg("device") = false,
         "Lends memory as an RDMA buffer (device: the CUDA driver's memory, staged per lease): its id.")
      .def("drop_buffer", [](Node& n, uint64_t id) { return DataNode::of(n).buffers().drop(id); },
           "Lends it no more: the leases still holding it (-1: not lent).")
      .def("buffer_held", [](Node& n, uint64_t id) { return DataNode::of(n).buffers().holds(id); },
           "Whether a buffer is lent, or dropped with a lease still holding it.")
      .def("link_report", &Node::link_report, py::arg("addr"),
           "What became of this node's link to addr, in words (for a peer that does not answer).");
}

// The data plane (runtime/data/data_plane.hpp, buffer_registry.hpp): the memory a process lends, and
// the transfers it makes.
void bind_data_plane(py::module_& m) {
  m.def("buffer_info", [](const py::object& o, bool writable) {
    Py_buffer v;
    if (PyObject_GetBuffer(o.ptr(), &v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      PyErr_Clear();
      if (writable && PyObject_GetBuffer(o.ptr(), &v, PyBUF_C_CONTIGUOUS) == 0) {
        PyBuffer_Release(&v);
        throw py::value_error("the memory is read-only (a destination must be writable)");
      }
      throw py::value_error("the memory is not C-contiguous (copy it into a contiguous buffer first)");
    }
    auto out = py::make_tuple(reinterpret_cast<uintptr_t>(v.buf), static_cast<uint64_t>(v.len), bool(v.readonly));
    PyBuffer_Release(&v);
    return out;
  }, py::arg("obj"), py::arg("writable") = false,
     "(address, bytes, read-only) of a C-contiguous buffer-protocol object; ValueError naming why not.");
  m.def("probe_ibverbs", [] {
    const auto& p = probe_ibverbs();
    py::dict d;
    d["usable"] = p.usable;
    d["device"] = p.device;
    d["listed"] = p.listed;
    d["why"] = p.why;
    return d;
  }, "Whether RDMA through libibverbs carries a loopback transfer here (runtime/data/ibverbs_probe.hpp).");
  m.def("host_key", &host_key, "Which machine and process namespace this is (same key: copies by pid).");

  py::class_<DataPlane::Stats>(m, "DataPlaneStats")
      .def_readonly("ops", &DataPlane::Stats::ops)
      .def_readonly("bytes", &DataPlane::Stats::bytes)
      .def_readonly("same_host", &DataPlane::Stats::same_host)
      .def_readonly("streamed", &DataPlane::Stats::streamed)
      .def_readonly("in_messages", &DataPlane::Stats::in_messages)
      .def_readonly("rdma", &DataPlane::Stats::rdma)
      .def_readonly("failed", &DataPlane::Stats::failed)
      .def_readonly("late_leases", &DataPlane::Stats::late_leases);
  m.def("check_device_memory", [](uintptr_t addr, uint64_t size) {
    auto driver = cuda_or_throw();
    if (!driver->holds(reinterpret_cast<const void*>(addr), size))
      throw py::value_error("it is not " + std::to_string(size) + " bytes of device memory known to " + driver->name());
  }, py::arg("addr"), py::arg("size"),
     "Raises (RuntimeError: no CUDA driver, saying why; ValueError: not its memory) unless [addr, addr + size) is "
     "device memory of the CUDA driver (runtime/data/device_memory.hpp).");
  using Op = std::tuple<std::string, uint64_t, uint64_t, uint64_t, uintptr_t, bool, bool>;
  py::class_<DataPlane, std::shared_ptr<DataPlane>>(m, "DataPlane")
      .def(py::init([](const std::shared_ptr<Node>& node, size_t threads) {
             return std::make_shared<DataPlane>(*node, threads);
           }),
           py::arg("node"), py::arg("threads") = 0, py::keep_alive<1, 2>())
      .def("submit", [](DataPlane& d, const std::vector<Op>& ops, const py::object& timeout_s, const py::object& keep) {
        std::vector<DataOp> todo;
        for (auto& [owner, buffer, offset, size, local, write, device] : ops)
          todo.push_back({owner, buffer, offset, size, reinterpret_cast<char*>(local), write,
                          device ? cuda_or_throw() : nullptr});
        // Seconds (None: no limit); past what an int of milliseconds holds (24 days) is no limit.
        const double ms = timeout_s.is_none() ? -1 : timeout_s.cast<double>() * 1000;
        const int timeout_ms = ms < 0 || ms > 2147483647.0 ? -1 : static_cast<int>(ms);
        PyObject* held = keep.ptr();
        Py_INCREF(held);
        auto let_go = [held] {
          std::lock_guard<std::mutex> g(g_release_mu);
          g_release_objects.push_back(held);
        };
        try {
          py::gil_scoped_release release;
          return d.submit(std::move(todo), timeout_ms, let_go);
        } catch (...) {
          Py_DECREF(held);
          throw;
        }
      }, py::arg("ops"), py::arg("timeout"), py::arg("keepalive"),
         "ops: [(owner address, buffer id, offset, size, local address, write, local on the CUDA device)]; keepalive stays referenced "
         "until no data thread uses the local memory. Returns the Call the transfer answers.")
      .def("stats", &DataPlane::stats);
}

// Shapes and slices (runtime/base/shape.hpp).
void bind_shape(py::module_& m) {
  py::class_<Shape>(m, "Shape")
      .def(py::init([](std::vector<std::string> labels, int64_t offset, std::vector<int64_t> sizes,
                       std::vector<int64_t> strides) {
             Slice s;
             s.offset = offset;
             s.sizes = std::move(sizes);
             s.strides = std::move(strides);
             return Shape(std::move(labels), std::move(s));
           }),
           py::arg("labels"), py::arg("offset"), py::arg("sizes"), py::arg("strides"))
      .def_static("dense", &Shape::dense)
      .def_property_readonly("labels", &Shape::labels)
      .def_property_readonly("offset", [](const Shape& s) { return s.slice().offset; })
      .def_property_readonly("sizes", [](const Shape& s) { return s.slice().sizes; })
      .def_property_readonly("strides", [](const Shape& s) { return s.slice().strides; })
      .def_property_readonly("size", &Shape::size)
      .def_property_readonly("ndim", &Shape::ndim)
      .def("sizes_dict", &Shape::sizes)
      .def("dim_size", &Shape::dim_size)
      .def("select", &Shape::select)
      .def("at", &Shape::at)
      .def("flatten", &Shape::flatten)
      .def("split", &Shape::split)
      .def("rename", &Shape::rename)
      .def("ranks", &Shape::ranks)
      .def("coords_of", &Shape::coords_of)
      .def("local_index_of", &Shape::local_index_of)
      .def("to_json", [](const Shape& s) { return s.to_json().dump(); })
      .def_static("from_json", [](const std::string& text) {
        json j = json::parse(text, nullptr, false);
        if (j.is_discarded()) throw py::value_error("malformed shape json");
        return Shape::from_json(j);
      })
      .def("__eq__", [](const Shape& a, const Shape& b) { return a == b; })
      .def("__repr__", &Shape::to_string)
      .def(py::pickle([](const Shape& s) { return s.to_json().dump(); },
                      [](const std::string& text) { return Shape::from_json(json::parse(text)); }));
}

// Output attribution and routing: the proc's tracker, main-thread calls, the LogRouter.
void bind_output(py::module_& m) {
  // The proc's output tracker (runtime/output/output_marker.hpp), see _proc_output.py.
  m.def("output_tracking_enable", []() { output_tracker().enable(); });
  m.def("output_begin", [](const std::string& cell, const std::string& actor) {
    return output_tracker().begin({cell, actor});
  });
  m.def("output_end", [](uint64_t token, bool python_wrote) { return output_tracker().end(token, python_wrote); });
  m.def("output_mark_now", []() { return output_tracker().mark_now(); });
  m.def("set_main_thread_call", [](py::object fn) {
    std::lock_guard<std::mutex> g(g_main_call_mu);
    if (!g_main_call) g_main_call = new py::object();  // never freed: pending calls may still run
    *g_main_call = std::move(fn);
  }, "Sets the function call_on_main_thread() schedules.");
  m.def("call_on_main_thread", []() {
    main_waker().notify();  // a main thread waiting on a call (without the GIL) runs it now
    {
      std::lock_guard<std::mutex> g(g_main_call_mu);
      if (g_main_call_scheduled || !g_main_call) return;
      g_main_call_scheduled = true;
    }
    if (Py_AddPendingCall(&run_main_call, nullptr) != 0) {
      std::lock_guard<std::mutex> g(g_main_call_mu);
      g_main_call_scheduled = false;
    }
  }, "Runs the function given to set_main_thread_call() on the main thread between two bytecodes.");

  py::class_<LogRouter, std::shared_ptr<LogRouter>>(m, "LogRouter")
      .def(py::init([](Node& node) { return std::make_shared<LogRouter>(node.logs()); }), py::keep_alive<1, 2>())
      .def("start", &LogRouter::start)
      .def("stop", &LogRouter::stop, py::call_guard<py::gil_scoped_release>())
      .def("add_alloc", &LogRouter::add_alloc)
      .def("add_proc", &LogRouter::add_proc, py::arg("alloc"), py::arg("rank"), py::arg("addr"), py::arg("host") = "")
      .def("set_options", &LogRouter::set_options)
      .def("set_default_window", &LogRouter::set_default_window)
      .def("set_display_rate", &LogRouter::set_display_rate)
      .def("held_back", &LogRouter::held_back, "{rank: lines held back from the display} of an allocation, ever")
      .def("wait_marks", [](LogRouter& r, const std::vector<std::pair<std::string, uint64_t>>& marks, double timeout) {
        return wait_sliced([&](int ms) { return r.wait_marks(marks, ms); }, timeout);
      })
      .def("sync", [](LogRouter& r, double timeout) {
        return wait_sliced([&](int ms) { return r.sync(ms); }, timeout);
      })
      .def("flush_windows", &LogRouter::flush_windows, py::call_guard<py::gil_scoped_release>())
      .def("wait_output", [](LogRouter& r, double timeout) {
        return wait_sliced([&](int ms) { return r.wait_output(ms); }, timeout);
      })
      // (cell, stream, text, None) for text; (cell, stream, "", (board id, label, [(rank, text,
      // done)])) for a board of progress bars (runtime/output/progress_boards.hpp).
      .def("take_output", [](LogRouter& r) {
        std::vector<LogChunk> chunks;
        {
          py::gil_scoped_release release;
          chunks = r.take_output();
        }
        py::list out;
        for (auto& c : chunks) {
          if (c.board.empty()) {
            out.append(py::make_tuple(c.cell, c.stream, decode_text(c.text), py::none()));
            continue;
          }
          py::list rows;
          for (auto& r : c.rows) rows.append(py::make_tuple(r.rank, decode_text(r.text), r.done));
          out.append(py::make_tuple(c.cell, c.stream, py::str(""), py::make_tuple(c.board, c.label, rows)));
        }
        return out;
      })
      .def("stats", [](LogRouter& r) {
        auto s = r.stats();
        py::dict d;
        d["messages"] = s.messages;
        d["lines"] = s.lines;
        d["bytes"] = s.bytes;
        d["shown"] = s.shown;
        d["held"] = s.held;
        d["hidden"] = s.hidden;
        d["malformed"] = s.malformed;
        return d;
      });
}

PYBIND11_MODULE(_core, m) {
  m.doc() = "xmesh runtime core (libxmesh)";
  py::register_exception<SendError>(m, "SendError", PyExc_RuntimeError);
  py::register_exception<KeyFileError>(m, "KeyFileError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      translate_shape_error(e);
    }
  });

  bind_process(m);
  bind_protocol(m);
  bind_bodies(m);
  bind_messages(m);
  bind_layout(m);
  bind_calls(m);
  bind_node(m);
  bind_data_plane(m);
  bind_shape(m);
  bind_output(m);
  bind_debugger(m);
  bind_workspace(m);
}
