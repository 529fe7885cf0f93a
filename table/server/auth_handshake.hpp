// Authentication without a replayable secret (protocol 5). On a server with a token:
//
//   client -> AUTH        (empty payload)
//   server <- challenge   u32 scheme (kAuthSchemeHmacSha256), 32-byte nonce (random, per
//   connection) client -> AUTH_PROOF  32 bytes: HMAC-SHA256(key = token, "gpubox-auth-5" | nonce |
//   u64 client id) server <- OK, or PermissionDenied and the connection closed
//
// The token never crosses the wire, and a proof is good for its connection's nonce only: an AUTH
// exchange captured on one connection does not open another. The traffic itself is neither
// encrypted nor integrity-protected (a tunnel or VPN does that across untrusted networks).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::table::server {

inline constexpr uint32_t kAuthSchemeHmacSha256 = 1;
inline constexpr std::size_t kAuthNonceBytes = 32;
inline constexpr std::size_t kAuthProofBytes = 32;
// Tokens shorter than this (128 bits as hex digits) are refused by servers and clients alike.
inline constexpr std::size_t kMinTokenChars = 32;

using AuthNonce = std::array<uint8_t, kAuthNonceBytes>;
using AuthProof = std::array<uint8_t, kAuthProofBytes>;

// A fresh nonce from the system's random source (OpenSSL RAND_bytes).
AuthNonce random_nonce();
// HMAC-SHA256 of the nonce and the client id under the token.
AuthProof auth_proof(const std::string& token, const AuthNonce& nonce, uint64_t client_id);
// Constant time in the bytes compared.
bool proofs_equal(const AuthProof& a, const AuthProof& b);

void encode_auth_challenge(const AuthNonce& nonce, std::vector<uint8_t>* out);
StatusOr<AuthNonce> decode_auth_challenge(const uint8_t* data, std::size_t n);
StatusOr<AuthProof> decode_auth_proof(const uint8_t* data, std::size_t n);

// InvalidArgument naming `what` (a flag, a file) when `token` is shorter than kMinTokenChars.
Status check_token_strength(const std::string& token, const std::string& what);

// `refused` (a server's answer to a client) with what to do when the server refused the client's
// token, or its lack of one (`has_token`: whether the client sent one); else `refused` as it is.
Status with_token_hint(const Status& refused, bool has_token);

}  // namespace gpubox::table::server
