// Slurm's compact host lists and task counts (Note [slurm hostlist]): the two parsers behind the
// Slurm launcher (launchers.cc). Both are bounded and throw only BootstrapError naming the text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mwms::bootstrap {

/// Bounds on what a Slurm environment may describe (Slurm itself caps a job at 65533 nodes).
constexpr std::size_t kMaxSlurmNodes = 65536;
constexpr long kMaxSlurmTasks = 1L << 20;
constexpr std::size_t kMaxHostNameBytes = 253;  // RFC 1035's limit for a full DNS name
constexpr std::size_t kMaxHostListBytes = 1u << 20;

/// Expands a Slurm host list, e.g. "node[01-04,07]" -> node01..node04, node07; "a1,b[2-3]" ->
/// a1, b2, b3; "r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2 (several bracket groups in one name
/// multiply, leftmost slowest). Zero padding is kept: the width of a range is the width of its
/// low bound ("[08-10]" -> 08, 09, 10). Names keep list order; duplicates are kept (Slurm never
/// writes them). `where` names the variable in errors (e.g. "SLURM_STEP_NODELIST").
/// @throws BootstrapError quoting the text: empty list or name, unbalanced or nested brackets,
///   a range whose bounds are not decimal or run backwards, a character a host name cannot hold,
///   a name longer than 253 bytes, more than kMaxSlurmNodes names.
std::vector<std::string> expand_hostlist(std::string_view text, std::string_view where);

/// Expands Slurm's tasks-per-node syntax, e.g. "2(x3),1" -> 2, 2, 2, 1. Every count is >= 1.
/// @throws BootstrapError quoting the text: empty entry, non-decimal count, zero, a repeat
///   without "(x" ... ")", more than kMaxSlurmNodes entries or kMaxSlurmTasks tasks in all.
std::vector<int> parse_tasks_per_node(std::string_view text, std::string_view where);

}  // namespace mwms::bootstrap
