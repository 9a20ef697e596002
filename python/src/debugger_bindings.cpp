// The debugger's pieces in xmesh._core: the proc's stack dump (answered by the node's I/O thread,
// with the GIL when it can be had, so a rank stuck in a C call or a deadlock still shows where it
// is), the attach trace, thread
// labels for it, rank selectors and stack grouping (debugger/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <dirent.h>
#include <dlfcn.h>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "debug_bodies.hpp"
#include "body_bindings.hpp"
#include "bodies.hpp"
#include "node_bodies.hpp"
#include "log_aggregator.hpp"
#include "node.hpp"
#include "process.hpp"
#include "py_common.hpp"
#include "rank_selector.hpp"
#include "stack_groups.hpp"
#include "util.hpp"

namespace py = pybind11;
using namespace xmesh;

// CPython's own dumper, the one faulthandler's watchdog thread calls without the GIL, and the
// setter behind sys.settrace for any thread state: internal functions, looked up at run time
// (dlsym), since not every version exports them (3.10 lacks the dumper, 3.13 the setter), and
// a module that names a missing symbol would not even load.
using DumpTracebackThreads = const char* (*)(int fd, PyInterpreterState* interp, PyThreadState* current_tstate);
using SetTraceOf = int (*)(PyThreadState* tstate, Py_tracefunc func, PyObject* arg);

