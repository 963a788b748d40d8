// mwms-doctor: prints what the bootstrap resolves for this process (task, rank, world size, leader,
// ring, cluster fingerprint) without starting anything, so a TF_CONFIG can be checked on each host
// before a job is launched. Exit status: 0 resolved, 2 configuration error, 1 anything else.
//
//   mwms-doctor                       # TF_CONFIG, else mpirun, torchrun, srun, else one process
//   mwms-doctor --tf_config tf.json   # a TF_CONFIG value stored in a file
//   mwms-doctor --job_name worker --task_index 1 --cluster_spec cluster.json
//   mwms-doctor check                 # and the network: DNS, this task's port, every peer
//   mwms-doctor --json                # one JSON object for scripts; "sources" lists what
//                                     # every launcher present resolved, "gpu" the build's
//                                     # CUDA/NCCL and the devices this process sees
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/descriptors.h"
#include "doctor_device.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"
#include "mwms/options.h"

namespace {

std::string read_file(const std::string& path, const std::string& flag) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int e = errno;  // what the failed open(2) said
    throw mwms::BootstrapError(flag + " " + path + ": cannot open the file: " +
                               (e != 0 ? std::strerror(e) : "unknown error"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// What every source present in the environment resolved, and the chosen one.
nlohmann::json sources_json(const mwms::EnvironmentReport& report) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& s : report.sources) {
    nlohmann::json j{{"source", s.source}, {"detail", s.detail}};
    j["world_size"] = s.world_size >= 0 ? nlohmann::json(s.world_size) : nlohmann::json();
    j["rank"] = s.world_size >= 0 || s.rank >= 0 ? nlohmann::json(s.rank) : nlohmann::json();
    j["local_rank"] = s.local_rank >= 0 ? nlohmann::json(s.local_rank) : nlohmann::json();
    if (!s.error.empty()) j["error"] = s.error;
    all.push_back(j);
  }
  return all;
}

nlohmann::json to_json(const mwms::ResolvedCluster& r) {
  return nlohmann::json{{"task_type", r.task.type},
                        {"local_rank", r.local_rank},
                        {"task_index", r.task.index},
                        {"task_id", r.task_id},
                        {"num_workers", r.num_workers},
                        {"is_chief", r.is_chief},
                        {"in_ring", r.in_ring},
                        {"ring", r.ring},
                        {"source", mwms::source_name(r.source)},
                        {"fingerprint", r.cluster.fingerprint()}};
}

void print_human(const mwms::ResolvedCluster& r) {
  std::cout << "source:      " << mwms::source_name(r.source) << " (" << r.source_detail << ")\n";
  std::cout << "task:        " << r.task_name() << "\n";
  const bool ps_task = r.task.type == "ps";
  if (ps_task) {
    std::cout << "role:        parameter server: holds variable shards and serves the workers' "
                 "pulls and pushes (train --job_name ps, docs/parameter_server.md); outside the "
                 "all-reduce ring\n";
    std::cout << "address:     " << r.cluster.task_address("ps", r.task.index)
              << "  <- this process\n";
  } else if (!r.in_ring) {
    std::cout << "role:        evaluator: outside the training ring, its own world of one\n";
  } else {
    std::cout << "rank:        " << r.task_id << " of " << r.num_workers << " (world size "
              << r.num_workers << ")\n";
    std::cout << "leader:      "
              << (r.is_chief ? "yes (writes checkpoints and summaries)"
                             : "no (" + r.task_name_of_rank(0) + " leads)")
              << "\n";
  }
  if (r.source == mwms::ClusterSource::kMpi) {
    std::cout << "local rank:  " << r.local_rank << "\n";
    std::cout << "ring:        formed at start-up from the endpoints exchanged through MPI\n";
  } else if (r.source == mwms::ClusterSource::kTorchrun) {
    std::cout << "local rank:  " << r.local_rank << "\n";
    std::cout << "ring:        rank 0 listens at " << (r.ring.empty() ? "-" : r.ring[0])
              << "; the other ranks announce their addresses there at start-up\n";
  } else if (r.ring.empty()) {
    std::cout << "ring:        none (a single process)\n";
  } else {
    std::cout << "ring:\n";
    for (std::size_t i = 0; i < r.ring.size(); ++i) {
      int rank = static_cast<int>(i);
      // A ps task lists the training ring it serves (its own address is printed above).
      std::string name = r.in_ring || ps_task ? r.task_name_of_rank(rank) : r.task_name();
      bool self = r.in_ring ? rank == r.task_id : !ps_task;
      std::cout << "  rank " << rank << "  " << name << "  " << r.ring[i]
                << (self ? "  <- this process" : "") << "\n";
    }
  }
  for (const auto& [job, addresses] : r.cluster.jobs()) {
    if (job == "ps") {
      std::cout << "note:        " << addresses.size()
                << " ps task(s): a parameter-server job (train runs it in ps mode, "
                   "docs/parameter_server.md); an all-reduce strategy leaves them out\n";
    }
  }
  std::cout << "cluster:     " << r.cluster.canonical_json() << "\n";
  std::cout << "fingerprint: " << r.cluster.fingerprint() << " (must match on every task)\n";
}

// "gpu:" line: the build's CUDA/NCCL and the devices this process sees (doctor_device.h).
std::string gpu_line(const mwms::tools::DeviceReport& d) {
  if (!d.cuda_built) return d.error;
  std::string line = d.runtime + (d.nccl_built ? ", NCCL backend" : ", no NCCL backend") + "; ";
  if (d.devices < 0) return line + d.error;
  return line + std::to_string(d.devices) + " device(s) visible" +
         (d.devices == 0 ? " (CUDA_VISIBLE_DEVICES, or no GPU)" : "");
}

nlohmann::json gpu_json(const mwms::tools::DeviceReport& d) {
  nlohmann::json j{{"cuda", d.cuda_built}, {"nccl", d.nccl_built}};
  j["devices"] = d.devices >= 0 ? nlohmann::json(d.devices) : nlohmann::json();
  if (!d.runtime.empty()) j["runtime"] = d.runtime;
  if (!d.error.empty()) j["error"] = d.error;
  return j;
}

// Note [doctor output is total]: the doctor is run on broken configurations, so its JSON must
// always serialise: strings are dumped with error_handler_t::replace (an invalid UTF-8 byte becomes
// U+FFFD instead of nlohmann's type_error.316, which used to escape the catch and abort).
std::string dump(const nlohmann::json& doc) {
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- mwms-doctor check (Note [doctor check]) ----
//
// Note [doctor check]: what can be checked on one host before a job starts, each finding with
// its plain cause and fix: every task's host resolves (DNS or /etc/hosts); this task's address
// belongs to this machine (else: a wrong task index, a host name that resolves elsewhere, or a
// container without host networking) and its port is free (else: a previous job still running);
// every peer answers a TCP connect within --timeout (refused is normal before the job starts,
// silence is a firewall or a host that is down). Connects are non-blocking with a deadline.

struct Finding {
  std::string severity;  // "ok", "info", "warning", "error"
  std::string what;
  std::string cause;
  std::string fix;
};

std::pair<std::string, std::string> split_address(const std::string& a) {
  const std::size_t colon = a.rfind(':');
  std::string host = a.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, colon == std::string::npos ? "" : a.substr(colon + 1)};
}

// Resolves host:port to socket addresses; empty and *error set when it does not resolve.
std::vector<sockaddr_storage> resolve(const std::string& host, const std::string& port,
                                      std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<sockaddr_storage> out;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *error = ::gai_strerror(rc);
    return out;
  }
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    out.push_back(ss);
  }
  ::freeaddrinfo(res);
  return out;
}

