// The shared secret of gpubox_server and its clients (docs/operations.md, "Security and
// durability"): a file holding one token, read the same way by the server (--auth_token_file) and
// by the trainer (runner.auth_token_file, or GPUBOX_AUTH_TOKEN_FILE which wins over it).
#pragma once

#include <string>

#include "common/status.hpp"

namespace gpubox::table::server {

// The environment variable naming a client's token file; it wins over the config.
inline constexpr const char* kAuthTokenFileEnv = "GPUBOX_AUTH_TOKEN_FILE";

// The token file a client uses and where that choice came from: $GPUBOX_AUTH_TOKEN_FILE when set
// and not empty, else `configured` (runner.auth_token_file). path "" = no token.
struct TokenFileChoice {
  std::string path;
  std::string source;  // "GPUBOX_AUTH_TOKEN_FILE" or "runner.auth_token_file"
};
TokenFileChoice client_token_file(const std::string& configured);

// Reads a token file: the token is its text without trailing whitespace. `what` names the file
// in messages ("--auth_token_file", "GPUBOX_AUTH_TOKEN_FILE"). Errors name the file: missing or
// unreadable (NotFound), empty or shorter than kMinTokenChars (InvalidArgument). A file that other
// users may read is used, with a warning naming it and its mode (a token is a password: chmod 600).
StatusOr<std::string> read_auth_token_file(const std::string& path, const std::string& what);

}  // namespace gpubox::table::server