template <typename F>
F cpython_internal(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

namespace {

std::mutex g_labels_mu;
std::map<uint64_t, std::string> g_labels;  // thread ident -> what runs there ("actor trainer")

// What _Py_DumpTracebackThreads writes: every thread's frames, as faulthandler prints them.
// Where this Python does not export it, faulthandler's own dump_traceback writes the same, with
// the GIL held (current given); without the GIL there is then no dump.
std::string dump_to_text(PyThreadState* current, const char** err) {
  static const auto dumper = cpython_internal<DumpTracebackThreads>("_Py_DumpTracebackThreads");
  std::string text;
  if (!dumper && !current) {
    *err = "this Python (" PY_VERSION ") has no dumper of stacks that works without the GIL: no stack was read";
    return text;
  }
  int fd = memfd_create("xmesh-stacks", MFD_CLOEXEC);
  if (fd < 0) {
    *err = "memfd_create failed";
    return text;
  }
  if (dumper) {
    *err = dumper(fd, nullptr, current);
  } else {
    PyObject* faulthandler = PyImport_ImportModule("faulthandler");
    PyObject* done = faulthandler ? PyObject_CallMethod(faulthandler, "dump_traceback", "iO", fd, Py_True) : nullptr;
    Py_XDECREF(faulthandler);
    if (done) {
      Py_DECREF(done);
    } else {
      PyErr_Clear();
      *err = "faulthandler.dump_traceback failed";
    }
  }
  if (lseek(fd, 0, SEEK_SET) == 0) {
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// The dump reads other threads' frames. With the GIL held that is safe: every other thread is
// parked at a safe point or inside C, its frames still. Without it, a thread running Python
// pushes and pops frames under the reader (a proc crashed so, `where` polled while async
// endpoints churned). So a helper thread takes the GIL and dumps; the I/O thread waits for it
// kGilWaitMs and only when the GIL stays taken that long and no other thread is runnable (the
// holder asleep inside C, or a deadlock: frames that do not move) dumps without it, as
// faulthandler's watchdog does; a thread still running Python on a loaded machine (a proc
// crashed so under a full test run) gets no dump instead, and says so.
class GilDumper {
 public:
  static constexpr int kGilWaitMs = 250;

  // The text of a dump taken with the GIL, or nothing if it could not be had in time.
  std::optional<std::string> dump(const char** err) {
    std::unique_lock<std::mutex> lk(mu_);
    if (busy_) return std::nullopt;  // still waiting for the GIL since an earlier request
    if (!started_) {
      started_ = true;
      runtime_thread([this] { serve(); }).detach();
    }
    busy_ = true;
    uint64_t ticket = ++wanted_;
    cv_.notify_all();
    if (!cv_.wait_for(lk, std::chrono::milliseconds(kGilWaitMs), [&] { return done_ >= ticket; }))
      return std::nullopt;
    *err = err_;
    return std::move(text_);
  }

 private:
  void serve() {
    for (;;) {
      uint64_t ticket;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return wanted_ > done_; });
        ticket = wanted_;
      }
      if (python_finalizing()) return;  // no GIL to take any more (busy_ stays: dumps go without)
      PyGILState_STATE gil = PyGILState_Ensure();
      const char* err = nullptr;
      std::string text = dump_to_text(PyThreadState_Get(), &err);
      PyGILState_Release(gil);
      std::lock_guard<std::mutex> g(mu_);
      text_ = std::move(text);  // (a request that stopped waiting leaves it for nobody)
      err_ = err;
      done_ = ticket;
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, busy_ = false;
  uint64_t wanted_ = 0, done_ = 0;
  std::string text_;
  const char* err_ = nullptr;
};

GilDumper g_gil_dumper;

const char* const kBusyDump =
    "its Python threads kept the GIL past the wait for it and are running: no stack was read "
    "(frames that move cannot be read safely); ask again";

// The CPU time the other threads of this process used so far, in ns (schedstat; clock ticks
// from its stat, process_status, where the kernel has no schedstat).
uint64_t other_threads_cpu_ns(pid_t self) {
  uint64_t total = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return 0;
  static const long kTickNs = 1000000000L / sysconf(_SC_CLK_TCK);
  while (dirent* e = readdir(tasks)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == self) continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream sched(dir + "/schedstat");
    uint64_t on_cpu = 0;
    if (sched >> on_cpu) {
      total += on_cpu;
      continue;
    }
    if (auto st = process_status(std::atoi(e->d_name))) total += st->cpu_ticks * static_cast<uint64_t>(kTickNs);
  }
  closedir(tasks);
  return total;
}

// Whether the other threads are still: over 50 ms they used under a tenth of it on the CPU.
// A GIL held past the helper's wait is then held by a thread asleep in C (the threads waiting
// for it wake only for moments), and frames read without the GIL stay where they are. Threads
// running Python that the helper did not get past in time (a loaded machine) use the CPU, and
// their frames move under a reader: no dump then.
bool other_threads_still() {
  const auto self = static_cast<pid_t>(syscall(SYS_gettid));
  constexpr int kWindowMs = 50;
  const uint64_t before = other_threads_cpu_ns(self);
  std::this_thread::sleep_for(std::chrono::milliseconds(kWindowMs));
  const uint64_t used = other_threads_cpu_ns(self) - before;
  return used < static_cast<uint64_t>(kWindowMs) * 1000000 / 10;
}

json dump_python_stacks() {
  DumpStacksReply reply;
  reply.pid = getpid();
  const char* err = nullptr;
  if (auto with_gil = g_gil_dumper.dump(&err))
    reply.stacks = std::move(*with_gil);
  else if (other_threads_still())
    reply.stacks = dump_to_text(nullptr, &err);
  else
    err = kBusyDump;
  {
    std::lock_guard<std::mutex> g(g_labels_mu);
    for (auto& [ident, label] : g_labels) reply.labels[std::to_string(ident)] = label;
  }
  if (err) reply.error = err;
  return reply;
}

py::tuple frame_tuple(const StackFrame& f) { return py::make_tuple(f.file, f.line, f.function); }

std::vector<StackFrame> frames_from(const py::iterable& frames) {
  std::vector<StackFrame> out;
  for (auto item : frames) {
    auto t = item.cast<py::tuple>();
    out.push_back({t[0].cast<std::string>(), t[1].cast<int64_t>(), t[2].cast<std::string>()});
  }
  return out;
}

// Attaching to a running thread (issue 18): a C trace function on that thread alone, set only
// while an attach waits (no cost otherwise). At the thread's next call or line event it hands
// the frame to the callback, which either lets it pass (xmesh's own frames) or takes the stop:
// it removes this trace and starts pdb in the frame.
int attach_trace(PyObject* callback, PyFrameObject* frame, int what, PyObject*) {
  if (what != PyTrace_CALL && what != PyTrace_LINE) return 0;
  PyObject* r = PyObject_CallOneArg(callback, reinterpret_cast<PyObject*>(frame));
  if (r == nullptr) {  // a broken callback must not break the thread: stop watching
    PyErr_WriteUnraisable(callback);
    PyEval_SetTrace(nullptr, nullptr);
    return 0;
  }
  Py_DECREF(r);
  return 0;
}

PyThreadState* thread_state_of(unsigned long ident) {
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != nullptr;
       t = PyThreadState_Next(t))
    if (t->thread_id == ident) return t;
  return nullptr;
}

#if PY_VERSION_HEX >= 0x030C0000
// Where CPython does not export its per-thread setter (3.13), the trace goes on every thread
// (PyEval_SetTraceAllThreads) and each thread that is not armed puts back, at its next event,
// the trace it had (a pdb's, in a thread stopped in the debugger) after passing that event on.
// All of it runs with the GIL held.
struct PreviousTrace {
  Py_tracefunc func = nullptr;
  PyObject* arg = nullptr;  // a strong reference
};
std::map<unsigned long, PyObject*> g_armed;            // thread ident -> its attach callback (strong)
std::map<unsigned long, PreviousTrace> g_previous;      // thread ident -> its trace before the arming

int attach_trace_any_thread(PyObject*, PyFrameObject* frame, int what, PyObject* arg) {
  const unsigned long me = PyThread_get_thread_ident();
  if (auto armed = g_armed.find(me); armed != g_armed.end()) {
    PyObject* callback = armed->second;
    Py_INCREF(callback);  // the callback may disarm this thread (and drop the map's reference)
    int r = attach_trace(callback, frame, what, arg);
    Py_DECREF(callback);
    return r;
  }
  PreviousTrace prev;
  if (auto found = g_previous.find(me); found != g_previous.end()) {
    prev = found->second;
    g_previous.erase(found);
  }
  PyEval_SetTrace(prev.func, prev.arg);  // back to what this thread had (nothing, or a pdb's)
  int r = prev.func ? prev.func(prev.arg, frame, what, arg) : 0;
  Py_XDECREF(prev.arg);
  return r;
}

bool arm_thread(unsigned long ident, PyObject* callback) {
  if (callback == nullptr) {  // the thread drops the trace at its next event
    if (auto found = g_armed.find(ident); found != g_armed.end()) {
      Py_DECREF(found->second);
      g_armed.erase(found);
    }
    return true;
  }
  Py_INCREF(callback);
  if (auto found = g_armed.find(ident); found != g_armed.end()) Py_DECREF(found->second);
  g_armed[ident] = callback;
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t != nullptr;
       t = PyThreadState_Next(t)) {
    // The armed thread's own trace is replaced, as the per-thread setter would replace it.
    if (t->thread_id == ident || t->c_tracefunc == attach_trace_any_thread || t->c_tracefunc == nullptr ||
        g_previous.count(t->thread_id))
      continue;
    Py_XINCREF(t->c_traceobj);
    g_previous[t->thread_id] = {t->c_tracefunc, t->c_traceobj};
  }
  PyEval_SetTraceAllThreads(attach_trace_any_thread, nullptr);
  return !PyErr_Occurred();
}
#endif

