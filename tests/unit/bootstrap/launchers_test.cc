// The launchers' environments (launchers.h) and resolve_from_environment's precedence and conflict
// rules (Note [launcher precedence]). The readers take a map; resolve_from_environment runs in a
// forked child with a clean launcher environment, so that the test process (which may itself run
// under a launcher) keeps its own; MWMS_* values are read once per process (common/env.cc) and a
// child inherits those already read, so MWMS_SLURM_PORT_BASE is tested through mwms-doctor.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>

#include "bootstrap/launchers.h"
#include "mwms/cluster.h"
#include "mwms/errors.h"
#include "unit/bootstrap/expect_error.h"

namespace {

using Catch::Matchers::Contains;
using mwms::ClusterSource;
using mwms::test::bootstrap_error;
using Vars = std::map<std::string, std::string>;
using Ring = std::vector<std::string>;

mwms::bootstrap::EnvLookup lookup(const Vars& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() || it->second.empty() ? nullptr : it->second.c_str();
  };
}

const char* const kLauncherVars[] = {
    "TF_CONFIG", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_NODE_RANK", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMI_RANK",
    "PMI_SIZE", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
    "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURMD_NODENAME",
    "MWMS_SLURM_PORT_BASE"};

// resolve_from_environment in a forked child whose launcher variables are exactly `vars`:
// "source world rank local ring..." or "error: <what>".
std::string resolve_in_child(const Vars& vars) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    for (const char* name : kLauncherVars) ::unsetenv(name);
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
    std::string out;
    try {
      mwms::ResolvedCluster r = mwms::resolve_from_environment();
      out = std::string(mwms::source_name(r.source)) + " " + std::to_string(r.num_workers) + " " +
            std::to_string(r.task_id) + " " + std::to_string(r.local_rank);
      for (const auto& a : r.ring) out += " " + a;
    } catch (const mwms::BootstrapError& e) {
      out = std::string("error: ") + e.what();
    } catch (const std::exception& e) {
      out = std::string("other exception: ") + e.what();
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return out;
}

std::string tf_config(int workers, int index) {
  std::string list;
  for (int i = 0; i < workers; ++i) list += (i ? ",\"w" : "\"w") + std::to_string(i) + ":1\"";
  return "{\"cluster\":{\"worker\":[" + list + "]},\"task\":{\"type\":\"worker\",\"index\":" +
         std::to_string(index) + "}}";
}

Vars slurm(int procid, int ntasks, const std::string& nodes, const std::string& per_node,
           int localid) {
  return {{"SLURM_PROCID", std::to_string(procid)}, {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_STEP_NODELIST", nodes},           {"SLURM_STEP_TASKS_PER_NODE", per_node},
          {"SLURM_LOCALID", std::to_string(localid)}};
}

}  // namespace

TEST_CASE("read_slurm orders tasks as TF's SlurmClusterResolver", "[unit][bootstrap][slurm]") {
  Vars v = slurm(3, 5, "node[01-02],gpu7", "2(x2),1", 1);
  v["SLURMD_NODENAME"] = "node02";
  auto view = mwms::bootstrap::read_slurm(lookup(v), 8888);
  REQUIRE(view);
  const mwms::ResolvedCluster& r = view->resolved;
  CHECK(r.source == ClusterSource::kSlurm);
  CHECK(r.num_workers == 5);
  CHECK(r.task_id == 3);
  CHECK(r.local_rank == 1);
  CHECK_FALSE(r.is_chief);
  CHECK(r.ring == Ring{"node01:8888", "node01:8889", "node02:8888", "node02:8889", "gpu7:8888"});
  CHECK(r.cluster.num_tasks("worker") == 5);

  SECTION("the job's node list when the step's is missing") {
    v.erase("SLURM_STEP_NODELIST");
    v["SLURM_JOB_NODELIST"] = "node[01-02],gpu7";
    CHECK(mwms::bootstrap::read_slurm(lookup(v), 9000)->resolved.ring.at(4) == "gpu7:9000");
  }
  SECTION("cyclic distribution contradicts block order") {
    v["SLURM_LOCALID"] = "0";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 8888); }),
               Contains("SLURM_PROCID=3 is local task 1 of node02") &&
                   Contains("SLURM_LOCALID=0") && Contains("--distribution=block"));
  }
  SECTION("counts that do not describe SLURM_NTASKS") {
    v["SLURM_NTASKS"] = "6";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 8888); }),
               Contains("names 3 nodes") && Contains("for 5 tasks") && Contains("SLURM_NTASKS=6"));
    v["SLURM_NTASKS"] = "5";
    v["SLURM_STEP_TASKS_PER_NODE"] = "5";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 8888); }),
               Contains("gives 1 count"));
  }
  SECTION("ports past 65535") {
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 65535); }),
               Contains("node01 runs 2 tasks") && Contains("MWMS_SLURM_PORT_BASE=65535"));
  }
  SECTION("a world larger than one without a node list or counts") {
    Vars bare{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}};
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(bare), 8888); }),
               Contains("srun started 4 tasks (SLURM_NTASKS=4)") && Contains("no node list"));
    bare["SLURM_JOB_NODELIST"] = "n[1-4]";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(bare), 8888); }),
               Contains("no task counts"));
  }
  SECTION("one task needs no node list") {
    Vars one{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}};
    auto single = mwms::bootstrap::read_slurm(lookup(one), 8888);
    REQUIRE(single);
    CHECK(single->resolved.num_workers == 1);
  }
  SECTION("malformed values are quoted") {
    v["SLURM_PROCID"] = "3x";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 8888); }),
               Contains("SLURM_PROCID=3x is not a non-negative integer"));
    v["SLURM_PROCID"] = "5";
    CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_slurm(lookup(v), 8888); }),
               Contains("SLURM_PROCID=5 and SLURM_NTASKS=5"));
  }
  CHECK_FALSE(mwms::bootstrap::read_slurm(lookup(Vars{}), 8888));
}

