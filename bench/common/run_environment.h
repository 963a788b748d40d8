// What this process's environment says about the run being measured: the variables that force or
// tune what the bench times (for the header and the JSON), and whether glibc is set up to let
// Open MPI run at its best (--compare mpi). Rank 0 reports its own environment: the library
// requires the forcing variables to be the same on every rank, and mpirun -x passes the glibc ones
// to every rank.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mwms::bench {

/// Looks a variable up by name: its value, or nullptr when unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

/// One variable set in the environment, as the environment holds it.
struct EnvSetting {
  std::string name;
  std::string value;
};

/// Which engine the variables are for.
enum class EnvScope {
  kHost,    ///< libmwms's own engine (host buffers): MWMS_* variables
  kDevice,  ///< --backend nccl: NCCL's own variables (libmwms's engine knobs do not apply)
};

/// The variables set (non-empty) in the environment that force what the bench measures (host:
/// MWMS_ALGO, MWMS_TRANSPORT, MWMS_SHM_DISABLE; device: NCCL_ALGO, NCCL_PROTO and the NCCL
/// transport switches) or tune it (host: MWMS_SMALL_MESSAGE_BYTES, MWMS_CHUNK_BYTES,
/// MWMS_NSOCKS_PERPEER, MWMS_SHM_RING_BYTES, MWMS_SOCKET_BUFFER_BYTES, MWMS_SPIN_MICROSECONDS,
/// MWMS_BYTES_PER_PACK), in that fixed order (Note [measured environment] in
/// run_environment.cc). Values are quoted as set, not validated: the library validates its own.
/// Never throws (but std::bad_alloc); thread-safe if `lookup` is.
std::vector<EnvSetting> measured_environment(EnvScope scope, const EnvLookup& lookup);

/// The same from this process's environment (std::getenv). Not safe against a concurrent setenv.
std::vector<EnvSetting> measured_environment(EnvScope scope);

/// The header's text for `settings`: "MWMS_ALGO=ring MWMS_TRANSPORT=tcp", with
/// " (overridden by --backend X)" after MWMS_TRANSPORT when `backend_flag` (the --backend value,
/// empty when absent) is set, since the flag wins; "none (library defaults)" when empty.
std::string describe_environment(const std::vector<EnvSetting>& settings,
                                 const std::string& backend_flag);

/// What keeps glibc from letting Open MPI run at its best here, one reason per variable not set
/// as recommended ("MALLOC_MMAP_MAX_ is not 0", "MALLOC_TRIM_THRESHOLD_ is not -1"; unset counts
/// as not set); empty when both are (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1). Never throws
/// (but std::bad_alloc); thread-safe if `lookup` is.
std::vector<std::string> malloc_not_as_recommended(const EnvLookup& lookup);

/// The same from this process's environment (std::getenv).
std::vector<std::string> malloc_not_as_recommended();

}  // namespace mwms::bench
