#include "keys.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <zmq.h>

#include "unique_fd.hpp"

namespace xmesh {
namespace {

constexpr size_t kKeyChars = 40;       // Z85 of 32 bytes
constexpr off_t kMaxKeyFileBytes = 4096;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void check_z85_key(const std::string& path, const char* which, const std::string& key) {
  uint8_t raw[32];
  if (key.size() != kKeyChars || zmq_z85_decode(raw, key.c_str()) == nullptr)
    throw KeyFileError("key file " + path + ": the " + which + " key is not 40 Z85 characters (write a new file "
                       "with `xmesh keygen`)");
}

// The permission checks, on the file as opened (no race between the check and the read).
void check_file(const std::string& path, int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw KeyFileError("key file " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw KeyFileError("key file " + path + " is not a regular file");
  if (st.st_uid != geteuid())
    throw KeyFileError("key file " + path + " belongs to uid " + std::to_string(st.st_uid) +
                       ", not to this user (uid " + std::to_string(geteuid()) + ")");
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw KeyFileError("key file " + path + " is open to other users (mode " + mode +
                       "): whoever reads it can run code on every host that accepts it; chmod 600 " + path);
  }
  if (st.st_size > kMaxKeyFileBytes) throw KeyFileError("key file " + path + " is too large to be a key file");
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

CurveKeys generate_curve_keys() {
  if (!curve_available()) throw KeyFileError("this libzmq has no CURVE support: keys cannot be made or used");
  char pub[kKeyChars + 1], sec[kKeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) throw KeyFileError(std::string("zmq_curve_keypair: ") + zmq_strerror(errno));
  return {pub, sec};
}

void write_key_file(const std::string& path, const CurveKeys& keys, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (overwrite ? O_TRUNC : O_EXCL);
  unique_fd fd(::open(path.c_str(), flags, 0600));
  if (!fd) {
    if (errno == EEXIST) throw KeyFileError("key file " + path + " exists already (--force replaces it)");
    throw KeyFileError("key file " + path + ": " + std::strerror(errno));
  }
  if (fchmod(fd.get(), 0600) != 0)  // an existing file kept its mode through O_TRUNC
    throw KeyFileError("key file " + path + ": chmod: " + std::strerror(errno));
  std::string text =
      "# xmesh key file: whoever holds it can run code on every host that accepts it. Keep it 0600.\n"
      "public = " + keys.public_z85 + "\nsecret = " + keys.secret_z85 + "\n";
  ssize_t n = ::write(fd.get(), text.data(), text.size());
  int err = errno;
  fd.reset();
  if (n != static_cast<ssize_t>(text.size()))
    throw KeyFileError("key file " + path + ": write: " + std::strerror(n < 0 ? err : EIO));
}

CurveKeys read_key_file(const std::string& path) {
  std::string text;
  {
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw KeyFileError("key file " + path + ": " + std::strerror(errno));
    check_file(path, fd.get());
    char buf[kMaxKeyFileBytes + 1];
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) throw KeyFileError("key file " + path + ": " + std::strerror(errno));
    text.assign(buf, static_cast<size_t>(n));
  }
  CurveKeys keys;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    std::string name = eq == std::string::npos ? "" : trim(line.substr(0, eq));
    std::string value = eq == std::string::npos ? "" : trim(line.substr(eq + 1));
    if (name == "public") keys.public_z85 = value;
    else if (name == "secret") keys.secret_z85 = value;
    else throw KeyFileError("key file " + path + ": a line that is neither 'public = ...' nor 'secret = ...'");
  }
  check_z85_key(path, "public", keys.public_z85);
  check_z85_key(path, "secret", keys.secret_z85);
  if (!curve_available()) throw KeyFileError("this libzmq has no CURVE support: key files cannot be used");
  char derived[kKeyChars + 1];
  if (zmq_curve_public(derived, keys.secret_z85.c_str()) != 0 || keys.public_z85 != derived)
    throw KeyFileError("key file " + path + ": the public key is not the secret key's (the file was edited or "
                       "mixed up; write a new one with `xmesh keygen`)");
  return keys;
}

std::string cluster_cookie(const CurveKeys& keys) { return "cluster:" + keys.public_z85; }

}  // namespace xmesh