// Sets (callback) or removes (nullptr) the attach trace of one thread; false with a Python
// error set when this Python offers no way to.
bool trace_one_thread(PyThreadState* t, PyObject* callback) {
  static const auto set_trace_of = cpython_internal<SetTraceOf>("_PyEval_SetTrace");
  if (set_trace_of) return set_trace_of(t, callback ? attach_trace : nullptr, callback) == 0;
#if PY_VERSION_HEX >= 0x030C0000
  return arm_thread(t->thread_id, callback);
#else
  PyErr_SetString(PyExc_RuntimeError, "this Python exports no way to trace another thread (_PyEval_SetTrace)");
  return false;
#endif
}

}  // namespace

// The debugger's message bodies, bound before the messages that return them (bindings.hpp).
void bind_debug_bodies(py::module_& m) {
  bind_body<DebugEventBody>(m, "DebugEventBody", "DebugEvent: a pdb session stopped, runs, ended or asks for sources.");
  bind_body<DebugCommandBody>(m, "DebugCommandBody", "DebugCommand: a pdb command for one session.");
}

void bind_debugger(py::module_& m) {
  m.def("trace_thread", [](unsigned long ident, const py::object& callback) {
    PyThreadState* t = thread_state_of(ident);
    if (t == nullptr) return false;
    if (!trace_one_thread(t, callback.is_none() ? nullptr : callback.ptr())) throw py::error_already_set();
    return true;
  }, "Sets (None: removes) the attach trace of the thread `ident`: callback(frame) at its next call or "
     "line event, until removed. False if no such thread.");
  m.def("enable_stack_dumps", [](Node& n) { n.set_stack_dumper(dump_python_stacks); },
        "Lets this process answer DumpStacks from its node's I/O thread (with the GIL if it can be had in time).");
  m.def("label_thread", [](uint64_t ident, const std::string& label) {
    std::lock_guard<std::mutex> g(g_labels_mu);
    if (label.empty()) {
      g_labels.erase(ident);
    } else {
      g_labels[ident] = label;
    }
  });
  m.def("parse_thread_dump", [](const std::string& text) {
    py::list out;
    for (auto& t : parse_thread_dump(text)) {
      py::list frames;
      for (auto& f : t.frames) frames.append(frame_tuple(f));
      out.append(py::make_tuple(t.ident, t.current, frames));
    }
    return out;
  }, "[(ident, current, [(file, line, function), ...] outermost first)] from a faulthandler dump.");
  m.def("group_stacks", [](const py::iterable& stacks) {
    std::vector<RankStack> in;
    for (auto item : stacks) {
      auto t = item.cast<py::tuple>();
      in.push_back({t[0].cast<int64_t>(), t[1].cast<std::string>(), frames_from(t[2])});
    }
    py::list out;
    for (auto& g : group_stacks(in)) {
      py::list frames;
      for (auto& f : g.frames) frames.append(frame_tuple(f));
      out.append(py::make_tuple(g.state, frames, g.ranks));
    }
    return out;
  }, "Groups (rank, state, frames) by identical state and frames: [(state, frames, ranks)], largest first.");
  m.def("describe_ranks", &describe_ranks, "\"3\" for one rank, \"ranks 0-6,9\" for several.");
  m.def(
      "rank_prefix",
      [](const std::string& label, const std::vector<int64_t>& ranks) { return rank_prefix(label, ranks); },
      py::arg("label"), py::arg("ranks"), "The prefix of a line of output: \"[3] \", \"[trainers ranks 0-3] \".");
  m.def("rank_selector_end", &rank_selector_end);
  m.def("select_ranks", &select_ranks);
  py::register_exception<RankSelectorError>(m, "RankSelectorError", PyExc_ValueError);
}
