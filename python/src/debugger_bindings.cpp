// The debugger's pieces in xmesh._core: the proc's GIL-free stack dump (answered by the node's
// I/O thread, so a rank stuck in a C call or a deadlock still shows where it is), thread
// labels for it, rank selectors and stack grouping (debugger/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

#include "bodies.hpp"
#include "log_aggregator.hpp"
#include "node.hpp"
#include "rank_selector.hpp"
#include "stack_groups.hpp"

namespace py = pybind11;
using namespace xmesh;

// CPython's own dumper, the one faulthandler's watchdog thread calls without the GIL
// (exported by libpython; declared only in its internal headers).
extern "C" const char* _Py_DumpTracebackThreads(int fd, PyInterpreterState* interp, PyThreadState* current_tstate);

namespace {

std::mutex g_labels_mu;
std::map<uint64_t, std::string> g_labels;  // thread ident -> what runs there ("actor trainer")

json dump_python_stacks() {
  std::string text;
  int fd = memfd_create("xmesh-stacks", MFD_CLOEXEC);
  DumpStacksReply reply;
  reply.pid = getpid();
  if (fd < 0) {
    reply.error = "memfd_create failed";
    return reply;
  }
  const char* err = _Py_DumpTracebackThreads(fd, nullptr, nullptr);
  if (lseek(fd, 0, SEEK_SET) == 0) {
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  reply.stacks = std::move(text);
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

}  // namespace

void bind_debugger(py::module_& m) {
  m.def("enable_stack_dumps", [](Node& n) { n.set_stack_dumper(dump_python_stacks); },
        "Lets this process answer DumpStacks from its node's I/O thread, without the GIL.");
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
  m.def("rank_prefix", &rank_prefix, "The prefix of a line of output: \"[3] \", \"[trainers ranks 0-3] \".");
  m.def("rank_selector_end", &rank_selector_end);
  m.def("select_ranks", &select_ranks);
  py::register_exception<RankSelectorError>(m, "RankSelectorError", PyExc_ValueError);
}
