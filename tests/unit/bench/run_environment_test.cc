// The environment of a bench run (bench/common/run_environment.cc): which variables the header
// and the JSON name as forcing or tuning what is measured, and when glibc is set up for Open MPI
// at its best. Over a fake environment, so the tests do not depend on the one they run in.
#include "common/run_environment.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

namespace {

using mwms::bench::EnvScope;
using mwms::bench::EnvSetting;

mwms::bench::EnvLookup fake(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::vector<std::string> names(const std::vector<EnvSetting>& settings) {
  std::vector<std::string> out;
  for (const EnvSetting& s : settings) out.push_back(s.name + "=" + s.value);
  return out;
}

}  // namespace

TEST_CASE("bench environment: forcing variables first, then tuning ones, set ones only",
          "[unit][bench]") {
  // Held by the lambda: the lookup's pointers stay valid while it lives.
  const auto env = fake({{"MWMS_CHUNK_BYTES", "65536"},
                         {"MWMS_TRANSPORT", "tcp"},
                         {"MWMS_ALGO", "ring"},
                         {"MWMS_SHM_DISABLE", ""},  // empty: the library's default applies
                         {"MWMS_LOG_LEVEL", "info"},  // changes nothing that is timed
                         {"NCCL_ALGO", "Tree"}});
  const std::vector<EnvSetting> host = mwms::bench::measured_environment(EnvScope::kHost, env);
  CHECK(names(host) ==
        std::vector<std::string>{"MWMS_ALGO=ring", "MWMS_TRANSPORT=tcp", "MWMS_CHUNK_BYTES=65536"});
  CHECK(mwms::bench::describe_environment(host, "") ==
        "MWMS_ALGO=ring MWMS_TRANSPORT=tcp MWMS_CHUNK_BYTES=65536");
  CHECK(mwms::bench::describe_environment(host, "shm") ==
        "MWMS_ALGO=ring MWMS_TRANSPORT=tcp (overridden by --backend shm) MWMS_CHUNK_BYTES=65536");
  // NCCL decides on device buffers; libmwms's engine knobs do not apply there.
  CHECK(names(mwms::bench::measured_environment(EnvScope::kDevice, env)) ==
        std::vector<std::string>{"NCCL_ALGO=Tree"});
  const std::vector<EnvSetting> none =
      mwms::bench::measured_environment(EnvScope::kHost, fake({{"MWMS_LOG_LEVEL", "debug"}}));
  CHECK(none.empty());
  CHECK(mwms::bench::describe_environment(none, "tcp") == "none (library defaults)");
}

TEST_CASE("bench environment: the MPI hint's glibc variables, each checked", "[unit][bench]") {
  using mwms::bench::malloc_not_as_recommended;
  CHECK(malloc_not_as_recommended(
            fake({{"MALLOC_MMAP_MAX_", "0"}, {"MALLOC_TRIM_THRESHOLD_", "-1"}})).empty());
  CHECK(malloc_not_as_recommended(fake({})) ==
        std::vector<std::string>{"MALLOC_MMAP_MAX_ is not 0", "MALLOC_TRIM_THRESHOLD_ is not -1"});
  CHECK(malloc_not_as_recommended(fake({{"MALLOC_MMAP_MAX_", "0"}})) ==
        std::vector<std::string>{"MALLOC_TRIM_THRESHOLD_ is not -1"});
  CHECK(malloc_not_as_recommended(
            fake({{"MALLOC_MMAP_MAX_", "65536"}, {"MALLOC_TRIM_THRESHOLD_", "-1"}})) ==
        std::vector<std::string>{"MALLOC_MMAP_MAX_ is not 0"});
}
