#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

// Short timings for every test (Catch2 2.x's test discovery cannot pass several environment
// variables through ctest properties, so they are set here, unless the caller set them).
int main(int argc, char* argv[]) {
  setenv("XMESH_HEARTBEAT_MS", "100", 0);
  setenv("XMESH_LINGER_MS", "200", 0);
  setenv("XMESH_ACTOR_WAIT_MS", "300", 0);
  return Catch::Session().run(argc, argv);
}
