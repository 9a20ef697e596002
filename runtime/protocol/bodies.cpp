// The checks of the bodies whose fields' types do not say everything (bodies.hpp).
#include "bodies.hpp"

namespace xmesh {

namespace {
void refuse(const char* what, const std::string& why) { throw std::invalid_argument(std::string(what) + " body: " + why); }
}  // namespace

void ProcExitedBody::check() {
  if (!coords.is_object()) coords = nlohmann::json::object();  // written by agents of this build; tolerate
}

void CallBody::check() const {
  if (labels.has_value() != sizes.has_value()) refuse(what, "labels and sizes come together");
  if (labels && labels->size() != sizes->size()) refuse(what, "labels and sizes differ in length");
  int64_t n = 1;
  if (sizes)
    for (auto s : *sizes) {
      if (s < 0 || s > (int64_t{1} << 32)) refuse(what, "a size is out of range");
      n *= s == 0 ? 1 : s;
      if (n > (int64_t{1} << 40)) refuse(what, "the extent is too large");
    }
  if (rank && (*rank < 0 || (sizes && *rank >= n))) refuse(what, "rank is outside the extent");
  if (reply_addr.has_value() != reply_corr.has_value()) refuse(what, "reply_addr and reply_corr come together");
}

void ReadLogBody::check() const {
  if (dir.find('/') != std::string::npos || dir == "." || dir == ".." || (dir.empty() && !file.empty()))
    refuse(what, "'dir' must name a log directory");
  if (file.find('/') != std::string::npos) refuse(what, "'file' must be a file name");
  if (offset < 0) refuse(what, "'offset' is negative");
  if (max_bytes <= 0) refuse(what, "'max_bytes' is not positive");
}

void LogBody::check() const {
  if (stream != "stdout" && stream != "stderr") refuse(what, "'stream' is " + stream);
}

void PeerDeadBody::check() {
  if (!error.is_object()) error = nlohmann::json::object();
}

void SpawnProcsBody::check() const {
  if (alloc.empty() || alloc.size() > 16 || alloc.find_first_not_of("0123456789abcdef") != std::string::npos)
    refuse(what, "'alloc' must be 1-16 lowercase hex digits");
  if (argv.empty()) refuse(what, "'argv' is empty");
  if (ranks.empty()) refuse(what, "'ranks' must be a non-empty list");
}

void StopProcsBody::check() const {
  if (alloc.empty() && name.empty()) refuse(what, "names neither 'alloc' nor 'name'");
}

void DebugEventBody::check() const {
  if (ev != "prompt" && ev != "running" && ev != "ended" && ev != "sources" && ev != "pause")
    refuse(what, "'ev' is " + ev);
}

void SyncStepBody::check() const {
  if (op != "begin" && op != "plan" && op != "data" && op != "commit" && op != "abort")
    refuse(what, "unknown step '" + op + "'");
}

}  // namespace xmesh
