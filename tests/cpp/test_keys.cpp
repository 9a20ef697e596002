#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "keys.hpp"

using namespace xmesh;

namespace {
std::string temp_dir() {
  char tmpl[] = "/tmp/xmkeys-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string message_of(const std::string& path) {
  try {
    read_key_file(path);
  } catch (const KeyFileError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a key file is written 0600 and read back as the same pair", "[keys][security]") {
  REQUIRE(curve_available());
  auto dir = temp_dir();
  auto path = dir + "/cluster.key";
  auto keys = generate_curve_keys();
  CHECK(keys.public_z85.size() == 40);
  CHECK(keys.secret_z85.size() == 40);
  write_key_file(path, keys, false);
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = read_key_file(path);
  CHECK(back.public_z85 == keys.public_z85);
  CHECK(back.secret_z85 == keys.secret_z85);
  // An existing file is kept unless overwriting is asked for; overwriting makes it 0600 again.
  CHECK_THROWS_WITH(write_key_file(path, generate_curve_keys(), false), Catch::Contains("exists already"));
  chmod(path.c_str(), 0640);
  auto other = generate_curve_keys();
  write_key_file(path, other, true);
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(read_key_file(path).secret_z85 == other.secret_z85);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("key files that others can read, that are not files or that do not hold a pair are refused",
          "[keys][security]") {
  auto dir = temp_dir();
  auto path = dir + "/k";
  write_key_file(path, generate_curve_keys(), false);
  chmod(path.c_str(), 0644);
  auto loose = message_of(path);
  CHECK_THAT(loose, Catch::Contains("open to other users (mode 0644)") && Catch::Contains("chmod 600"));
  chmod(path.c_str(), 0600);
  CHECK(message_of(path).empty());

  CHECK_THAT(message_of(dir + "/missing"), Catch::Contains("No such file"));
  CHECK_THAT(message_of(dir), Catch::Contains("not a regular file"));

  auto a = generate_curve_keys(), b = generate_curve_keys();
  auto mixed = dir + "/mixed";
  write_key_file(mixed, {a.public_z85, b.secret_z85}, false);
  CHECK_THAT(message_of(mixed), Catch::Contains("the public key is not the secret key's"));

  auto garbage = dir + "/garbage";
  write_key_file(garbage, {"short", a.secret_z85}, false);
  CHECK_THAT(message_of(garbage), Catch::Contains("the public key is not 40 Z85 characters"));

  auto odd = dir + "/odd";
  { std::ofstream(odd) << "public = " << a.public_z85 << "\nsecret = " << a.secret_z85 << "\nhello\n"; }
  chmod(odd.c_str(), 0600);
  CHECK_THAT(message_of(odd), Catch::Contains("neither 'public = ...' nor 'secret = ...'"));
  std::system(("rm -rf " + dir).c_str());
}
