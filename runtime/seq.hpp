// Per-connection sequence checking. ZeroMQ keeps order on one connection; a gap means a
// reconnect lost messages, a repeat means a duplicate. Incarnation changes reset the count,
// so a restarted process never collides with its predecessor's numbers.
#pragma once
#include <cstdint>

namespace xmesh {

class SeqTracker {
 public:
  enum Verdict { InOrder, Gap, Duplicate, NewIncarnation };
  Verdict accept(uint64_t incarnation, uint64_t seq) {
    if (incarnation != incarnation_) {
      bool first = incarnation_ == 0 && last_ == 0;
      incarnation_ = incarnation;
      last_ = seq;
      return first ? InOrder : NewIncarnation;
    }
    if (seq <= last_) return Duplicate;
    Verdict v = seq == last_ + 1 ? InOrder : Gap;
    last_ = seq;
    return v;
  }
  uint64_t last() const { return last_; }

 private:
  uint64_t incarnation_ = 0;
  uint64_t last_ = 0;
};

}  // namespace xmesh
