// Built when CMake found no Gloo (Debian package libgloo-dev): --compare gloo is refused with this
// explanation instead of being silently ignored.
#include "common/gloo_baseline.h"

namespace mwms::bench::gloo_baseline {

namespace {
const char* const kNoGloo =
    "this bench was built without Gloo (install Debian's libgloo-dev and re-run cmake)";
}  // namespace

bool built_with_gloo() { return false; }
std::string library_version() { return {}; }
std::string unsupported_reason(DataType, ReduceOp) { return kNoGloo; }
void connect(Communicator&, const std::string&) { throw BackendError(kNoGloo, 0); }
void prepare(void*, std::size_t, DataType, ReduceOp) { throw BackendError(kNoGloo, 0); }
void run(Algorithm) { throw BackendError(kNoGloo, 0); }
void disconnect() noexcept {}

}  // namespace mwms::bench::gloo_baseline
