// What the fake API tables of the tests (fake_cuda.h, fake_nccl.h) share: the injection of one
// failing entry, and the texts of the CUDA error codes they hand out.
#pragma once

#include <string>

namespace mwms::testing {

/// One injected failure of a fake API table: after `skip` more successful calls, the entry named
/// `entry` (the table's field name: "memcpy_async", "all_reduce", ...) returns `code`, then always.
/// Not thread-safe: the fake calls it under its own mutex.
struct FakeFaults {
  std::string entry;  // empty: nothing fails
  int code = 0;
  int skip = 0;

  /// Makes `failing` return `result` after `successes` more successful calls.
  void fail(const std::string& failing, int result, int successes = 0) {
    entry = failing;
    code = result;
    skip = successes;
  }
  /// Nothing fails any more.
  void clear() { fail(std::string(), 0); }
  /// Entry `failing` succeeds again if it is the one that fails; another entry's failure stays.
  void clear(const std::string& failing) {
    if (entry == failing) clear();
  }
  /// Called by the fake at the top of entry `name`: the code it must return, or 0 (go on).
  int injected(const char* name) {
    if (entry.empty() || entry != name) return 0;
    if (skip > 0) {
      --skip;
      return 0;
    }
    return code;
  }
};

/// The fakes' cudaGetErrorString: "fake <name>: <text>" for the codes the tests use.
inline const char* fake_cuda_error_string(int code) {
  switch (code) {
    case 0: return "fake cudaSuccess: no error";
    case 1: return "fake cudaErrorInvalidValue: invalid argument";
    case 2: return "fake cudaErrorMemoryAllocation: out of memory";
    case 100: return "fake cudaErrorNoDevice: no CUDA-capable device is detected";
    case 700: return "fake cudaErrorIllegalAddress: an illegal memory access was encountered";
    default: return "fake cuda error";
  }
}

}  // namespace mwms::testing