socklen_t length_of(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// 0 when `ss` can be bound (port free, address local), else errno.
int try_bind(const sockaddr_storage& ss) {
  int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&ss), length_of(ss)) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

// 0 connected; ETIMEDOUT no answer within `seconds`; else the connect error.
int try_connect(const sockaddr_storage& ss, double seconds) {
  int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&ss), length_of(ss));
  if (rc == 0) {
    ::close(fd);
    return 0;
  }
  if (errno != EINPROGRESS) {
    const int e = errno;
    ::close(fd);
    return e;
  }
  pollfd p{fd, POLLOUT, 0};
  rc = ::poll(&p, 1, static_cast<int>(seconds * 1000));
  int err = ETIMEDOUT;
  if (rc > 0) {
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  }
  ::close(fd);
  return err;
}

bool in_container() {
  return ::access("/.dockerenv", F_OK) == 0 || ::access("/run/.containerenv", F_OK) == 0;
}

Finding descriptor_finding(const mwms::ResolvedCluster& r);

std::vector<Finding> check_cluster(const mwms::ResolvedCluster& r, double timeout) {
  std::vector<Finding> out;
  if (r.ring.empty() || !r.in_ring || r.source == mwms::ClusterSource::kMpi) {
    const char* why = r.ring.empty()         ? "a single process"
                      : r.task.type == "ps" ? "a ps task (outside the ring)"
                      : !r.in_ring          ? "an evaluator"
                                            : "mpirun exchanges the addresses at start-up";
    out.push_back({"info", std::string("nothing to check: ") + why, "", ""});
    return out;
  }
  if (r.task_id >= 0 && r.task_id < static_cast<int>(r.ring.size())) {
    out.push_back(descriptor_finding(r));
  }
  for (std::size_t i = 0; i < r.ring.size(); ++i) {
    const int rank = static_cast<int>(i);
    const std::string name = r.task_name_of_rank(rank) + " (" + r.ring[i] + ")";
    const auto [host, port] = split_address(r.ring[i]);
    std::string error;
    const auto addrs = resolve(host, port, &error);
    if (addrs.empty()) {
      out.push_back({"error", name + ": host " + host + " does not resolve (" + error + ")",
                     "a typo, or a name only some hosts know (DNS or /etc/hosts)",
                     "use the name every host resolves, or the host's IP address"});
      continue;
    }
    if (rank == r.task_id) {
      const int e = try_bind(addrs.front());
      if (e == 0) {
        out.push_back({"ok", name + ": this task's address is on this machine and port " + port +
                                 " is free", "", ""});
      } else if (e == EADDRINUSE) {
        out.push_back({"error", name + ": port " + port + " is already in use on this machine",
                       "another process listens there: a previous job still running, or "
                       "another service",
                       "stop it (ss -ltnp 'sport = :" + port + "' shows who), or give this task "
                       "another port in TF_CONFIG on every host"});
      } else if (e == EADDRNOTAVAIL) {
        out.push_back({"error", name + ": " + host + " is not an address of this machine",
                       std::string("this process was started with the wrong task index (it is "
                                   "listed as another host's task), or ") + host +
                           " resolves to another machine" +
                           (in_container() ? ", or this container has no host networking "
                                             "(its address is not the host's)" : ""),
                       "check task.index on this host against the cluster list" +
                           std::string(in_container() ? "; run the container with --network host "
                                                        "or list the container's own address"
                                                      : "")});
      } else {
        out.push_back({"warning", name + ": cannot bind " + r.ring[i] + ": " + std::strerror(e),
                       "", "run mwms-doctor as the user the job runs as"});
      }
      continue;
    }
    const int e = try_connect(addrs.front(), timeout);
    if (e == 0) {
      out.push_back({"info", name + ": something already listens there",
                     "the job is running there, or another program holds that port",
                     "nothing, if that task is already started"});
    } else if (e == ECONNREFUSED) {
      out.push_back({"ok", name + ": reachable (nothing listens yet, as expected before the job "
                               "starts)", "", ""});
    } else if (e == ETIMEDOUT) {
      std::ostringstream t;
      t << timeout;
      out.push_back({"warning", name + ": no answer within " + t.str() + " s",
                     "a firewall or security group drops the packets, or the host is down",
                     "open the job's ports between the hosts (TCP), or start that host"});
    } else {
      out.push_back({"error", name + ": cannot connect: " + std::strerror(e),
                     "no route to that host from here", "check the network between the hosts"});
    }
  }
  return out;
}

