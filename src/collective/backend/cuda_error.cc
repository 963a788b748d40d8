// cuda_error(): the one conversion of a cudaError_t (cuda_api.h), built in every build.
#include "collective/backend/cuda_api.h"

namespace mwms::collective {

std::exception_ptr cuda_error(int code, const char* text, const std::string& call,
                              ErrorContext ctx) noexcept {
  try {
    return std::make_exception_ptr(
        BackendError(call + " failed: CUDA error " + std::to_string(code) + " (" +
                         (text != nullptr ? text : "") + ")",
                     code, std::move(ctx)));
  } catch (...) {
    return std::current_exception();  // std::bad_alloc
  }
}

}  // namespace mwms::collective
