// The transport's link upgrades (link.hpp): one state machine for every link kind. What a ring
// or a lane does at each step is its LinkKind's (transport_rings.cpp, transport_lanes.cpp); the
// proposal, the answer, the switch, the writes and the breaks are driven here, once.
#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

#include "transport.hpp"
#include "util.hpp"
#include "wait_feed.hpp"

namespace xmesh {

namespace {
// Which of the reader's sleepers a message is for: answers for a thread waiting on its call,
// calls for an idle actor thread (never a caller), the rest for whoever sleeps.
uint32_t wake_bits_for(Kind kind) {
  switch (kind) {
    case Kind::Reply:
    case Kind::Replies:
      return WaitFeed::kCallerBit;
    case Kind::Call:
      return Doorbell::kAnyIdle & ~WaitFeed::kCallerBit;
    default:
      return Doorbell::kAnyIdle;
  }
}
}  // namespace

std::vector<Kind> Transport::link_message_kinds() const {
  std::vector<Kind> kinds;
  for (auto& kind : kinds_) kinds.insert(kinds.end(), {kind->spec().propose, kind->spec().answer, kind->spec().take});
  return kinds;
}

bool Transport::on_link_message(const Message& m) {
  for (size_t i = 0; i < kLinkKinds; ++i) {
    const LinkSpec& spec = kinds_[i]->spec();
    if (m.header.kind == spec.propose) {
      answer_proposal(i, m);
    } else if (m.header.kind == spec.answer) {
      take_answer(i, m);
    } else if (m.header.kind == spec.take) {
      kinds_[i]->take(m.sender_addr, m.peer_identity);
    } else {
      continue;
    }
    return true;
  }
  return false;
}

// ---- the writer's side ------------------------------------------------------------------------
void Transport::propose_links_locked(OutPeer& p, Kind sent, bool blocking) {
  if (p.going) return;  // a link would only break with it
  for (size_t i = 0; i < kLinkKinds; ++i) {
    LinkUpgrade& up = p.links[i];
    if (!up.due(sent)) continue;
    LinkKind& kind = *kinds_[i];
    if (!kind.reaches(p.addr, p.resends)) {
      up.declined();
      continue;
    }
    json body;
    try {
      up.proposed(kind.propose(&body));
    } catch (const std::exception& e) {
      up.declined();
      log_diag_limited(link_log_, self_.role, std::string("no ") + kind.spec().name + " to " + p.addr +
                                             " (ZeroMQ goes on): " + e.what());
      continue;
    }
    try {
      send_link_message_locked(p, kind.spec().propose, std::move(body), blocking);
    } catch (const SendError&) {  // the message itself went: the link is only not proposed now
      up.give_up(/*count_break=*/false);
    }
  }
}

void Transport::take_answer(size_t i, const Message& m) {
  DeferredLinkStep step{i, /*send=*/false, m.sender_addr, m.header.body};
  if (!take_answer_now(step)) defer_link_step(std::move(step));
}

bool Transport::take_answer_now(const DeferredLinkStep& step) {
  auto p = existing_out_peer(step.addr);
  if (!p) return true;
  std::unique_lock<std::mutex> g(p->mu, std::defer_lock);
  if (!lock_unless_held_waiting(*p, g)) return false;
  LinkUpgrade& up = p->links[step.kind];
  if (up.state() != LinkUpgrade::State::proposed) return true;
  std::string why;
  auto writer = kinds_[step.kind]->answered(step.addr, up.made(), step.body, &why);
  if (writer) {
    up.armed(std::move(writer));
  } else if (!why.empty()) {
    up.declined();
    log_diag_limited(link_log_, self_.role, std::string("no ") + kinds_[step.kind]->spec().name + " to " +
                                           step.addr + " (ZeroMQ goes on): " + why);
  }
  return true;
}

bool Transport::links_send_locked(OutPeer& p, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                                  LinkBreak* broke) {
  for (size_t i = 0; i < kLinkKinds; ++i) {
    if (link_send_locked(p, i, h, frames, blocking, broke)) return true;
    if (broke->token) return false;
  }
  return false;
}

bool Transport::link_send_locked(OutPeer& p, size_t i, Header& h, std::vector<zmq::message_t>& frames, bool blocking,
                                 LinkBreak* broke) {
  LinkUpgrade& up = p.links[i];
  if (!up.writer()) return false;
  if (up.spec().numbered && p.hello_due) {  // the ZeroMQ link was made again: what is unacknowledged goes there first
    link_gone_locked(p, i, "its ZeroMQ link was made again");
    return false;
  }
  if (up.state() == LinkUpgrade::State::armed && !switch_when_ready_locked(p, i, blocking)) return false;
  if (up.state() != LinkUpgrade::State::active) return false;
  return up.spec().numbered ? numbered_link_send_locked(p, i, h, frames, blocking)
                            : plain_link_send_locked(p, i, h, frames, blocking, broke);
}

bool Transport::switch_when_ready_locked(OutPeer& p, size_t i, bool blocking) {
  LinkUpgrade& up = p.links[i];
  std::string failed;
  if (!up.writer()->ready(&failed)) {
    if (!failed.empty()) link_gone_locked(p, i, failed);
    return false;
  }
  // The last message over ZeroMQ: the reader reads the link once it dispatched this.
  send_link_message_locked(p, up.spec().take, nullptr, blocking);  // SendError: the switch is still due
  up.switched();
  return true;
}

// A link that loses and repeats nothing while it is up (a ring): unnumbered, not kept.
bool Transport::plain_link_send_locked(OutPeer& p, size_t i, Header& h, std::vector<zmq::message_t>& frames,
                                       bool blocking, LinkBreak* broke) {
  LinkWriter& link = *p.links[i].writer();
  h.seq = 0;  // no numbers to check
  h.pieces.clear();
  auto header = header_for_wire(h);
  MayWait waiting(p, blocking);  // for the ring's reader
  switch (link.write(header, frames, blocking, static_cast<int>(send_timeout_ms_), wake_bits_for(h.kind))) {
    case LinkWrite::ok:
      ++counts_.sent;
      ++counts_.link_sent[i];
      link.wrote(h);
      return true;
    case LinkWrite::would_block:
      throw SendError("the link to " + p.addr + " is full (this thread does not wait)", false, true);
    case LinkWrite::timed_out:
      throw SendError("sending to " + p.addr + " timed out after " + std::to_string(send_timeout_ms_) +
                      " ms (XMESH_SEND_TIMEOUT_MS): its " + p.links[i].spec().name +
                      " stayed full, so its actor's queue is full (XMESH_INBOX_LIMIT) or it reads nothing");
    case LinkWrite::closed:  // nothing of this message is on it
      *broke = LinkBreak{p.addr, link.token(), "its reader closed it", true};
      return false;
    case LinkWrite::broken:
      *broke = LinkBreak{p.addr, link.token(), link.error(), false};
      return false;
  }
  return false;
}

// A link whose messages are numbered in the ZeroMQ stream (a lane): kept until acknowledged, so
// a lane that breaks costs nothing: the link goes back to ZeroMQ and sends again what is
// unacknowledged (the receiver drops what it has).
bool Transport::numbered_link_send_locked(OutPeer& p, size_t i, Header& h, std::vector<zmq::message_t>& frames,
                                          bool blocking) {
  LinkWriter& link = *p.links[i].writer();
  make_room_locked(p, payload_bytes(frames), blocking);
  h.seq = p.seq + 1;
  h.pieces.clear();  // a lane carries frames whole
  auto header = header_for_wire(h);
  Unacked kept = copy_for_resend(h.seq, header, frames);
  LinkWrite result;
  {
    MayWait waiting(p, blocking);  // for the lane's socket to drain
    result = link.write(header, frames, blocking, static_cast<int>(send_timeout_ms_), 0);
  }
  if (result == LinkWrite::would_block)  // nothing of it was written
    throw SendError("the " + std::string(p.links[i].spec().name) + " to " + p.addr +
                        " is full (this thread does not wait)",
                    false, true);
  // Written, in part or whole, or waiting to leave: it is the link's now, kept until acknowledged.
  ++p.seq;
  keep_unacked_locked(p, std::move(kept));
  ++counts_.sent;
  ++counts_.link_sent[i];
  if (result == LinkWrite::broken || result == LinkWrite::closed) {  // it and everything unacknowledged go over ZeroMQ
    link_gone_locked(p, i, link.error());
    try {
      resume_locked(p, blocking ? zmq::send_flags::none : zmq::send_flags::dontwait);
    } catch (const SendError&) {  // hello_due stays set: the next send or tick sends them
    }
  }
  return true;
}

void Transport::link_gone_locked(OutPeer& p, size_t i, const std::string& why_given, bool quiet) {
  LinkUpgrade& up = p.links[i];
  const std::string why = why_given;  // may be the writer's own error text: copied before it goes
  const bool was_active = up.state() == LinkUpgrade::State::active;
  up.give_up(/*count_break=*/true);
  if (!p.going) ++counts_.link_breaks[i];  // a proc stopped on purpose ends its links: not a break
  if (up.spec().numbered && was_active) p.hello_due = true;  // Hello, then again whatever it took unacknowledged
  if (quiet || p.going) return;  // its reader closed it, or its proc is being stopped: its end, not news
  const std::string name = up.spec().name;
  std::lock_guard<std::mutex> g(link_notes_mu_);
  link_notes_.push_back(
      {p.addr,
       "the " + name + " to " + p.addr + " is given up (" + why + "): ZeroMQ carries its messages" +
           (up.state() == LinkUpgrade::State::declined ? " from now on" : " until a new " + name + " is up"),
       now_ms() + kLinkNoteGraceMs});
}

// I/O thread (tidy): the breaks whose grace passed, said for the peers still there and not ending.
void Transport::say_due_link_notes() {
  std::vector<LinkNote> due;
  {
    std::lock_guard<std::mutex> g(link_notes_mu_);
    if (link_notes_.empty()) return;
    const int64_t now = now_ms();
    auto first_later = std::stable_partition(link_notes_.begin(), link_notes_.end(),
                                             [now](const LinkNote& n) { return n.due_ms <= now; });
    due.assign(std::make_move_iterator(link_notes_.begin()), std::make_move_iterator(first_later));
    link_notes_.erase(link_notes_.begin(), first_later);
  }
  for (auto& note : due) {
    auto p = existing_out_peer(note.addr);  // gone: disconnected as dead meanwhile
    if (p && !p->going) log_diag_limited(link_log_, self_.role, note.text);
  }
}

void Transport::tend_links_locked(OutPeer& p) {
  for (size_t i = 0; i < kLinkKinds; ++i) {
    LinkUpgrade& up = p.links[i];
    if (up.state() != LinkUpgrade::State::active) continue;
    std::string why;
    bool by_reader = false;
    if (up.writer()->tend(&why, &by_reader)) continue;
    // Closed by its reader: that node closed it or ended (a proc that stopped): said by
    // supervision if it matters; what it did not acknowledge goes again over ZeroMQ, quietly.
    link_gone_locked(p, i, why, by_reader);
    if (!up.spec().numbered) continue;
    try {
      resume_locked(p, zmq::send_flags::dontwait);
    } catch (const SendError&) {
    }
  }
}

// ---- the reader's side ------------------------------------------------------------------------
void Transport::answer_proposal(size_t i, const Message& m) {
  LinkKind& kind = *kinds_[i];
  DeferredLinkStep step{i, /*send=*/true, m.sender_addr, {}};
  try {
    step.body = kind.answer(m.sender_addr, m.header.body);
  } catch (const std::invalid_argument& e) {
    count_malformed(std::string("dropped a malformed '") + kind_name(m.header.kind) + "' message: " + e.what());
    return;
  }
  if (!send_answer(step)) defer_link_step(std::move(step));
}

bool Transport::send_answer(const DeferredLinkStep& step) {
  Header h;
  h.kind = kinds_[step.kind]->spec().answer;
  h.body = step.body;
  std::vector<zmq::message_t> none;
  try {
    send(step.addr, h, none, /*blocking=*/false);
  } catch (const SendError& e) {
    if (e.would_block) return false;
    kinds_[step.kind]->answer_lost(step.addr, step.body);  // the proposer never hears
  }
  return true;
}

// Bounded: a proposer sends one proposal per kind until it hears, so the steps number at most
// two per peer; the cap only stops a flood of proposals from growing it.
void Transport::defer_link_step(DeferredLinkStep step) {
  constexpr size_t kMaxDeferred = 4096;
  std::optional<DeferredLinkStep> dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    deferred_link_steps_.push_back(std::move(step));
    link_steps_deferred_.store(true, std::memory_order_relaxed);
    if (deferred_link_steps_.size() > kMaxDeferred) {
      dropped = std::move(deferred_link_steps_.front());
      deferred_link_steps_.pop_front();
    }
  }
  if (dropped && dropped->send) kinds_[dropped->kind]->answer_lost(dropped->addr, dropped->body);
}

