#include <mpi.h>

#include <climits>
#include <cstdlib>

#include "common/mpi_baseline.h"
#include "mwms/errors.h"

namespace mwms::bench::mpi {

namespace {

bool g_initialised_here = false;
bool g_active = false;

void throw_if_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw BackendError(std::string(what) + " failed: " + std::string(text, length), rc);
}

MPI_Datatype to_mpi(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16:
    case DataType::kBFloat16: break;
  }
  return MPI_DATATYPE_NULL;
}

// MPI counts are int; a larger count is refused rather than truncated.
int to_mpi_count(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument(std::string(what) + " takes an int count; " + std::to_string(count) +
                          " elements is too many");
  }
  return static_cast<int>(count);
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProd: return MPI_PROD;
  }
  return MPI_OP_NULL;
}

}  // namespace

bool built_with_mpi() { return true; }

void init(bool thread_multiple) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    // SERIALIZED: libmwms may bootstrap through MPI from another thread than main, never
    // concurrently with our MPI_Allreduce calls -- unless its links are MPI's too (multiple).
    int provided = 0;
    throw_if_mpi(MPI_Init_thread(nullptr, nullptr,
                                 thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED,
                                 &provided),
                 "MPI_Init_thread");
    g_initialised_here = true;
  }
  g_active = true;
}

bool active() { return g_active; }

int world_size() {
  if (!g_active) return 0;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void finalize() noexcept {
  if (g_initialised_here) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }
  g_active = false;
  g_initialised_here = false;
}

void abort_job(int status) noexcept {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return {};
  std::string version(text, static_cast<std::size_t>(length));
  const std::size_t end = version.find_first_of("\r\n");
  if (end != std::string::npos) version.resize(end);
  while (!version.empty() && (version.back() == ' ' || version.back() == '\0')) version.pop_back();
  return version;
}

std::string unsupported_reason(DataType dtype, ReduceOp op) {
  if (to_mpi(dtype) == MPI_DATATYPE_NULL) {
    return "MPI has no " + std::string(to_string(dtype)) +
           " datatype; use -d float32, float64, int32 or int64 with --compare mpi";
  }
  if (to_mpi(op) == MPI_OP_NULL) return "MPI has no " + std::string(to_string(op)) + " operator";
  return {};
}

void progress() {
  int flag = 0;
  throw_if_mpi(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE),
               "MPI_Iprobe");
}

void all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op) {
  const int n = to_mpi_count(count, "MPI_Allreduce");
  throw_if_mpi(MPI_Allreduce(MPI_IN_PLACE, buffer, n, to_mpi(dtype), to_mpi(op), MPI_COMM_WORLD),
               "MPI_Allreduce");
}

void all_gather(void* buffer, std::size_t count, DataType dtype) {
  // With MPI_IN_PLACE the send count and type are ignored (passed valid all the same); this
  // rank's block is already in place.
  const int n = to_mpi_count(count, "MPI_Allgather");
  throw_if_mpi(MPI_Allgather(MPI_IN_PLACE, n, to_mpi(dtype), buffer, n, to_mpi(dtype),
                             MPI_COMM_WORLD),
               "MPI_Allgather");
}

void reduce_scatter(void* buffer, std::size_t count, DataType dtype, ReduceOp op) {
  const int n = to_mpi_count(count, "MPI_Reduce_scatter_block");
  throw_if_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, buffer, n, to_mpi(dtype), to_mpi(op),
                                        MPI_COMM_WORLD),
               "MPI_Reduce_scatter_block");
}

void broadcast(void* buffer, std::size_t count, DataType dtype, int root) {
  const int n = to_mpi_count(count, "MPI_Bcast");
  throw_if_mpi(MPI_Bcast(buffer, n, to_mpi(dtype), root, MPI_COMM_WORLD), "MPI_Bcast");
}

}  // namespace mwms::bench::mpi
