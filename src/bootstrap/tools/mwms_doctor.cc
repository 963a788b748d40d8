// mwms-doctor: prints what the bootstrap resolves for this process (task, rank, world size, leader,
// ring, cluster fingerprint) without starting anything, so a TF_CONFIG can be checked on each host
// before a job is launched. Exit status: 0 resolved, 2 configuration error, 1 anything else.
//
//   mwms-doctor                       # TF_CONFIG, else mpirun, torchrun, srun, else one process
//   mwms-doctor --tf_config tf.json   # a TF_CONFIG value stored in a file
//   mwms-doctor --job_name worker --task_index 1 --cluster_spec cluster.json
//   mwms-doctor --json                # one JSON object for scripts; "sources" lists what
//                                     # every launcher present resolved
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "mwms/cluster.h"
#include "mwms/errors.h"

namespace {

std::string read_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mwms::BootstrapError(flag + " " + path + ": cannot open the file");
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
  if (!r.in_ring) {
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
      std::string name = r.in_ring ? r.task_name_of_rank(rank) : r.task_name();
      bool self = r.in_ring ? rank == r.task_id : true;
      std::cout << "  rank " << rank << "  " << name << "  " << r.ring[i]
                << (self ? "  <- this process" : "") << "\n";
    }
  }
  for (const auto& [job, addresses] : r.cluster.jobs()) {
    if (job == "ps") {
      std::cout << "note:        " << addresses.size()
                << " ps task(s) in the cluster are not used by an all-reduce strategy\n";
    }
  }
  std::cout << "cluster:     " << r.cluster.canonical_json() << "\n";
  std::cout << "fingerprint: " << r.cluster.fingerprint() << " (must match on every task)\n";
}

// Note [doctor output is total]: the doctor is run on broken configurations, so its JSON must
// always serialise: strings are dumped with error_handler_t::replace (an invalid UTF-8 byte becomes
// U+FFFD instead of nlohmann's type_error.316, which used to escape the catch and abort).
std::string dump(const nlohmann::json& doc) {
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
  CLI11_PARSE(app, argc, argv);

  mwms::EnvironmentReport report;
  bool from_environment = false;
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
    if (json) {
      nlohmann::json out = to_json(resolved);
      if (from_environment) out["sources"] = sources_json(report);
      std::cout << dump(out) << std::endl;
    } else {
      print_human(resolved);
      for (const auto& s : report.sources) {
        std::cout << "present:     " << s.source << " (" << s.detail << "): world size "
                  << (s.world_size >= 0 ? std::to_string(s.world_size) : std::string("?"))
                  << ", rank " << s.rank << ", local rank " << s.local_rank << "\n";
      }
    }
    return 0;
  } catch (const mwms::Error& e) {
    std::cerr << "mwms-doctor: error: " << e.what() << std::endl;
    if (json) {
      nlohmann::json out{{"error", e.what()}};
      if (from_environment) {
        out["sources"] = sources_json(report);
        out["source"] = report.chosen;
      }
      std::cout << dump(out) << std::endl;  // replaces bytes that are not UTF-8
    } else if (from_environment) {
      for (const auto& s : report.sources) {
        std::cerr << "  present: " << s.source << " world size "
                  << (s.world_size >= 0 ? std::to_string(s.world_size) : std::string("?"))
                  << ", rank " << s.rank << (s.error.empty() ? "" : " (error: " + s.error + ")")
                  << "\n";
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
