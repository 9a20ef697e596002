// Two real Nodes of one process for the C++ tests: a controller that spawned actor "a" on a proc.
#pragma once
#include <unistd.h>

#include <memory>

#include <catch2/catch.hpp>

#include "node.hpp"

// Starts both nodes and has ctl spawn actor "a" on proc: its inbox (the spawn still in it).
inline std::shared_ptr<xmesh::Inbox> started_with_actor(xmesh::Node& ctl, xmesh::Node& proc) {
  for (xmesh::Node* n : {&proc, &ctl}) {
    n->set_default_cookie("k");
    n->start();
  }
  xmesh::Header spawn;
  spawn.kind = xmesh::Kind::SpawnActor;
  ctl.call({xmesh::Target{proc.addr(), "a"}}, spawn, {}, false);
  std::shared_ptr<xmesh::Inbox> inbox;
  for (int i = 0; i < 500 && !inbox; ++i, usleep(10000)) inbox = proc.actor_inbox("a");
  REQUIRE(inbox);
  return inbox;
}
