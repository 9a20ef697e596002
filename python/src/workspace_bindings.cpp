// Workspace sync in xmesh._core: the controller's push (scan + the Sync steps with every host,
// run without the GIL, interruptible by Ctrl-C), the local scan and the inotify watcher.
// Options and reports cross as JSON text.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "sync_bodies.hpp"
#include "body_bindings.hpp"
#include "node.hpp"
#include "sender.hpp"
#include "watch.hpp"

namespace py = pybind11;
using json = nlohmann::json;
using namespace xmesh;

namespace {

struct Interrupted {};  // the Python error (KeyboardInterrupt) is set on this thread

ws::PushOptions options_from(const std::string& text) {
  json o = json::parse(text);
  ws::PushOptions p;
  p.dest = o.value("dest", std::string());
  p.scan.excludes = o.value("exclude", std::vector<std::string>());
  p.scan.use_ignore_files = o.value("ignore_files", true);
  p.scan.default_excludes = o.value("default_excludes", true);
  p.scan.max_file_size = o.value("max_file_size", uint64_t(0));
  p.cache_path = o.value("cache_path", std::string());
  p.space_for = o.value("space_for", std::string());
  p.incremental = o.value("incremental", true);
  p.compress = o.value("compress", std::string("auto"));
  p.zstd_level = o.value("zstd_level", 1);
  p.batch_bytes = o.value("batch_bytes", size_t(4u << 20));
  p.window = o.value("window", 4);
  p.step_timeout_ms = o.value("step_timeout_ms", 60000);
  if (p.compress != "auto" && p.compress != "always" && p.compress != "never")
    throw py::value_error("compress must be 'auto', 'always' or 'never', got '" + p.compress + "'");
  if (p.batch_bytes < 4096 || p.window < 1) throw py::value_error("batch_bytes must be >= 4096 and window >= 1");
  return p;
}

std::string push(Node& node, const std::string& root, const std::vector<std::pair<std::string, std::string>>& hosts,
                 const std::string& options) {
  ws::PushOptions opts = options_from(options);
  std::vector<ws::PushHost> targets;
  for (auto& [addr, label] : hosts) targets.push_back({addr, label});
  std::function<void()> check = [] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw Interrupted{};
  };
  json report;
  try {
    py::gil_scoped_release nogil;
    report = ws::push_workspace(node, root, targets, opts, check);
  } catch (const Interrupted&) {
    throw py::error_already_set();
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return report.dump();
}

}  // namespace

// A sync's and a reload's message bodies, bound before the messages that return them (bindings.hpp).
void bind_sync_bodies(py::module_& m) {
  bind_body<ReloadBody>(m, "ReloadBody", "Reload: reload the modules of these synced files.");
  bind_body<ReloadReply>(m, "ReloadReply", "What a Reload did in one process.");
  bind_body<SyncStepBody>(m, "SyncStepBody", "Sync: one step of a workspace sync.");
  bind_body<SyncReply>(m, "SyncReply", "A host's answer to a Sync step.");
}

void bind_workspace(py::module_& m) {
  m.def("workspace_push", &push, py::arg("node"), py::arg("root"), py::arg("hosts"), py::arg("options"),
        "Syncs the local tree `root` to the host agents [(addr, label)]; returns the report as JSON text.");
  py::class_<ws::TreeWatcher>(m, "TreeWatcher")
      .def(py::init<const std::string&>(), py::arg("root"))
      .def(
          "wait",
          [](ws::TreeWatcher& w, int timeout_ms, int quiet_ms) {
            py::gil_scoped_release nogil;
            return w.wait(timeout_ms, quiet_ms);
          },
          py::arg("timeout_ms"), py::arg("quiet_ms") = 100)
      .def_property_readonly("watched_dirs", &ws::TreeWatcher::watched_dirs);
}
