// xmesh._core: the output path's face (runtime/output): the proc's output tracker, running a
// function on the main thread, the controller's LogRouter, log records.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>

#include "output_bodies.hpp"
#include "body_bindings.hpp"
#include "bindings.hpp"
#include "json_py.hpp"
#include "log_record.hpp"
#include "log_router.hpp"
#include "output_marker.hpp"
#include "py_common.hpp"
#include "waker.hpp"

namespace {
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

void bind_output_tracker(py::module_& m) {
  // The log record format (runtime/output/log_record.hpp): (time, stream, partial, actor, text), or None.
  m.def("parse_log_record", [](py::bytes line) -> py::object {
    std::string_view v = line;
    auto r = parse_record(v);
    if (!r) return py::none();
    return py::make_tuple(r->time, r->stream, r->partial, decode_text(r->actor), decode_text(r->text));
  }, py::arg("line"));

  // The proc's output tracker (runtime/output/output_marker.hpp), see _output/capture.py.
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

}

// The controller's router of Log messages (runtime/output/log_router.hpp), see _output/logs.py.
void bind_log_router(py::module_& m) {
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
      // (cell, stream, text, None, None) for text; (cell, stream, "", (board id, label, [(rank,
      // text, done)]), None) for a board of progress bars (runtime/output/progress_boards.hpp);
      // (cell, stream, line, None, ([member lines], how many left out)) for a summary of lines
      // alike (runtime/output/log_aggregator.hpp).
      .def("take_output", [](LogRouter& r) {
        std::vector<LogChunk> chunks;
        {
          py::gil_scoped_release release;
          chunks = r.take_output();
        }
        py::list out;
        for (auto& c : chunks) {
          if (!c.members.empty()) {
            py::list members;
            for (auto& m : c.members) members.append(decode_text(m));
            out.append(py::make_tuple(c.cell, c.stream, decode_text(c.text), py::none(),
                                      py::make_tuple(members, c.members_left_out)));
            continue;
          }
          if (c.board.empty()) {
            out.append(py::make_tuple(c.cell, c.stream, decode_text(c.text), py::none(), py::none()));
            continue;
          }
          py::list rows;
          for (auto& r : c.rows) rows.append(py::make_tuple(r.rank, decode_text(r.text), r.done));
          out.append(py::make_tuple(c.cell, c.stream, py::str(""), py::make_tuple(c.board, c.label, rows), py::none()));
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
}  // namespace

// Output attribution and routing: the proc's tracker, main-thread calls, the LogRouter.
// Output's message bodies, bound before the messages that return them (bindings.hpp).
void bind_output_bodies(py::module_& m) {
  bind_body<LogBody>(m, "LogBody", "Log: complete lines of one proc stream.");
  bind_body<FlushOutputReply>(m, "FlushOutputReply", "The output marker a FlushOutput wrote.");
}

void bind_output(py::module_& m) {
  bind_output_tracker(m);
  bind_log_router(m);
}
