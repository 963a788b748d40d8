// libFuzzer target: TF_CONFIG and TF1 cluster-spec text through the public resolvers. Every input
// must either resolve or raise an mwms::Error subclass; anything else (another exception, a
// crash, a sanitizer report, a hang) is a finding. The first byte picks the entry point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mwms/cluster.h"
#include "mwms/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      mwms::ResolvedCluster c = mwms::resolve_tf_config(text);
      (void)c.task_name();
    } else {
      (void)mwms::resolve_flags(data[0] % 4 == 1 ? "worker" : "chief", data[0] / 4 % 3, text);
    }
  } catch (const mwms::Error&) {
    // the contract: bad input is an mwms::Error
  }
  return 0;
}
