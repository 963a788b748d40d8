// The peer-info exchange (DESIGN "Bootstrap"): what every rank tells every other rank before any
// link is connected. Carried in the rendezvous hello (TF_CONFIG jobs) or gathered through MPI
// (mpirun jobs) and handed to the transports, which find their peers' address blobs here.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mwms::bootstrap {

/// Bounds on what a peer may publish (the exchange is decoded from the wire).
constexpr std::size_t kMaxBlobBytes = 1024;   // one transport address (NCCL's id is 128 bytes)
constexpr std::size_t kMaxBlobs = 8;
constexpr std::size_t kMaxHostIdBytes = 512;

struct PeerInfo {
  int rank = -1;
  std::string address;    // TCP listen address "host:port" (TCP data and control links)
  std::string host_id;    // equal strings <=> same host and network namespace (local_host_id())
  int local_rank = 0;     // rank among the ranks with this host_id (assign_local_ranks)
  int local_size = 1;     // ranks with this host_id
  std::string transport;  // this rank's MWMS_TRANSPORT choice: auto, tcp, shm or mpi
  std::map<std::string, std::string> blobs;  // transport name -> opaque address (hex or text)
  std::string process;    // local_process_id() of the rank ("" when unknown): Note [dead process]
  long fd_headroom = -1;  // descriptors it may still open, -1 unknown: Note [descriptor budget]
  int online_cores = 0;   // its host's online cores as it read them, 0 unknown (ranks_exceed_cores)
};

/// Identifies this host for "may these ranks share memory": the host name, the kernel's boot id
/// and the network namespace inode (ranks in different namespaces are different hosts for the
/// library, which is what test hosts made with `ip netns` need).
std::string local_host_id();

/// This process for a same-host liveness check (Note [dead process]): "PIDNS:PID:START", the pid
/// namespace's inode, the pid and the start time (clock ticks after boot, /proc/self/stat field
/// 22), which together name one process even after its pid is reused; "" when /proc is unreadable.
std::string local_process_id();

/// True when the process `id` (a local_process_id() of a task with this host id) surely no longer
/// runs: /proc/PID is gone, the process is a zombie, or PID now names a process started at another
/// time. False when unsure: "" or malformed, another pid namespace than ours. Reads one /proc
/// file; never throws; thread-safe.
bool process_gone(const std::string& id) noexcept;

/// Fills local_rank/local_size of every entry from the host ids (by rank order).
void assign_local_ranks(std::vector<PeerInfo>* peers);

nlohmann::json to_json(const PeerInfo& p);
/// Decodes and bounds-checks a peer's entry; returns false (and sets *why) for anything that does
/// not fit (missing fields, wrong types, oversized strings, too many blobs). Never throws.
bool from_json(const nlohmann::json& j, PeerInfo* out, std::string* why) noexcept;

}  // namespace mwms::bootstrap
