#include "bodies.hpp"

#include <stdexcept>

namespace xmesh {

namespace {
using json = nlohmann::json;

const json& field(const json& j, const char* name, json::value_t type, const char* what) {
  auto it = j.find(name);
  if (it == j.end()) throw std::invalid_argument(std::string(what) + " body without '" + name + "'");
  bool ok = it->type() == type ||
            (type == json::value_t::number_integer && it->type() == json::value_t::number_unsigned);
  if (!ok) throw std::invalid_argument(std::string(what) + " body: '" + name + "' has the wrong type");
  return *it;
}
}  // namespace

void to_json(json& j, const ProcExitedBody& b) {
  j = {{"alloc", b.alloc}, {"rank", b.rank}, {"pid", b.pid},           {"addr", b.addr},
       {"host", b.host},   {"coords", b.coords}, {"stopping", b.stopping}, {"text", b.text}};
  if (b.signal) j["signal"] = *b.signal;
  if (b.exit_code) j["exit_code"] = *b.exit_code;
}

void from_json(const json& j, ProcExitedBody& b) {
  const char* what = "ProcExited";
  if (!j.is_object()) throw std::invalid_argument("ProcExited body is not an object");
  b.alloc = field(j, "alloc", json::value_t::string, what).get<std::string>();
  b.rank = field(j, "rank", json::value_t::number_integer, what).get<int64_t>();
  b.pid = field(j, "pid", json::value_t::number_integer, what).get<int64_t>();
  b.addr = field(j, "addr", json::value_t::string, what).get<std::string>();
  b.host = j.value("host", std::string());
  b.coords = j.contains("coords") && j["coords"].is_object() ? j["coords"] : json::object();
  b.stopping = j.value("stopping", false);
  b.text = field(j, "text", json::value_t::string, what).get<std::string>();
  b.signal.reset();
  b.exit_code.reset();
  if (j.contains("signal") && j["signal"].is_string()) b.signal = j["signal"].get<std::string>();
  if (j.contains("exit_code") && j["exit_code"].is_number_integer()) b.exit_code = j["exit_code"].get<int>();
}

void to_json(json& j, const LogBody& b) {
  j = {{"alloc", b.alloc}, {"rank", b.rank}, {"pid", b.pid},       {"stream", b.stream},
       {"time", b.time},   {"cell", b.cell}, {"actor", b.actor}, {"mark", b.mark}};
  if (b.eof) j["eof"] = true;
}

void from_json(const json& j, LogBody& b) {
  const char* what = "Log";
  if (!j.is_object()) throw std::invalid_argument("Log body is not an object");
  b.alloc = field(j, "alloc", json::value_t::string, what).get<std::string>();
  b.rank = field(j, "rank", json::value_t::number_integer, what).get<int64_t>();
  b.stream = field(j, "stream", json::value_t::string, what).get<std::string>();
  if (b.stream != "stdout" && b.stream != "stderr") throw std::invalid_argument("Log body: 'stream' is " + b.stream);
  b.pid = j.value("pid", int64_t(0));
  b.time = j.contains("time") && j["time"].is_number() ? j["time"].get<double>() : 0.0;
  b.cell = j.value("cell", std::string());
  b.actor = j.value("actor", std::string());
  b.mark = j.contains("mark") && j["mark"].is_number_unsigned() ? j["mark"].get<uint64_t>() : 0;
  b.eof = j.value("eof", false);
}

void to_json(json& j, const CancelBody& b) { j = {{"corr", b.corr}, {"index", b.index}}; }

void from_json(const json& j, CancelBody& b) {
  if (!j.is_object()) throw std::invalid_argument("Cancel body is not an object");
  b.corr = field(j, "corr", json::value_t::number_integer, "Cancel").get<uint64_t>();
  b.index = field(j, "index", json::value_t::number_integer, "Cancel").get<int64_t>();
}

void to_json(json& j, const ConfigureBody& b) {
  j = json::object();
  if (b.log_level) j["log_level"] = *b.log_level;
  if (b.post_mortem) j["post_mortem"] = *b.post_mortem;
}

void from_json(const json& j, ConfigureBody& b) {
  if (!j.is_object()) throw std::invalid_argument("Configure body is not an object");
  b.log_level.reset();
  b.post_mortem.reset();
  if (j.contains("log_level")) b.log_level = field(j, "log_level", json::value_t::number_integer, "Configure").get<int>();
  if (j.contains("post_mortem")) b.post_mortem = field(j, "post_mortem", json::value_t::boolean, "Configure").get<bool>();
}

void to_json(json& j, const AdoptBody& b) {
  j = {{"cookies", b.cookies}, {"refuse", b.refuse}, {"refuse_text", b.refuse_text}};
}

void from_json(const json& j, AdoptBody& b) {
  if (!j.is_object()) throw std::invalid_argument("Adopt body is not an object");
  auto strings = [&](const char* name) {
    std::vector<std::string> out;
    if (!j.contains(name)) return out;
    const json& a = field(j, name, json::value_t::array, "Adopt");
    for (auto& v : a) {
      if (!v.is_string()) throw std::invalid_argument(std::string("Adopt body: '") + name + "' holds a non-string");
      out.push_back(v.get<std::string>());
    }
    return out;
  };
  b.cookies = strings("cookies");
  b.refuse = strings("refuse");
  b.refuse_text = j.value("refuse_text", std::string());
}

void to_json(json& j, const PeerDeadBody& b) {
  j = {{"addr", b.addr}, {"error", b.error}};
  if (b.host_lost) j["host_lost"] = true;
}

void from_json(const json& j, PeerDeadBody& b) {
  if (!j.is_object()) throw std::invalid_argument("PeerDead body is not an object");
  b.addr = field(j, "addr", json::value_t::string, "PeerDead").get<std::string>();
  b.error = j.contains("error") && j["error"].is_object() ? j["error"] : json::object();
  b.host_lost = j.value("host_lost", false);
}

void to_json(json& j, const ReloadBody& b) { j = {{"files", b.files}}; }

void from_json(const json& j, ReloadBody& b) {
  if (!j.is_object()) throw std::invalid_argument("Reload body is not an object");
  const json& files = field(j, "files", json::value_t::array, "Reload");
  b.files.clear();
  for (auto& f : files) {
    if (!f.is_string()) throw std::invalid_argument("Reload body: 'files' holds a non-string");
    b.files.push_back(f.get<std::string>());
  }
}

}  // namespace xmesh
