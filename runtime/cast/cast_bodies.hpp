// The bodies of cast trees' own messages (cast/): answers gathered up a tree.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bodies.hpp"
#include "wire.hpp"
#include "node_bodies.hpp"

namespace xmesh {

// One answer in a Replies message: the payload frames of the answers follow in order, `frames`
// of them for this one.
struct ReplyEntry {
  static constexpr const char* what = "ReplyEntry";
  int64_t index = 0;
  bool ok = false;
  nlohmann::json body;   // the error, when not ok
  int64_t frames = 0;
  void check() const {
    if (index < 0) throw std::invalid_argument("ReplyEntry: 'index' is negative");
    if (frames < 0) throw std::invalid_argument("ReplyEntry: 'frames' is negative");
  }
  template <class F>
  static void fields(F&& f) {
    f("i", &ReplyEntry::index, Need::Required);
    f("k", &ReplyEntry::ok, Need::Required);
    f("b", &ReplyEntry::body, Need::Optional);
    f("f", &ReplyEntry::frames, Need::Required);
  }
};
XMESH_BODY_JSON(ReplyEntry)

// Replies (a relay or a target behind one -> the next node up a cast tree): answers to the
// origin's call (Header::corr) of targets behind the sender.
struct RepliesBody {
  static constexpr const char* what = "Replies";
  static constexpr Kind kind = Kind::Replies;  // the message it is the body of
  std::string origin;               // the call's origin address
  std::vector<ReplyEntry> replies;  // at least one
  void check() const {
    if (replies.empty()) throw std::invalid_argument("Replies: 'replies' is empty");
  }
  template <class F>
  static void fields(F&& f) {
    f("o", &RepliesBody::origin, Need::Required);
    f("r", &RepliesBody::replies, Need::Required);
  }
};
XMESH_BODY_JSON(RepliesBody)

}  // namespace xmesh
