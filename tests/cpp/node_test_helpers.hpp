// Real Nodes of one process for the C++ tests: a controller that spawned actor "a" on a proc,
// and rings scribbled on as a proc's buggy native code would.
#pragma once
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "node.hpp"

// Starts both nodes and has ctl spawn actor "a" on proc: its inbox (the spawn still in it).
inline std::shared_ptr<xmesh::Inbox> started_with_actor(xmesh::Node& ctl, xmesh::Node& proc) {
  for (xmesh::Node* n : {&proc, &ctl}) {
    n->transport().cookies().present_by_default("k");
    n->start();
  }
  xmesh::Header spawn;
  spawn.kind = xmesh::Kind::SpawnActor;
  ctl.call({xmesh::Target{proc.addr(), "a"}}, spawn, {}, false);
  std::shared_ptr<xmesh::Inbox> inbox;
  for (int i = 0; i < 500 && !inbox; ++i, usleep(10000)) inbox = proc.actors().inbox("a");
  REQUIRE(inbox);
  return inbox;
}

// Every xmesh ring mapped in this process (both ends, every node), as a buggy native library of a
// proc would find them: its writer's position set to 2^62. How many mappings it hit. Written with
// process_vm_writev, not memcpy: a ring its node closes between the read of /proc/self/maps and
// the write is skipped (EFAULT), where a memcpy would crash the test.
inline int scribble_on_rings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int hit = 0;
  while (std::getline(maps, line)) {
    if (line.find("memfd:xmesh-link") == std::string::npos) continue;
    uintptr_t start = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    uint64_t bogus = uint64_t(1) << 62;
    iovec local{&bogus, sizeof bogus};
    iovec remote{reinterpret_cast<char*>(start) + 64, sizeof bogus};  // Header::head
    if (process_vm_writev(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof bogus)) ++hit;
  }
  return hit;
}
