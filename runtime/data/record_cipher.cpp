#include "record_cipher.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <stdexcept>

namespace xmesh {

namespace {
void nonce_of(uint32_t stream, uint64_t record, unsigned char out[12]) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(stream >> (8 * i));
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<unsigned char>(record >> (8 * i));
}

EVP_CIPHER_CTX* ctx_of(void* p) { return static_cast<EVP_CIPHER_CTX*>(p); }
}  // namespace

RecordCipherKind preferred_record_cipher() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool aes = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
  return aes ? RecordCipherKind::aes256gcm : RecordCipherKind::chacha20poly1305;
#else
  return RecordCipherKind::chacha20poly1305;
#endif
}

const char* record_cipher_name(RecordCipherKind k) {
  return k == RecordCipherKind::aes256gcm ? "aes-256-gcm" : "chacha20-poly1305";
}

bool parse_record_cipher(const std::string& name, RecordCipherKind* out) {
  if (name == "aes-256-gcm") *out = RecordCipherKind::aes256gcm;
  else if (name == "chacha20-poly1305") *out = RecordCipherKind::chacha20poly1305;
  else return false;
  return true;
}

RecordCipher::RecordCipher(RecordCipherKind kind, const std::string& key) : key_(key) {
  if (key.size() != kRecordKeyBytes) throw std::invalid_argument("a record key is 32 bytes");
  cipher_ = kind == RecordCipherKind::aes256gcm ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
  ctx_ = EVP_CIPHER_CTX_new();
  if (!ctx_ || !cipher_) throw std::runtime_error("OpenSSL has no " + std::string(record_cipher_name(kind)));
}

RecordCipher::~RecordCipher() { EVP_CIPHER_CTX_free(ctx_of(ctx_)); }

void RecordCipher::seal(uint32_t stream, uint64_t record, const char* plain, size_t n, char* out) {
  unsigned char nonce[12];
  nonce_of(stream, record, nonce);
  auto* c = ctx_of(ctx_);
  auto* cipher = static_cast<const EVP_CIPHER*>(cipher_);
  auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  int len = 0;
  // Records are at most a few MiB: the int lengths OpenSSL takes hold them.
  if (EVP_EncryptInit_ex(c, cipher, nullptr, key, nonce) != 1 ||
      EVP_EncryptUpdate(c, reinterpret_cast<unsigned char*>(out), &len, reinterpret_cast<const unsigned char*>(plain),
                        static_cast<int>(n)) != 1 ||
      EVP_EncryptFinal_ex(c, reinterpret_cast<unsigned char*>(out) + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, kRecordTagBytes, out + n) != 1)
    throw std::runtime_error("sealing a record failed (OpenSSL)");
}

bool RecordCipher::open(uint32_t stream, uint64_t record, const char* sealed, size_t n, char* out) {
  unsigned char nonce[12];
  nonce_of(stream, record, nonce);
  auto* c = ctx_of(ctx_);
  auto* cipher = static_cast<const EVP_CIPHER*>(cipher_);
  auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  unsigned char tag[kRecordTagBytes];
  std::memcpy(tag, sealed + n, kRecordTagBytes);  // before out (which may be sealed) is written
  int len = 0;
  if (EVP_DecryptInit_ex(c, cipher, nullptr, key, nonce) != 1 ||
      EVP_DecryptUpdate(c, reinterpret_cast<unsigned char*>(out), &len, reinterpret_cast<const unsigned char*>(sealed),
                        static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, kRecordTagBytes, tag) != 1)
    return false;
  return EVP_DecryptFinal_ex(c, reinterpret_cast<unsigned char*>(out) + len, &len) == 1;
}

}  // namespace xmesh