// Note [descriptor budget] (common/descriptors.cc): this task's need against `ulimit -n`. The
// exchange is not run here, so a peer counts as shared memory when its address names this task's
// host and the transport allows it, as TCP otherwise (the library's own check, after the
// exchange, is exact).
Finding descriptor_finding(const mwms::ResolvedCluster& r) {
  const char* t = std::getenv("MWMS_TRANSPORT");
  const std::string transport = t != nullptr && *t != '\0' ? t : "auto";
  const char* ns = std::getenv("MWMS_NSOCKS_PERPEER");
  mwms::common::DescriptorBudget b;
  b.world_size = static_cast<int>(r.ring.size());
  b.streams_per_peer = ns != nullptr && std::atoi(ns) > 0 ? std::atoi(ns) : 1;
  const std::string mine = split_address(r.ring[static_cast<std::size_t>(r.task_id)]).first;
  for (std::size_t i = 0; i < r.ring.size(); ++i) {
    if (static_cast<int>(i) == r.task_id || transport == "mpi") continue;
    const bool here = split_address(r.ring[i]).first == mine;
    (transport == "shm" || (transport == "auto" && here) ? b.shm_peers : b.tcp_peers) += 1;
  }
  const long limit = mwms::common::descriptor_limit();
  const long open = mwms::common::open_descriptors();
  const std::string need = std::to_string(b.total()) + " (" + b.describe() + ")";
  if (limit < 0) {
    return {"ok", "file descriptors: no limit (ulimit -n unlimited); this task needs about " + need,
            "", ""};
  }
  const std::string have = "limit " + std::to_string(limit) + " (ulimit -n), " +
                           std::to_string(open) + " open in mwms-doctor";
  if (limit - open < b.total()) {
    return {"error",
            "file descriptors: " + have + ", but this task needs about " + need + " more",
            "the soft limit of this shell, container or service is below what the world size, "
            "transport and MWMS_NSOCKS_PERPEER need",
            "raise it (ulimit -n " + std::to_string(open + b.total() + 64) +
                ", systemd LimitNOFILE, docker --ulimit nofile) or lower MWMS_NSOCKS_PERPEER"};
  }
  return {"ok", "file descriptors: " + have + "; this task needs about " + need +
                    " beside the program's own", "", ""};
}

