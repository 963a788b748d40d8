// Slurm's host lists and task counts as srun writes them (expand_hostlist, parse_tasks_per_node),
// and MWMS_SOCKET_IFNAME's NCCL-style filter: real forms, then malformed and hostile inputs, each
// of which must raise BootstrapError (InvalidArgument for the filter) quoting the text.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "bootstrap/hostlist.h"
#include "bootstrap/local_address.h"
#include "mwms/errors.h"
#include "unit/bootstrap/expect_error.h"

namespace {

using Catch::Matchers::Contains;
using mwms::bootstrap::expand_hostlist;
using mwms::bootstrap::parse_tasks_per_node;
using mwms::test::bootstrap_error;
using Names = std::vector<std::string>;

Names expand(const std::string& text) { return expand_hostlist(text, "SLURM_STEP_NODELIST"); }
std::vector<int> counts(const std::string& text) {
  return parse_tasks_per_node(text, "SLURM_STEP_TASKS_PER_NODE");
}

}  // namespace

TEST_CASE("expand_hostlist: the forms Slurm writes", "[unit][bootstrap][slurm]") {
  CHECK(expand("node01") == Names{"node01"});
  CHECK(expand("node[01-04,07]") == Names{"node01", "node02", "node03", "node04", "node07"});
  CHECK(expand("a1,b[2-3]") == Names{"a1", "b2", "b3"});
  CHECK(expand("tux[1,3-4],snowflake") == Names{"tux1", "tux3", "tux4", "snowflake"});
  CHECK(expand("node[8-10]") == Names{"node8", "node9", "node10"});       // no padding
  CHECK(expand("n[008-010]") == Names{"n008", "n009", "n010"});           // padding kept
  CHECK(expand("n[09-10,100]") == Names{"n09", "n10", "n100"});
  CHECK(expand("gpu-[1-2].cluster.local") == Names{"gpu-1.cluster.local", "gpu-2.cluster.local"});
  CHECK(expand("node[1-2]-ib") == Names{"node1-ib", "node2-ib"});
  CHECK(expand("r[1-2]n[1-2]") == Names{"r1n1", "r1n2", "r2n1", "r2n2"});  // leftmost slowest
  CHECK(expand("c[1-2],d[3],e,f[0]") == Names{"c1", "c2", "d3", "e", "f0"});
  CHECK(expand("x[5-5]") == Names{"x5"});
  CHECK(expand("[1-2]") == Names{"1", "2"});
  CHECK(expand("cn_[01-02]") == Names{"cn_01", "cn_02"});
  CHECK(expand("ab[1-3],cd[7,9],ef01") == Names{"ab1", "ab2", "ab3", "cd7", "cd9", "ef01"});
  CHECK(expand("node[0-65535]").size() == 65536);
  CHECK(expand(std::string(253, 'a')).size() == 1);
}

TEST_CASE("expand_hostlist: malformed and hostile lists name the variable and the text",
          "[unit][bootstrap][slurm]") {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"", "empty"},
      {"a,,b", "empty host name"},
      {"a,", "empty host name"},
      {",a", "empty host name"},
      {"node[1-", "'['"},
      {"node[1-2", "'['"},
      {"node]1", "']'"},
      {"node[[1]]", "nested"},
      {"node[]", "not a number"},
      {"node[a-b]", "not a number"},
      {"node[1--2]", "not a number"},
      {"node[-1]", "not a number"},
      {"node[1-2,]", "not a number"},
      {"node[ 1]", "not a number"},
      {"node[3-1]", "backwards"},
      {"node[1234567890]", "not a number"},
      {"no de", "character ' '"},
      {"node[1-2];rm", "character ';'"},
      {"node[0-99999999]", "more than 65536"},
      {"a[0-999]b[0-999]", "more than 65536"},
      {"a[0-40000],b[0-40000]", "more than 65536"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    std::string what = bootstrap_error([&] { expand(c.text); });
    CHECK_THAT(what, Contains("SLURM_STEP_NODELIST=\"") && Contains(c.says));
  }
  CHECK_THAT(bootstrap_error([] { expand(std::string(254, 'a')); }), Contains("longer than 253"));
  CHECK_THAT(bootstrap_error([] { expand(std::string(250, 'a') + "[1000-1001]"); }),
             Contains("longer than 253"));
  CHECK_THAT(bootstrap_error([] { expand(std::string(2u << 20, 'a')); }),
             Contains("longer than 1048576 bytes"));
}

