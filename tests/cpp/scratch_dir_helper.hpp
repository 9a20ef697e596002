// A temporary directory of a test's own, removed with everything in it at the end.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

struct ScratchDir {
  std::string dir;
  explicit ScratchDir(const char* prefix = "xmtest") {
    std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~ScratchDir() { std::system(("rm -rf " + dir).c_str()); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};
