#include "table/server/auth_token.hpp"

#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/logging.hpp"
#include "table/server/auth_handshake.hpp"

namespace gpubox::table::server {

TokenFileChoice client_token_file(const std::string& configured) {
  const char* env = std::getenv(kAuthTokenFileEnv);
  if (env != nullptr && *env != '\0') return {env, kAuthTokenFileEnv};
  return {configured, "runner.auth_token_file"};
}

StatusOr<std::string> read_auth_token_file(const std::string& path, const std::string& what) {
  const std::string named = what + " '" + path + "'";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::NotFound("cannot read the token file " + named + ": it does not exist");
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("the token file " + named + " is not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read the token file " + named + " (permissions?)");
  std::stringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) return Status::InvalidArgument("the token file " + named + " is empty");
  GPUBOX_RETURN_IF_ERROR(check_token_strength(token, named));
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    GPUBOX_LOG(WARNING) << "the token file " << named << " is readable by other users (mode "
                        << mode << "): anyone who reads it can use the servers; chmod 600 it";
  }
  return token;
}

}  // namespace gpubox::table::server