void print_error(bool json, const char* what, const char* kind) {
  std::cerr << "mwms-doctor: " << kind << ": " << what << std::endl;
  if (json) std::cout << dump(nlohmann::json{{"error", what}}) << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mwms-doctor: shows what libmwms resolves from TF_CONFIG, mpirun or flags"};
  std::string tf_config_file;
  std::string job_name;
  int task_index = 0;
  std::string cluster_spec_file;
  bool json = false;
  auto* tf_opt = app.add_option("--tf_config", tf_config_file,
                                "file holding a TF_CONFIG value (instead of the environment)");
  auto* job_opt = app.add_option("--job_name", job_name, "TF1-style job name (chief, worker, ...)");
  auto* index_opt = app.add_option("--task_index", task_index, "TF1-style task index");
  auto* spec_opt =
      app.add_option("--cluster_spec", cluster_spec_file,
                     "file holding a cluster spec JSON (job map or {\"cluster\":...})");
  app.add_flag("--json", json, "print one JSON object instead of a summary");
  job_opt->needs(index_opt)->needs(spec_opt);
  index_opt->needs(job_opt);
  spec_opt->needs(job_opt);
  tf_opt->excludes(job_opt)->excludes(index_opt)->excludes(spec_opt);
  double check_timeout = 2;
  CLI::App* check = app.add_subcommand(
      "check", "also check the network: every host resolves, this task's address is local and "
               "its port free, every peer answers a TCP connect (findings with cause and fix; "
               "exit 2 on an error finding)");
  check->fallthrough();
  check->add_option("--timeout", check_timeout, "seconds to wait for each peer's answer")
      ->capture_default_str()->check(CLI::Range(0.01, 60.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A usage error is a configuration error too: exit 2 (0 or 2 on every input), and --json
    // callers get a JSON object.
    print_error(json, e.what(), "usage error");
    std::cerr << "Run with --help for usage." << std::endl;
    return 2;
  }

  mwms::EnvironmentReport report;
  bool from_environment = false;
  // Values libmwms would refuse when it reads them (an error finding: exit 2), and MWMS_ names
  // it does not know (a warning: a typo is ignored).
  const mwms::EnvironmentCheck env_check = mwms::check_environment_variables();
  const std::vector<std::string>& env_errors = env_check.errors;
  const std::vector<std::string>& env_unknown = env_check.unknown;
  try {
    mwms::ResolvedCluster resolved;
    if (!tf_config_file.empty()) {
      std::string where = "--tf_config " + tf_config_file;
      resolved = mwms::resolve_tf_config(read_file(tf_config_file, "--tf_config"), where);
    } else if (*job_opt) {
      resolved =
          mwms::resolve_flags(job_name, task_index, read_file(cluster_spec_file, "--cluster_spec"));
      resolved.source_detail += " (" + cluster_spec_file + ")";
    } else {
      report = mwms::inspect_environment();
      from_environment = true;
      resolved = mwms::resolve_from_environment();
    }
    std::vector<Finding> findings;
    if (check->parsed()) findings = check_cluster(resolved, check_timeout);
    const bool any_error =
        !env_errors.empty() || std::any_of(findings.begin(), findings.end(),
                                           [](const Finding& f) { return f.severity == "error"; });
    if (json) {
      nlohmann::json out = to_json(resolved);
      out["gpu"] = gpu_json(mwms::tools::probe_devices());
      if (from_environment) out["sources"] = sources_json(report);
      out["env"] = {{"errors", env_errors}, {"unknown", env_unknown}};
      if (check->parsed()) {
        nlohmann::json list = nlohmann::json::array();
        for (const Finding& f : findings) {
          list.push_back({{"severity", f.severity}, {"what", f.what}, {"cause", f.cause},
                          {"fix", f.fix}});
        }
        out["check"] = list;
      }
      std::cout << dump(out) << std::endl;
      return any_error ? 2 : 0;
    } else {
      print_human(resolved);
      std::cout << "gpu:         " << gpu_line(mwms::tools::probe_devices()) << "\n";
      for (const std::string& e : env_errors) std::cout << "env:         error: " << e << "\n";
      for (const std::string& u : env_unknown) {
        std::cout << "env:         warning: unknown variable " << u << " is ignored (docs/env.md)\n";
      }
      for (const auto& s : report.sources) {
        std::cout << "present:     " << s.source << " (" << s.detail << "): world size "
                  << (s.world_size >= 0 ? std::to_string(s.world_size) : std::string("?"))
                  << ", rank " << s.rank << ", local rank " << s.local_rank << "\n";
      }
      if (check->parsed()) {
        std::cout << "check:\n";
        for (const Finding& f : findings) {
          std::cout << "  [" << f.severity << "] " << f.what << "\n";
          if (!f.cause.empty()) std::cout << "      cause: " << f.cause << "\n";
          if (!f.fix.empty()) std::cout << "      fix:   " << f.fix << "\n";
        }
        std::cout << "  compare the fingerprint " << resolved.cluster.fingerprint()
                  << " across hosts: every task must print the same\n";
      }
    }
    return any_error ? 2 : 0;
  } catch (const mwms::Error& e) {
    std::cerr << "mwms-doctor: error: " << e.what() << std::endl;
    for (const std::string& x : env_errors) std::cerr << "mwms-doctor: env error: " << x << "\n";
    if (json) {
      nlohmann::json out{{"error", e.what()}};
      out["env"] = {{"errors", env_errors}, {"unknown", env_unknown}};
      if (from_environment) {
        out["sources"] = sources_json(report);
        out["source"] = report.chosen;
      }
      std::cout << dump(out) << std::endl;  // replaces bytes that are not UTF-8
    } else if (from_environment) {
      for (const auto& s : report.sources) {
        if (!s.error.empty()) {  // a source that did not parse has no world size or rank
          std::cerr << "  present: " << s.source
                    << (s.error == e.what() ? std::string(": the error above")
                                            : ": error: " + s.error);
        } else {
          std::cerr << "  present: " << s.source << " world size "
                    << (s.world_size >= 0 ? std::to_string(s.world_size) : std::string("?"))
                    << ", rank " << s.rank;
        }
        std::cerr << "\n";
      }
    }
    return 2;
  } catch (const std::exception& e) {
    print_error(json, e.what(), "unexpected failure");
    return 1;
  } catch (...) {
    print_error(json, "unknown exception", "unexpected failure");
    return 1;
  }
}