TEST_CASE("read_torchrun: rank 0's address from MASTER_ADDR/MASTER_PORT", "[unit][bootstrap]") {
  Vars v{{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", "1"},
         {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};
  auto view = mwms::bootstrap::read_torchrun(lookup(v));
  REQUIRE(view);
  CHECK(view->resolved.source == ClusterSource::kTorchrun);
  CHECK(view->resolved.num_workers == 3);
  CHECK(view->resolved.task_id == 1);
  CHECK(view->resolved.local_rank == 1);
  CHECK(view->resolved.ring == Ring{"10.1.2.3:29500"});
  CHECK(view->resolved.task_name() == "torchrun rank 1");
  CHECK(view->resolved.task_name_of_rank(0) == "torchrun rank 0");
  v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  CHECK(mwms::bootstrap::read_torchrun(lookup(v))->resolved.ring == Ring{"10.1.2.3:29501"});
  v["MASTER_ADDR"] = "fd00::1";
  CHECK(mwms::bootstrap::read_torchrun(lookup(v))->resolved.ring == Ring{"[fd00::1]:29501"});
  v["MASTER_PORT"] = "70000";
  CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_torchrun(lookup(v)); }),
             Contains("MASTER_ADDR/MASTER_PORT"));
  v.erase("MASTER_ADDR");
  CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_torchrun(lookup(v)); }),
             Contains("torchrun started 3 processes (WORLD_SIZE=3)") &&
                 Contains("MASTER_ADDR is not set"));
  CHECK_THAT(bootstrap_error([] {
               Vars half{{"RANK", "0"}};
               mwms::bootstrap::read_torchrun(lookup(half));
             }),
             Contains("RANK is set but WORLD_SIZE is not"));
  Vars alone{{"RANK", "0"}, {"WORLD_SIZE", "1"}};
  CHECK(mwms::bootstrap::read_torchrun(lookup(alone))->resolved.ring.empty());
}

TEST_CASE("read_mpi: Open MPI, PMIx hints, PMI", "[unit][bootstrap]") {
  Vars pmix{{"PMIX_RANK", "2"}};
  auto hint = mwms::bootstrap::read_mpi(lookup(pmix));
  REQUIRE(hint);
  CHECK_FALSE(hint->size_known);
  CHECK(hint->resolved.task_id == 2);
  pmix["PMIX_SIZE"] = "4";
  auto full = mwms::bootstrap::read_mpi(lookup(pmix));
  CHECK(full->size_known);
  CHECK(full->resolved.num_workers == 4);
  pmix["OMPI_COMM_WORLD_RANK"] = "1";
  pmix["OMPI_COMM_WORLD_SIZE"] = "2";
  CHECK(mwms::bootstrap::read_mpi(lookup(pmix))->resolved.num_workers == 2);  // OMPI first
  pmix["PMIX_SIZE"] = "x";
  pmix.erase("OMPI_COMM_WORLD_RANK");
  pmix.erase("OMPI_COMM_WORLD_SIZE");
  CHECK_THAT(bootstrap_error([&] { mwms::bootstrap::read_mpi(lookup(pmix)); }),
             Contains("PMIX_SIZE=x"));
}

