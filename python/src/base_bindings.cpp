// xmesh._core: the base layer's face (runtime/base): versions, sizes, processes, the runtime
// directory's layout, shapes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include "bindings.hpp"
#include "json_py.hpp"
#include "layout.hpp"
#include "process.hpp"
#include "py_common.hpp"
#include "shape.hpp"
#include "util.hpp"

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
