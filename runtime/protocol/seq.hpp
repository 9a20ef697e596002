// Per-connection sequence checking. ZeroMQ keeps order on one connection; a gap means a
// reconnect lost messages, a repeat means a duplicate. Incarnation changes reset the count,
// so a restarted process never collides with its predecessor's numbers.
//
// On a link that resends (TCP: the sender keeps what it sent until acknowledged, transport.hpp),
// a message past the next expected one is not taken (Early): the ones before it were lost with
// a connection and come again, in order, after the sender's next Hello.
#pragma once
#include <cstdint>

namespace xmesh {

class SeqTracker {
 public:
  enum Verdict { InOrder, Gap, Duplicate, NewIncarnation, Early };
  // The next message taken is last + 1 (a Hello says where its sender's numbers go on).
  void start(uint64_t incarnation, uint64_t last) {
    incarnation_ = incarnation;
    last_ = last;
  }
  Verdict accept(uint64_t incarnation, uint64_t seq, bool in_order_only = false) {
    if (incarnation != incarnation_) {
      bool first = incarnation_ == 0 && last_ == 0;
      incarnation_ = incarnation;
      last_ = seq;
      return first ? InOrder : NewIncarnation;
    }
    if (seq <= last_) return Duplicate;
    if (seq != last_ + 1 && in_order_only) return Early;
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