TEST_CASE("parse_tasks_per_node: Slurm's N(xM) counts", "[unit][bootstrap][slurm]") {
  CHECK(counts("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(counts("4") == std::vector<int>{4});
  CHECK(counts("1,2,3") == std::vector<int>{1, 2, 3});
  CHECK(counts("2(x1)") == std::vector<int>{2});
  CHECK(counts("16(x2),8(x3)") == std::vector<int>{16, 16, 8, 8, 8});
  CHECK(counts("1(x65536)").size() == 65536);
  const char* bad[] = {"",     "0",      "2(x0)", "2(3)",    "2(x3",  "x",          "2,,1",
                       "-1",   "2(x3),", "+2",    "2 ",      "2(x)",  "2(x3)(x2)",  "1(x65537)",
                       "2(x-1)", "1048577", "1000(x2000)"};
  for (const char* text : bad) {
    INFO(text);
    CHECK_THAT(bootstrap_error([&] { counts(text); }),
               Contains("SLURM_STEP_TASKS_PER_NODE=\"") && Contains("task count list"));
  }
}

TEST_CASE("MWMS_SOCKET_IFNAME filters follow NCCL_SOCKET_IFNAME", "[unit][bootstrap]") {
  using mwms::bootstrap::parse_interface_filter;
  auto f = parse_interface_filter("eth,ib");
  CHECK(f.matches("eth0"));
  CHECK(f.matches("ib1"));
  CHECK_FALSE(f.matches("lo"));
  auto x = parse_interface_filter("^docker,lo");
  CHECK(x.matches("eth0"));
  CHECK_FALSE(x.matches("docker0"));
  CHECK_FALSE(x.matches("lo"));
  auto e = parse_interface_filter("=eth0");
  CHECK(e.matches("eth0"));
  CHECK_FALSE(e.matches("eth01"));
  auto xe = parse_interface_filter("^=docker0");
  CHECK(xe.matches("docker01"));
  CHECK_FALSE(xe.matches("docker0"));
  CHECK(mwms::bootstrap::interface_address(parse_interface_filter("=lo")) == "127.0.0.1");
  CHECK(mwms::bootstrap::interface_address(parse_interface_filter("=no-such-if")).empty());
  for (const char* text : {"", "^", "eth,", ",eth", "averyveryverylongname"}) {
    INFO(text);
    CHECK_THROWS_AS(parse_interface_filter(text), mwms::InvalidArgument);
  }
}

// Note [local peers before the exchange]: "surely remote" only when every other address is none
// of this host's; every unsure case keeps the shared-memory segment.
TEST_CASE("may_share_host: remote only when every other address is surely another machine's",
          "[unit][bootstrap]") {
  using mwms::bootstrap::may_share_host;
  // 192.0.2.0/24 and 2001:db8::/32 are documentation ranges: on no interface of a test machine.
  CHECK_FALSE(may_share_host({"127.0.0.1:1", "192.0.2.7:2"}, 0, 2));
  CHECK_FALSE(may_share_host({"192.0.2.7:2", "127.0.0.1:1", "192.0.2.8:3"}, 1, 3));
  CHECK_FALSE(may_share_host({"127.0.0.1:1", "[2001:db8::1]:2"}, 0, 2));
  CHECK(may_share_host({"127.0.0.1:1", "127.0.0.1:2"}, 0, 2));
  CHECK(may_share_host({"127.0.0.1:1", "localhost:2"}, 0, 2));
  CHECK(may_share_host({"192.0.2.7:1", "[::1]:2"}, 0, 2));
  // Two tasks on the same (NAT-mapped, say) address are one machine whatever the interfaces say.
  CHECK(may_share_host({"192.0.2.7:1", "192.0.2.9:3", "192.0.2.7:2"}, 0, 3));
  // One of this host's own interface addresses, however the task spells its own.
  const std::string lo = mwms::bootstrap::interface_address(
      mwms::bootstrap::parse_interface_filter("=lo"));
  CHECK(may_share_host({"192.0.2.7:1", lo + ":2"}, 0, 2));
  // This host's name.
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  CHECK(may_share_host({"192.0.2.7:1", std::string(name) + ":2"}, 0, 2));
  // A ring that does not list every task yet (MPI, torchrun), or a bad index.
  CHECK(may_share_host({"192.0.2.7:1"}, 0, 2));
  CHECK(may_share_host({"127.0.0.1:1", "192.0.2.7:2"}, 2, 2));
}
