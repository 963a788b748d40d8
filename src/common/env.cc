#include "common/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "mwms/errors.h"
#include "mwms/options.h"

extern char** environ;

namespace mwms::common {

const std::vector<EnvVarInfo>& env_registry() {
  static const std::vector<EnvVarInfo> registry = {
      {"MWMS_LOG_LEVEL", EnvType::kEnum, "warn", "off|error|warn|info|debug|trace",
       "Logging threshold. info prints the resolved cluster, the ring and every MWMS_ variable."},
      {"MWMS_LOG_SUBSYS", EnvType::kString, "INIT,BOOT,ENV,RING",
       "INIT,BOOT,RING,NET,COLL,KERNEL,STRAT,ENV,ALLOC or ALL",
       "Comma list of subsystems to log; a leading ^ inverts the list."},
      {"MWMS_LOG_FILE", EnvType::kString, "", "path with %h %p %r",
       "Write logs to this file instead of stderr (%h host, %p pid, %r rank)."},
      {"MWMS_TIMEOUT_SECONDS", EnvType::kDouble, "300", "> 0",
       "Deadline of every collective wait when CommunicationOptions.timeout_seconds is not set."},
      {"MWMS_CONNECT_TIMEOUT_SECONDS", EnvType::kDouble, "60", "> 0",
       "How long the rendezvous retries to reach peers before failing."},
      {"MWMS_CHUNK_BYTES", EnvType::kInt, "262144", ">= 4096",
       "Pipeline chunk of the ring algorithms, in bytes; when set, also the MPI transport's "
       "payload pieces (default 4 MiB)."},
      {"MWMS_SMALL_MESSAGE_BYTES", EnvType::kInt, "65536", ">= 0",
       "All-reduces up to this size use recursive doubling (log2 n steps); larger ones "
       "Rabenseifner's algorithm or the ring."},
      {"MWMS_STREAMING_COPY_MIN_BYTES", EnvType::kInt, "-1", ">= -1",
       "Shared-memory receives that land at least this many bytes per collective are written "
       "with non-temporal stores; -1: this CPU's last-level cache size; 0: never."},
      {"MWMS_BYTES_PER_PACK", EnvType::kInt, "4194304", ">= 0",
       "Default gradient bucket size of the strategy, in bytes."},
      {"MWMS_SPIN_MICROSECONDS", EnvType::kInt, "50", ">= 0",
       "How long a wait polls without blocking before sleeping in poll(2) or on a futex; "
       "unset, a parameter-server job polls 1000."},
      // Its values are the transport table's (collective/transport/transport.h), checked there.
      {"MWMS_TRANSPORT", EnvType::kString, "auto", "auto or a transport's name",
       "Transport of the engine's links: auto (shared memory on one host, TCP across hosts), "
       "tcp, shm or mpi (under mpirun). Must be the same on every rank."},
      {"MWMS_PS_SHARED_VALUES", EnvType::kEnum, "1", "0|1",
       "Synchronous parameter-server jobs: 1, a ps keeps its values in shared memory that its "
       "workers on the same host copy from directly; 0, it sends them through each link."},
      {"MWMS_SHM_DISABLE", EnvType::kEnum, "0", "0|1",
       "1: no shared memory; ranks on one host talk over TCP (MWMS_TRANSPORT=auto)."},
      {"MWMS_SHM_RING_BYTES", EnvType::kInt, "0", ">= 0",
       "Capacity of each shared-memory ring, in bytes (rounded up to 4096); 0: 4 x "
       "MWMS_CHUNK_BYTES."},
      {"MWMS_NSOCKS_PERPEER", EnvType::kInt, "1", "1-16",
       "TCP streams per peer pair; payloads are striped across them in MWMS_CHUNK_BYTES pieces."},
      {"MWMS_SOCKET_BUFFER_BYTES", EnvType::kInt, "0", "0-1073741824",
       "Send and receive buffer of each TCP data socket; 0 leaves them to kernel autotuning."},
      {"MWMS_TRACE_FILE", EnvType::kString, "", "a path; %r becomes the rank",
       "Writes a Chrome trace (chrome://tracing, Perfetto) of every collective of each rank."},
      {"MWMS_TRACE_BUFFER", EnvType::kInt, "0", "0-1000000",
       "Keeps the last K collectives of each rank and logs them when a collective fails."},
      {"MWMS_STALL_WARN_SECONDS", EnvType::kDouble, "30", ">= 0; unset: min(30, timeout / 4)",
       "A collective waiting this long without progress logs a warning naming the rank it waits "
       "for, once per interval; 0: never."},
      {"MWMS_HEARTBEAT_SECONDS", EnvType::kDouble, "5", ">= 0",
       "Heartbeat interval on the control links; a peer silent for 4 intervals is lost and the "
       "next collective fails naming it; 0: off."},
      {"MWMS_ALGO", EnvType::kString, "auto", "auto|ring|gather|rd|rhd|hier|flat",
       "Forces one algorithm for every collective it applies to; a name that does not apply "
       "to a call is an error. CommunicatorOptions::algorithm overrides it."},
      {"MWMS_SOCKET_IFNAME", EnvType::kString, "",
       "NCCL_SOCKET_IFNAME syntax: eth,ib ^docker =eth0",
       "Interface whose address a task advertises when the launcher names none (mpirun, torchrun "
       "ranks other than 0); empty: the route toward the leader."},
      {"MWMS_AUTH_KEY", EnvType::kString, "", "any non-empty bytes (never logged)",
       "Shared secret: every connection runs an HMAC-SHA256 challenge-response with it "
       "(docs/security.md). Must be the same on every rank."},
      {"MWMS_AUTH_KEY_FILE", EnvType::kString, "", "path of a file holding the key",
       "Reads the key from this file (one trailing newline stripped) instead of MWMS_AUTH_KEY."},
      {"MWMS_SLURM_PORT_BASE", EnvType::kInt, "8888", "1..65535",
       "Under srun: task t of a node listens at that node's name and this port + t (its local "
       "id), as TF's SlurmClusterResolver (port_base 8888)."},
      {"MWMS_LISTEN_FD", EnvType::kString, "", "a descriptor number (set by mwmsrun)",
       "Listening TCP socket inherited from the launcher, adopted by the rendezvous instead of "
       "binding this task's port (Note [inherited listener])."},
  };
  return registry;
}

namespace {

const EnvVarInfo& find_var(std::string_view name) {
  for (const auto& var : env_registry()) {
    if (name == var.name) return var;
  }
  throw InternalError("environment variable " + std::string(name) + " is not in the registry");
}

// Values are read once per process; later changes to the environment are ignored on purpose.
struct Read {
  std::string value;
  bool set = false;      // present (and not empty) in the environment
  bool present = false;  // present, even empty
};

const Read& read_once(std::string_view name) {
  static std::mutex mutex;
  static std::map<std::string, Read, std::less<>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const EnvVarInfo& var = find_var(name);
  const char* raw = std::getenv(var.name);
  std::string value = (raw != nullptr && *raw != '\0') ? raw : var.default_value;
  if (var.type == EnvType::kEnum) {
    std::string allowed = std::string("|") + var.allowed + "|";
    if (allowed.find("|" + value + "|") == std::string::npos) {
      throw InvalidArgument(std::string(var.name) + "=" + value + " is not one of " + var.allowed);
    }
  }
  // std::map never moves its nodes: the reference stays valid.
  return cache
      .emplace(std::string(name), Read{value, raw != nullptr && *raw != '\0', raw != nullptr})
      .first->second;
}

}  // namespace

std::string env_string(std::string_view name) { return read_once(name).value; }

bool env_is_set(std::string_view name) { return read_once(name).set; }

bool env_is_present(std::string_view name) { return read_once(name).present; }

std::string env_value_for_log(std::string_view name) {
  const Read& read = read_once(name);
  // Secrets are shown as set or not, never by value (docs/security.md).
  if (name == "MWMS_AUTH_KEY") return read.set ? "(set, not shown)" : "";
  return read.value;
}

EnvRange env_range(const char* allowed) noexcept {
  EnvRange r;
  std::string text = allowed != nullptr ? allowed : "";
  text = text.substr(0, text.find(';'));
  while (!text.empty() && text.back() == ' ') text.pop_back();
  auto number = [](const std::string& t, double* out) {
    if (t.empty()) return false;
    char* end = nullptr;
    *out = std::strtod(t.c_str(), &end);
    return end != nullptr && *end == '\0';
  };
  if (text.rfind(">= ", 0) == 0) {
    r.has_lo = number(text.substr(3), &r.lo);
  } else if (text.rfind("> ", 0) == 0) {
    r.has_lo = r.lo_strict = number(text.substr(2), &r.lo);
    if (!r.has_lo) r.lo_strict = false;
  } else {
    for (const char* sep : {"..", "-"}) {
      const std::size_t at = text.find(sep, 1);  // a leading '-' is a sign
      if (at == std::string::npos) continue;
      double lo = 0, hi = 0;
      if (number(text.substr(0, at), &lo) && number(text.substr(at + std::strlen(sep)), &hi)) {
        r.has_lo = r.has_hi = true;
        r.lo = lo;
        r.hi = hi;
      }
      break;
    }
  }
  return r;
}

double parse_env_number(const EnvVarInfo& var, const std::string& value) {
  const std::string allowed = std::string(" (allowed: ") + var.allowed + ")";
  char* end = nullptr;
  double parsed = 0;
  if (var.type == EnvType::kInt) {
    errno = 0;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
      throw InvalidArgument(std::string(var.name) + "=" + value + " is not an integer" + allowed);
    }
    parsed = static_cast<double>(v);
  } else {
    parsed = std::strtod(value.c_str(), &end);
    if (value.empty() || end == nullptr || *end != '\0' || !std::isfinite(parsed)) {
      throw InvalidArgument(std::string(var.name) + "=" + value + " is not a number" + allowed);
    }
  }
  const EnvRange range = env_range(var.allowed);
  if (range.valid() && !range.contains(parsed)) {
    throw InvalidArgument(std::string(var.name) + "=" + value + " is out of range" + allowed);
  }
  return parsed;
}

