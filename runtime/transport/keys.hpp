// Key files for links between machines (issue 20, hosts over TCP): one CURVE keypair that every
// party of a cluster holds (host agents, controllers, procs). A connection is admitted only from
// a peer that proves it holds the file's secret key, and its traffic is encrypted (libzmq's
// CURVE). Holding the file therefore means being able to run code on every host that accepts it:
// it is a secret like an SSH private key, and it is refused when others can read it.
//
// The file is text, written 0600:
//   # xmesh key file ...
//   public = <40 Z85 characters>
//   secret = <40 Z85 characters>
#pragma once
#include <stdexcept>
#include <string>

namespace xmesh {

struct CurveKeys {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters
};

// A problem with a key file, naming the file and what to do.
struct KeyFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whether this libzmq does CURVE (built with libsodium or tweetnacl).
bool curve_available();
// A fresh keypair (throws KeyFileError when CURVE is not available).
CurveKeys generate_curve_keys();
// Writes keys to path with mode 0600; an existing file is refused unless overwrite.
void write_key_file(const std::string& path, const CurveKeys& keys, bool overwrite);
// Reads and checks a key file: a regular file of this user, not readable or writable by group
// or others, holding a valid pair (the public key is the secret's).
CurveKeys read_key_file(const std::string& path);
// The cookie every holder of the key presents to a host agent over TCP (an agent accepts it
// besides its own): the connection is already admitted by key, so the cookie only says "a
// controller of this cluster" (procs accept their job's cookie instead). Derived from the public
// key, which CURVE never sends in the clear.
std::string cluster_cookie(const CurveKeys& keys);

}  // namespace xmesh
