// The MPI side of --compare mpi: Open MPI's collective (MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Bcast), timed in the same run as libmwms so
// that the ratio survives a noisy machine. Two implementations of this header exist and CMake
// compiles exactly one: mpi_baseline.cc (built with MPI) and mpi_baseline_none.cc (without), so
// no #if is needed anywhere in the bench.
#pragma once

#include <cstddef>
#include <string>

#include "mwms/types.h"

namespace mwms::bench::mpi {

/// True when the bench was built with MPI.
bool built_with_mpi();
/// Initialises MPI unless something already did. Call before libmwms bootstraps, so that the
/// library finds MPI initialised and leaves its life-cycle to us. `thread_multiple`: ask for
/// MPI_THREAD_MULTIPLE (the mpi transport's progress thread may call MPI while the bench times
/// MPI_Allreduce); otherwise MPI_THREAD_SERIALIZED, which keeps Open MPI's own timing lock-free.
/// @throws mwms::BackendError when MPI is not built in or MPI_Init fails.
void init(bool thread_multiple);
/// True between a successful init() and finalize().
bool active();
/// MPI_COMM_WORLD size (0 when not active).
int world_size();
/// Finalises MPI if init() initialised it. Never throws.
void finalize() noexcept;
/// Kills every rank of the job (after an error on one rank, so the others do not wait forever).
[[noreturn]] void abort_job(int status) noexcept;

/// Lets MPI move what it still owes peers (one MPI_Iprobe on MPI_COMM_WORLD): Open MPI has no
/// progress thread, so a rank that returned from MPI_Allreduce may still hold a send another rank
/// waits for, and only its next MPI call pushes it (Note [leaving mpi], driver.cc). Never blocks.
/// @throws mwms::BackendError on an MPI error.
void progress();

/// First line of MPI_Get_library_version ("Open MPI v4.1.4, package: ..."); empty without MPI.
std::string library_version();

/// Empty when MPI can run `dtype`/`op`, otherwise why not (MPI has no float16 type).
std::string unsupported_reason(DataType dtype, ReduceOp op);
/// In-place MPI_Allreduce (MPI_IN_PLACE) on MPI_COMM_WORLD. kMean runs as MPI_SUM: MPI has no
/// mean, and the division is a local pass that does not change the comparison.
/// @throws mwms::BackendError on an MPI error, InvalidArgument when count exceeds INT_MAX.
void all_reduce(void* buffer, std::size_t count, DataType dtype, ReduceOp op);
/// In-place MPI_Allgather: `buffer` holds world_size() * count elements, this rank's block in place.
/// @throws as all_reduce.
void all_gather(void* buffer, std::size_t count, DataType dtype);
/// In-place MPI_Reduce_scatter_block: `buffer` holds world_size() * count elements of input; the
/// result (count elements) lands at its start, MPI's in-place convention. kMean runs as MPI_SUM.
/// @throws as all_reduce.
void reduce_scatter(void* buffer, std::size_t count, DataType dtype, ReduceOp op);
/// MPI_Bcast of `count` elements from `root`. @throws as all_reduce.
void broadcast(void* buffer, std::size_t count, DataType dtype, int root);

}  // namespace mwms::bench::mpi
