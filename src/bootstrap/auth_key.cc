// The job's key (handshake.h): MWMS_AUTH_KEY or MWMS_AUTH_KEY_FILE, read once, never logged.
#include <openssl/crypto.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>

#include "bootstrap/handshake.h"
#include "common/env.h"
#include "common/logging.h"
#include "mwms/errors.h"

namespace mwms::bootstrap {

AuthKey::~AuthKey() {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
}

namespace {

AuthKey load_auth_key() {
  const bool inline_set = common::env_is_present("MWMS_AUTH_KEY");
  const bool file_set = common::env_is_set("MWMS_AUTH_KEY_FILE");
  if (inline_set && file_set) {
    throw InvalidArgument("both MWMS_AUTH_KEY and MWMS_AUTH_KEY_FILE are set; set only one");
  }
  if (inline_set) {
    std::string key = common::env_string("MWMS_AUTH_KEY");
    if (key.empty()) {
      throw InvalidArgument("MWMS_AUTH_KEY is set but empty: an empty key authenticates no one "
                            "(unset it to run without authentication)");
    }
    return AuthKey(std::move(key));
  }
  if (!file_set) return AuthKey();
  const std::string path = common::env_string("MWMS_AUTH_KEY_FILE");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InvalidArgument("MWMS_AUTH_KEY_FILE " + path + " cannot be read: " +
                          std::strerror(errno));
  }
  if ((st.st_mode & S_IROTH) != 0) {
    MWMS_LOG_WARN(kBoot, "MWMS_AUTH_KEY_FILE " << path << " is readable by every user (mode "
                                               << std::oct << (st.st_mode & 0777) << std::dec
                                               << "); chmod 600 it");
  }
  std::ifstream in(path, std::ios::binary);
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    throw InvalidArgument("MWMS_AUTH_KEY_FILE " + path + " cannot be read");
  }
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (!key.empty() && key.back() == '\r') key.pop_back();
  if (key.empty()) {
    throw InvalidArgument("MWMS_AUTH_KEY_FILE " + path + " holds an empty key");
  }
  return AuthKey(std::move(key));
}

}  // namespace

const AuthKey& auth_key_from_env() {
  // Read once, like every variable (docs/env.md): later changes have no effect.
  static std::once_flag once;
  static AuthKey key;
  std::call_once(once, [] { key = load_auth_key(); });
  return key;
}

}  // namespace mwms::bootstrap
