#include "mwms/errors.h"

#include <sstream>

namespace mwms {

std::string ErrorContext::to_string() const {
  std::ostringstream out;
  const char* sep = "";
  auto field = [&](const std::string& text) {
    out << sep << text;
    sep = ", ";
  };
  if (rank >= 0) {
    std::string self = "rank " + std::to_string(rank);
    if (world_size > 0) self += "/" + std::to_string(world_size);
    if (!task.empty()) self += " (" + task + ")";
    field(self);
  }
  if (peer_rank >= 0 || !peer_address.empty() || !peer_task.empty()) {
    std::string peer = "peer";
    if (peer_rank >= 0) peer += " rank " + std::to_string(peer_rank);
    std::string detail = peer_task;
    if (!peer_address.empty()) detail += (detail.empty() ? "" : " at ") + peer_address;
    if (!detail.empty()) peer += " (" + detail + ")";
    field(peer);
  }
  if (!op.empty()) field("op " + op);
  if (seq >= 0) field("seq " + std::to_string(seq));
  if (!transport.empty()) field("transport " + transport);
  if (bytes >= 0) field("bytes " + std::to_string(bytes));
  if (elapsed_seconds >= 0) {
    std::ostringstream t;
    t.precision(3);
    t << std::fixed << "elapsed " << elapsed_seconds << " s";
    if (timeout_seconds > 0) t << " of " << timeout_seconds << " s";
    field(t.str());
  } else if (timeout_seconds > 0) {
    std::ostringstream t;
    t << "timeout " << timeout_seconds << " s";
    field(t.str());
  }
  return out.str();
}

namespace {
std::string render(const std::string& message, const ErrorContext& context) {
  std::string ctx = context.to_string();
  return ctx.empty() ? message : message + " [" + ctx + "]";
}
}  // namespace

Error::Error(const std::string& message, ErrorContext context)
    : std::runtime_error(render(message, context)),
      message_(message),
      context_(std::move(context)) {}

BackendError::BackendError(const std::string& message, int native_code, ErrorContext context)
    : Error(message, std::move(context)), native_code_(native_code) {}

CheckpointError::CheckpointError(const std::string& message, std::string path,
                                 ErrorContext context)
    : Error(message, std::move(context)), path_(std::move(path)) {}

}  // namespace mwms
