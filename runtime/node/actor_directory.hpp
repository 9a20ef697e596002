// ActorDirectory: the actors of one process and the messages on their way to them. Each actor
// has an Inbox that its thread reads; a message for an actor whose spawn has not arrived yet is
// held until the spawn or a deadline (another sender's SpawnActor may be in flight: there is no
// order across senders); callers that a newer owner took the process from are refused here.
// Its own lock; it never sends: the node answers for it (what it returns says what to answer).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "inbox.hpp"
#include "wire.hpp"

namespace xmesh {

class ActorDirectory {
 public:
  explicit ActorDirectory(int64_t hold_ms) : hold_ms_(hold_ms) {}

  std::shared_ptr<Inbox> inbox(const std::string& name) const;
  // A message for one actor (Call, StopActor): into its inbox, or held for its spawn. False:
  // the actor was stopped (or its inbox closed); the message is left in m to be answered.
  bool deliver(Message& m);
  // SpawnActor: a new inbox with the spawn first, then the messages held for it. Null (and m
  // untouched) when an actor of that name exists.
  std::shared_ptr<Inbox> spawn(Message& m);
  // Removes an actor: returns its inbox, closed, whose queued messages the caller answers.
  // tombstone (an error body, or null): what later messages to it are answered with (an actor
  // that failed or was stopped says so; see tombstone()).
  std::shared_ptr<Inbox> remove(const std::string& name, json tombstone = nullptr);
  // The error body a removed actor left to answer its later messages with (nullopt: none).
  std::optional<json> tombstone(const std::string& name) const;
  // Replaces the tombstone of an actor removed earlier (what happened since: its owner died).
  // False when no actor of that name was removed here.
  bool amend_tombstone(const std::string& name, json tombstone);
  // Messages held past their deadline (their actor was never spawned here).
  std::vector<Message> expire(int64_t now_ms);
  std::vector<std::shared_ptr<Inbox>> close_all();

  // Inboxes made from now on are fed by `feed` too (their consumers read it while they wait).
  void feed_inboxes_from(std::shared_ptr<WaitFeed> feed) { feed_ = std::move(feed); }

  // Calls (and spawns) from addr are answered with error instead of being run.
  void refuse_from(const std::string& addr, const json& error);
  std::optional<json> refusal_for(const Message& m) const;

 private:
  struct Held {
    int64_t deadline_ms = 0;
    std::vector<Message> msgs;
  };
  int64_t hold_ms_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Inbox>> actors_;
  std::unordered_map<std::string, Held> held_;
  std::unordered_map<std::string, json> removed_;  // name -> tombstone; bounded: cleared past 10,000 names
  std::unordered_map<std::string, json> refused_;
  std::atomic<bool> any_refused_{false};  // the common case skips the lock
  std::shared_ptr<WaitFeed> feed_;
  uint32_t next_feed_bit_ = 0;  // under mu_: each inbox's consumer sleeps with a bit of its own (cycling)
};

}  // namespace xmesh
