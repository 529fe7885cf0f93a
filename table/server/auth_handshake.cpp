#include "table/server/auth_handshake.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "table/server/protocol.hpp"

namespace gpubox::table::server {
namespace {
constexpr char kProofContext[] = "gpubox-auth-5";
}  // namespace

AuthNonce random_nonce() {
  AuthNonce nonce{};
  // RAND_bytes fails only when the system's entropy source does: no nonce is safe then.
  GPUBOX_EXPECTS(RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) == 1,
                 "RAND_bytes failed: no random source for the AUTH nonce");
  return nonce;
}

AuthProof auth_proof(const std::string& token, const AuthNonce& nonce, uint64_t client_id) {
  uint8_t message[sizeof(kProofContext) - 1 + kAuthNonceBytes + sizeof(uint64_t)];
  std::memcpy(message, kProofContext, sizeof(kProofContext) - 1);
  std::memcpy(message + sizeof(kProofContext) - 1, nonce.data(), nonce.size());
  std::memcpy(message + sizeof(kProofContext) - 1 + nonce.size(), &client_id, sizeof(client_id));
  AuthProof proof{};
  unsigned int length = 0;
  GPUBOX_EXPECTS(HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message,
                      sizeof(message), proof.data(), &length) != nullptr &&
                     length == proof.size(),
                 "HMAC-SHA256 failed");
  return proof;
}

bool proofs_equal(const AuthProof& a, const AuthProof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void encode_auth_challenge(const AuthNonce& nonce, std::vector<uint8_t>* out) {
  PayloadWriter w(out);
  w.put_u32(kAuthSchemeHmacSha256);
  w.put_raw(nonce.data(), nonce.size());
}

StatusOr<AuthNonce> decode_auth_challenge(const uint8_t* data, std::size_t n) {
  PayloadReader r(data, n, "AUTH challenge");
  uint32_t scheme = 0;
  GPUBOX_RETURN_IF_ERROR(r.get_u32(&scheme));
  if (scheme != kAuthSchemeHmacSha256) {
    return Status::InvalidArgument("the server asks for AUTH scheme " + std::to_string(scheme) +
                                   "; this client knows HMAC-SHA256 (" +
                                   std::to_string(kAuthSchemeHmacSha256) + ") only");
  }
  AuthNonce nonce{};
  GPUBOX_RETURN_IF_ERROR(r.get_raw(nonce.data(), nonce.size(), "nonce"));
  GPUBOX_RETURN_IF_ERROR(r.finish());
  return nonce;
}

StatusOr<AuthProof> decode_auth_proof(const uint8_t* data, std::size_t n) {
  if (n != kAuthProofBytes) {
    return Status::PermissionDenied("AUTH_PROOF of " + std::to_string(n) + " bytes (not " +
                                    std::to_string(kAuthProofBytes) + ")");
  }
  AuthProof proof{};
  std::memcpy(proof.data(), data, n);
  return proof;
}

Status check_token_strength(const std::string& token, const std::string& what) {
  if (token.size() >= kMinTokenChars) return Status::OK();
  return Status::InvalidArgument(
      "the token of " + what + " has " + std::to_string(token.size()) + " characters; at least " +
      std::to_string(kMinTokenChars) +
      " are needed (128 bits as hex digits): make one with `openssl rand -hex 32`");
}

Status with_token_hint(const Status& refused, bool has_token) {
  const std::string& message = refused.message();
  if (refused.code() != Status::Code::kPermissionDenied ||
      (message.find("wrong auth token") == std::string::npos &&
       message.find("requires AUTH") == std::string::npos)) {
    return refused;
  }
  return Status::PermissionDenied(
      message +
      (!has_token
           ? ": the server requires a token and this client has none: give it the servers' "
             "token file (GPUBOX_AUTH_TOKEN_FILE or runner.auth_token_file)"
           : ": the server was started with another token than this client's: give the servers "
             "and the trainers one token file (GPUBOX_AUTH_TOKEN_FILE or runner.auth_token_file; "
             "scripts/launch.sh and run_gpubox.sh make one per job only when they start both)"));
}

}  // namespace gpubox::table::server
