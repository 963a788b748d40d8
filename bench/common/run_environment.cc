// The environment of the run being measured (run_environment.h).
#include "common/run_environment.h"

#include <cstdlib>
#include <cstring>

namespace mwms::bench {
namespace {

// Note [measured environment]: a row of the table is only comparable with another when both
// were measured with the same algorithm over the same transport. MWMS_ALGO=ring or
// MWMS_TRANSPORT=tcp change both without any flag on the command line, so a run that had them
// must say so in its header and its JSON, or a table taken with MWMS_ALGO=ring left exported
// reads as what users get. The lists name the variables that force a choice first, then the ones
// that tune the chosen path; everything else the library reads (logging, timeouts, the auth key,
// the launcher's addresses) does not change what is timed and is left out. The names are the
// library's registry names (src/common/env.cc, docs/env.md); the bench, which uses only the
// public API, reads them as set in the environment and leaves their validation to the library,
// which rejects a bad value before the first row. Under --backend nccl the library's engine
// knobs do not apply and NCCL's own variables decide instead.
constexpr const char* kHostForcing[] = {"MWMS_ALGO", "MWMS_TRANSPORT", "MWMS_SHM_DISABLE"};
constexpr const char* kHostTuning[] = {"MWMS_SMALL_MESSAGE_BYTES", "MWMS_CHUNK_BYTES",
                                       "MWMS_NSOCKS_PERPEER",      "MWMS_SHM_RING_BYTES",
                                       "MWMS_SOCKET_BUFFER_BYTES", "MWMS_SPIN_MICROSECONDS",
                                       "MWMS_BYTES_PER_PACK"};
constexpr const char* kDeviceForcing[] = {"NCCL_ALGO",        "NCCL_PROTO",      "NCCL_P2P_DISABLE",
                                          "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET",
                                          "NCCL_P2P_LEVEL"};

template <std::size_t N>
void collect(const char* const (&names)[N], const EnvLookup& lookup,
             std::vector<EnvSetting>* out) {
  for (const char* name : names) {
    const char* value = lookup(name);
    if (value != nullptr && *value != '\0') out->push_back(EnvSetting{name, value});
  }
}

const char* from_process(const char* name) { return std::getenv(name); }

}  // namespace

std::vector<EnvSetting> measured_environment(EnvScope scope, const EnvLookup& lookup) {
  std::vector<EnvSetting> settings;
  if (scope == EnvScope::kDevice) {
    collect(kDeviceForcing, lookup, &settings);
  } else {
    collect(kHostForcing, lookup, &settings);
    collect(kHostTuning, lookup, &settings);
  }
  return settings;
}

std::vector<EnvSetting> measured_environment(EnvScope scope) {
  return measured_environment(scope, from_process);
}

std::string describe_environment(const std::vector<EnvSetting>& settings,
                                 const std::string& backend_flag) {
  if (settings.empty()) return "none (library defaults)";
  std::string text;
  for (const EnvSetting& s : settings) {
    if (!text.empty()) text += ' ';
    text += s.name + "=" + s.value;
    if (s.name == "MWMS_TRANSPORT" && !backend_flag.empty()) {
      text += " (overridden by --backend " + backend_flag + ")";
    }
  }
  return text;
}

std::vector<std::string> malloc_not_as_recommended(const EnvLookup& lookup) {
  // glibc needs both: MALLOC_MMAP_MAX_=0 serves large blocks from the heap instead of mmap (which
  // free returns to the kernel at once), and MALLOC_TRIM_THRESHOLD_=-1 stops free from trimming
  // the top of the heap back to the kernel (with mmap disabled the threshold no longer adapts and
  // stays at 128 KiB), so Open MPI's message-sized temporary is reused instead of re-faulted.
  std::vector<std::string> reasons;
  const char* mmap_max = lookup("MALLOC_MMAP_MAX_");
  if (mmap_max == nullptr || std::strcmp(mmap_max, "0") != 0) {
    reasons.emplace_back("MALLOC_MMAP_MAX_ is not 0");
  }
  const char* trim = lookup("MALLOC_TRIM_THRESHOLD_");
  if (trim == nullptr || std::strcmp(trim, "-1") != 0) {
    reasons.emplace_back("MALLOC_TRIM_THRESHOLD_ is not -1");
  }
  return reasons;
}

std::vector<std::string> malloc_not_as_recommended() {
  return malloc_not_as_recommended(from_process);
}

}  // namespace mwms::bench
