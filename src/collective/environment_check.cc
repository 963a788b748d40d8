// check_environment_variables() (mwms/options.h) lives above the common layer because the values
// of MWMS_TRANSPORT are the transport table's (Note [transport table]).
#include <string>

#include "collective/transport/transport.h"
#include "common/env.h"
#include "mwms/options.h"

namespace mwms {

EnvironmentCheck check_environment_variables() {
  EnvironmentCheck check;
  check.errors = common::env_problems([](const common::EnvVarInfo& var, const std::string& value) {
    if (std::string(var.name) != "MWMS_TRANSPORT") return std::string();
    try {
      collective::check_transport_choice(value);
    } catch (const InvalidArgument& e) {
      return e.message();
    }
    return std::string();
  });
  check.unknown = common::unknown_env_vars();
  return check;
}

}  // namespace mwms