long long env_int(std::string_view name) {
  const Read& read = read_once(name);
  const EnvVarInfo& var = find_var(name);
  parse_env_number(var, read.value);  // checks the form and the range
  return std::strtoll(read.value.c_str(), nullptr, 10);
}

double env_double(std::string_view name) {
  const Read& read = read_once(name);
  return parse_env_number(find_var(name), read.value);
}

std::vector<std::string> env_problems(
    const std::function<std::string(const EnvVarInfo& var, const std::string& value)>&
        check_string) {
  std::vector<std::string> problems;
  for (const EnvVarInfo& var : env_registry()) {
    const char* raw = std::getenv(var.name);
    if (raw == nullptr || *raw == '\0') continue;
    const std::string value = raw;
    if (var.type == EnvType::kEnum) {
      const std::string allowed = std::string("|") + var.allowed + "|";
      if (allowed.find("|" + value + "|") == std::string::npos) {
        problems.push_back(std::string(var.name) + "=" + value + " is not one of " + var.allowed);
      }
    } else if (var.type == EnvType::kString && check_string) {
      std::string problem = check_string(var, value);
      if (!problem.empty()) problems.push_back(std::move(problem));
    } else if (var.type == EnvType::kInt || var.type == EnvType::kDouble) {
      try {
        parse_env_number(var, value);
      } catch (const InvalidArgument& e) {
        problems.emplace_back(e.what());
      }
    }
  }
  return problems;
}

std::vector<std::string> unknown_env_vars() {
  std::vector<std::string> unknown;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view kv(*entry);
    if (kv.rfind("MWMS_", 0) != 0) continue;
    std::string_view name = kv.substr(0, kv.find('='));
    bool known = false;
    for (const auto& var : env_registry()) known = known || name == var.name;
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

}  // namespace mwms::common

