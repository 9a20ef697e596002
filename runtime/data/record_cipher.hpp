// The data plane's encryption between hosts (docs/architecture/06-data-plane.md): records of
// bulk bytes sealed with an AEAD under a key made for one lease. AES-256-GCM where the CPU has
// AES instructions (OpenSSL's, several GB/s a core), ChaCha20-Poly1305 otherwise; the owner
// names the cipher in its grant. A record's nonce is (stream number, record number): a record
// changed, dropped, replayed, reordered or moved to another stream does not open.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace xmesh {

constexpr size_t kRecordKeyBytes = 32;
constexpr size_t kRecordTagBytes = 16;

enum class RecordCipherKind { aes256gcm, chacha20poly1305 };
RecordCipherKind preferred_record_cipher();  // aes256gcm where the CPU has AES-NI
const char* record_cipher_name(RecordCipherKind k);  // "aes-256-gcm", "chacha20-poly1305"
bool parse_record_cipher(const std::string& name, RecordCipherKind* out);

// One key, one direction of records. Not thread-safe (one per stream).
class RecordCipher {
 public:
  RecordCipher(RecordCipherKind kind, const std::string& key);  // key: kRecordKeyBytes; throws otherwise
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;
  // n bytes at `plain` sealed into `out`: n bytes of ciphertext, then the tag (n + 16 bytes).
  // plain and out may be the same memory.
  void seal(uint32_t stream, uint64_t record, const char* plain, size_t n, char* out);
  // The n + 16 bytes at `sealed` opened into n bytes at `out`; false (out undefined) when they do
  // not open: changed, or not this record of this stream under this key.
  bool open(uint32_t stream, uint64_t record, const char* sealed, size_t n, char* out);

 private:
  void* ctx_;  // EVP_CIPHER_CTX
  const void* cipher_;
  std::string key_;
};

}  // namespace xmesh
