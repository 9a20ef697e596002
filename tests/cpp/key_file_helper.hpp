// A cluster key file (runtime/keys.hpp) in a temporary directory of its own, removed at the end:
// for the tests of TCP links that authenticate and encrypt with CURVE.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "keys.hpp"

struct KeyFile {
  std::string dir, path;
  KeyFile() {
    char tmpl[] = "/tmp/xmkey-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    path = dir + "/cluster.key";
    xmesh::write_key_file(path, xmesh::generate_curve_keys(), false);
  }
  ~KeyFile() { std::system(("rm -rf " + dir).c_str()); }
};
