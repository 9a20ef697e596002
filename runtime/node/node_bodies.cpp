// The checks of the bodies in node_bodies.hpp whose fields' types do not say everything.
#include "node_bodies.hpp"

namespace xmesh {

void ProcExitedBody::check() {
  if (!coords.is_object()) coords = nlohmann::json::object();  // written by agents of this build; tolerate
}

void CallBody::check() const {
  if (labels.has_value() != sizes.has_value()) refuse_body(what, "labels and sizes come together");
  if (labels && labels->size() != sizes->size()) refuse_body(what, "labels and sizes differ in length");
  int64_t n = 1;
  if (sizes)
    for (auto s : *sizes) {
      if (s < 0 || s > (int64_t{1} << 32)) refuse_body(what, "a size is out of range");
      n *= s == 0 ? 1 : s;
      if (n > (int64_t{1} << 40)) refuse_body(what, "the extent is too large");
    }
  if (rank && (*rank < 0 || (sizes && *rank >= n))) refuse_body(what, "rank is outside the extent");
  if (reply_addr.has_value() != reply_corr.has_value()) refuse_body(what, "reply_addr and reply_corr come together");
}

void PeerDeadBody::check() {
  if (!error.is_object()) error = nlohmann::json::object();
}

}  // namespace xmesh