TEST_CASE("resolve_from_environment: sources that disagree are errors naming both",
          "[unit][bootstrap]") {
  CHECK(resolve_in_child({}) == "default 1 0 0");
  CHECK_THAT(resolve_in_child({{"TF_CONFIG", tf_config(1, 0)},
                               {"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("error: TF_CONFIG lists 1 worker but mpirun started 2 processes "
                      "(OMPI_COMM_WORLD_SIZE=2)"));
  CHECK_THAT(resolve_in_child({{"TF_CONFIG", tf_config(2, 1)},
                               {"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "4"}}),
             Contains("TF_CONFIG lists 2 workers but mpirun started 4 processes"));
  CHECK_THAT(resolve_in_child({{"TF_CONFIG", tf_config(3, 1)},
                               {"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("TF_CONFIG lists 3 workers but mpirun started 2 processes"));
  CHECK_THAT(resolve_in_child({{"TF_CONFIG", tf_config(2, 0)},
                               {"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "2"}}),
             Contains("TF_CONFIG makes this process rank 0 (worker 0) but mpirun gives this "
                      "process rank 1 (OMPI_COMM_WORLD_RANK=1)"));
  // Agreeing sources are fine: TF_CONFIG under mpirun with the same size and rank.
  CHECK(resolve_in_child({{"TF_CONFIG", tf_config(2, 1)},
                          {"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "2"}}) == "tf_config 2 1 0 w0:1 w1:1");
  CHECK_THAT(resolve_in_child({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                               {"MASTER_PORT", "1"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "3"}}),
             Contains("mpirun started 3 processes (PMI_SIZE=3) but torchrun started 2"));
  CHECK_THAT(resolve_in_child({{"TF_CONFIG", tf_config(2, 1)}, {"SLURM_PROCID", "0"},
                               {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "n[1-2]"},
                               {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}}),
             Contains("TF_CONFIG makes this process rank 1 (worker 1) but srun gives this "
                      "process rank 0 (SLURM_PROCID=0)"));
}

TEST_CASE("resolve_from_environment: a launcher with world > 1 never becomes one process",
          "[unit][bootstrap]") {
  CHECK_THAT(resolve_in_child({{"PMIX_RANK", "1"}}),
             Contains("error: a PMIx launcher started this process (PMIX_RANK=1)") &&
                 Contains("no other source gives the world size"));
  CHECK_THAT(resolve_in_child({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}),
             Contains("error: srun started 4 tasks (SLURM_NTASKS=4) but no node list"));
  // srun --mpi=pmix: the PMIx rank is a hint Slurm completes, and must agree with it.
  Vars pmix_slurm = slurm(1, 2, "n[1-2]", "1(x2)", 0);
  pmix_slurm["PMIX_RANK"] = "1";
  CHECK(resolve_in_child(pmix_slurm) == "slurm 2 1 0 n1:8888 n2:8888");
  pmix_slurm["PMIX_RANK"] = "0";
  CHECK_THAT(resolve_in_child(pmix_slurm),
             Contains("srun gives this process rank 1 (SLURM_PROCID=1) but mpirun gives this "
                      "process rank 0 (PMIX_RANK=0)"));
}

TEST_CASE("resolve_from_environment: precedence and nesting inside Slurm", "[unit][bootstrap]") {
  // torchrun started by srun, one agent per node: the step's SLURM_* describe the agents.
  Vars nested = slurm(0, 2, "n[1-2]", "1(x2)", 0);
  nested.insert({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                 {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29500"}});
  CHECK(resolve_in_child(nested) == "torchrun 4 3 1 n1:29500");
  // mpirun inside an sbatch allocation.
  Vars mpi = slurm(0, 1, "n1", "1", 0);
  mpi.insert({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  CHECK(resolve_in_child(mpi) == "mpi 4 2 0");
  // Slurm alone, ports from TF's default base. (A forked child inherits the MWMS_* values this
  // process has already read, so MWMS_SLURM_PORT_BASE itself is tested through mwms-doctor, a
  // fresh process: tests/tools/doctor_test.cc.)
  CHECK(resolve_in_child(slurm(1, 2, "localhost", "2", 1)) ==
        "slurm 2 1 1 localhost:8888 localhost:8889");
}
