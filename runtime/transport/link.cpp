// The writer's link upgrade (link.hpp): the one state machine every link kind goes through.
#include "link.hpp"

#include <utility>

namespace xmesh {

bool LinkUpgrade::due(Kind sent) const { return state_ == State::idle && carries_calls(sent); }

void LinkUpgrade::set_writer(std::shared_ptr<LinkWriter> w) {
  writer_ = std::move(w);
  std::atomic_store(&shared_, writer_);
}

void LinkUpgrade::proposed(std::shared_ptr<LinkWriter> made) {
  set_writer(std::move(made));
  state_ = State::proposed;
}

void LinkUpgrade::armed(std::shared_ptr<LinkWriter> writer) {
  set_writer(std::move(writer));
  state_ = State::armed;
}

void LinkUpgrade::declined() {
  if (writer_) writer_->close();
  set_writer(nullptr);
  up_.store(false);
  state_ = State::declined;
}

void LinkUpgrade::switched() {
  if (writer_) writer_->switched();
  state_ = State::active;
  up_.store(true);
}

std::shared_ptr<LinkWriter> LinkUpgrade::give_up(bool count_break) {
  auto w = std::move(writer_);
  if (w) w->close();
  set_writer(nullptr);
  up_.store(false);
  if (count_break) ++breaks_;
  state_ = breaks_ >= spec_->breaks_allowed ? State::declined : State::idle;
  return w;
}

void LinkUpgrade::close() {
  if (writer_) writer_->close();
  up_.store(false);
}

const char* link_state_name(LinkUpgrade::State s) {
  switch (s) {
    case LinkUpgrade::State::idle: return "idle";
    case LinkUpgrade::State::proposed: return "proposed";
    case LinkUpgrade::State::armed: return "armed";
    case LinkUpgrade::State::active: return "active";
    case LinkUpgrade::State::declined: return "declined";
  }
  return "?";
}

}  // namespace xmesh
