// device_bench.h in a build without NCCL: --backend nccl is refused before anything starts
// (driver.cc and bucket_perf.cc check built_with_nccl()); the entry points only throw.
#include "common/device_bench.h"
#include "mwms/errors.h"

namespace mwms::bench::device {
namespace {

[[noreturn]] void refuse() {
  throw InvalidUsage(
      "--backend nccl: this bench was built without NCCL (libmwms MWMS_HAVE_NCCL 0; configure "
      "with -DMWMS_WITH_CUDA=ON and NCCL installed)");
}

}  // namespace

bool built_with_nccl() { return false; }
std::string no_device_reason() { return "this build has no NCCL"; }
std::string nccl_version() { return ""; }
int run_sweep(const CollectiveDescriptor&, const BenchOptions&) { refuse(); }
BucketRow run_buckets(const std::vector<std::size_t>&, const BucketOptions&, BucketRunInfo*,
                      bool*) {
  refuse();
}

}  // namespace mwms::bench::device
