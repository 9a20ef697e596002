// What the binding files of xmesh._core share: payload frames to and from Python without
// copies (large buffers lent to ZeroMQ, released on the next call that holds the GIL), received
// messages, the one sliced wait that releases the GIL and checks signals, headers made from
// Python's arguments.
#pragma once
#include <Python.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "inbox.hpp"

// Set by the atexit handler _core registers when it loads (so it runs after every later one):
// from then on the interpreter may begin to finalize at any moment. CPython ends a daemon thread
// that takes the GIL back once the *interpreter* finalizes, before Py_IsFinalizing (the
// runtime's flag) says so, by pthread_exit, whose forced unwind would run the C++ destructors of
// the binding's frames (py::object decrefs) without the GIL.
inline std::atomic<bool>& python_exiting() {
  static std::atomic<bool> exiting{false};
  return exiting;
}

// Threads between deciding to take the GIL back in wait_sliced and having it: the atexit handler
// waits (without the GIL) until there are none, so none is taking it when finalization begins.
inline std::atomic<int>& python_restoring() {
  static std::atomic<int> restoring{0};
  return restoring;
}

// The main thread's ident (set when _core loads): the one thread CPython never ends at exit.
inline std::atomic<unsigned long>& python_main_thread() {
  static std::atomic<unsigned long> ident{0};
  return ident;
}

// Whether the interpreter is exiting or finalizing (Py_IsFinalizing: public from CPython 3.13).
inline bool python_finalizing() {
  if (python_exiting().load()) return true;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}
#include "wire.hpp"

namespace py = pybind11;
using namespace xmesh;

constexpr size_t kZeroCopyMin = 64 * 1024;  // smaller frames are copied (cheaper than lending)

// Python frames (bytes-like objects) to payload frames: large ones lent, not copied.
std::vector<zmq::message_t> to_frames(const py::handle& frames);
// Lets go, with the GIL, of what ZeroMQ and the data threads are done with.
void drain_releases();
// A reference a thread without the GIL is done with: dropped by the next drain_releases().
void release_later(PyObject* object);

// A received payload frame, exposed to Python through the buffer protocol (writable, so
// numpy arrays rebuilt on top of it without a copy are ordinary writable arrays).
struct Frame {
  zmq::message_t msg;
};

py::list frames_to_py(std::vector<zmq::message_t>& frames);

// A message handed to Python; payload frames move out on first access.
struct PyMessage {
  Message m;
  py::object frames_cache;
};

// Waits in slices, releasing the GIL, checking signals between slices. Only the main thread
// runs Python's signal handlers, so only its slices are short (Ctrl-C within 0.1 s); another
// thread's are a second long (what threads release without the GIL is let go between slices):
// an idle proc's waiting threads wake once a second, not ten times.
template <class F>
bool wait_sliced(F ready_within_ms, double timeout_s) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                                     timeout_s < 0 ? 0.0 : timeout_s));
  const bool main_thread = PyThread_get_thread_ident() == python_main_thread().load();
  const int64_t slice_ms = main_thread ? 100 : 1000;
  while (true) {
    int slice = static_cast<int>(slice_ms);
    if (timeout_s >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      slice = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(slice_ms, left)));
    }
    // Not py::gil_scoped_release: its destructor is noexcept, and a daemon thread that takes the
    // GIL back while the interpreter finalizes is ended with a forced unwind (std::terminate
    // through a noexcept frame). Such a thread parks instead; the process is exiting.
    PyThreadState* ts = PyEval_SaveThread();
    bool ok = ready_within_ms(slice);
    const bool daemon = !main_thread;
    python_restoring()++;  // before the check: the exit handler sees this thread or it sees the flag
    if (daemon && python_finalizing()) {
      python_restoring()--;
      for (;;) pause();
    }
    PyEval_RestoreThread(ts);
    python_restoring()--;
    if (ok) return true;
    drain_releases();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout_s >= 0 && clock::now() >= deadline) return false;
  }
}

inline double opt_timeout(const py::object& t) { return t.is_none() ? -1.0 : t.cast<double>(); }

// The next message of an inbox (None: timed out, or closed), waiting as wait_sliced does.
py::object pop_inbox(Inbox& box, const py::object& timeout);
Header make_header(int kind, const py::object& body, const std::string& actor, const std::string& method,
                   uint64_t corr, int64_t index, const py::object& ctx);
// UTF-8 text to str, bad bytes replaced (never an exception for a proc's odd output).
py::object decode_text(const std::string& s);
