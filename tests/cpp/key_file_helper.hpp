// A cluster key file (runtime/transport/keys.hpp) in a temporary directory of its own, removed at the end:
// for the tests of TCP links that authenticate and encrypt with CURVE.
#pragma once

#include <string>

#include "keys.hpp"
#include "scratch_dir_helper.hpp"

struct KeyFile : ScratchDir {
  std::string path;
  KeyFile() : ScratchDir("xmkey") {
    path = dir + "/cluster.key";
    xmesh::write_key_file(path, xmesh::generate_curve_keys(), false);
  }
};
