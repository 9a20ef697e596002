// A scoped environment variable for the C++ tests: nodes read their settings when made, so a
// test sets one before making them and the next test starts without it.
#pragma once
#include <cstdlib>
#include <string>

struct Env {
  std::string name;
  Env(const char* n, const std::string& v) : name(n) { setenv(n, v.c_str(), 1); }
  ~Env() { unsetenv(name.c_str()); }
};