void Transport::retry_deferred_link_steps() {
  std::deque<DeferredLinkStep> steps;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (deferred_link_steps_.empty()) return;
    steps.swap(deferred_link_steps_);
  }
  std::deque<DeferredLinkStep> waiting;
  for (auto& step : steps) {
    // Its peer still held by a waiting sender: not tried now, which would cost this receive
    // lock_unless_held_waiting's grace (the wait may last the send timeout).
    auto p = existing_out_peer(step.addr);
    const bool held = p && p->holders_waiting.load(std::memory_order_relaxed) > 0;
    if (held || !(step.send ? send_answer(step) : take_answer_now(step))) waiting.push_back(std::move(step));
  }
  std::lock_guard<std::mutex> g(mu_);
  // Steps deferred meanwhile come after these, in the order they came.
  deferred_link_steps_.insert(deferred_link_steps_.begin(), std::make_move_iterator(waiting.begin()),
                              std::make_move_iterator(waiting.end()));
  link_steps_deferred_.store(!deferred_link_steps_.empty(), std::memory_order_relaxed);
}

// ---- kept until acknowledged ------------------------------------------------------------------
size_t Transport::payload_bytes(const std::vector<zmq::message_t>& frames) {
  size_t n = 0;
  for (auto& f : frames) n += f.size();
  return n;
}

Transport::Unacked Transport::copy_for_resend(uint64_t seq, const std::vector<uint8_t>& header,
                                              std::vector<zmq::message_t>& frames) {
  Unacked kept{};
  kept.seq = seq;
  kept.header = header;
  kept.bytes = payload_bytes(frames) + header.size();
  kept.frames.resize(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) kept.frames[i].copy(frames[i]);  // shares their memory
  return kept;
}

void Transport::keep_unacked_locked(OutPeer& p, Unacked kept) {
  p.unacked_bytes += kept.bytes;
  p.unacked.push_back(std::move(kept));
  p.unacked_count.store(p.unacked.size(), std::memory_order_relaxed);
}

}  // namespace xmesh
