// The address this task advertises to its peers when the launcher gives none (MPI, torchrun ranks
// other than 0): Note [advertised address] in local_address.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mwms::bootstrap {

/// MWMS_SOCKET_IFNAME's syntax, NCCL's NCCL_SOCKET_IFNAME: a comma list of interface-name
/// prefixes; a leading '^' excludes the listed interfaces instead; a leading '=' (after '^' if
/// any) makes the names exact instead of prefixes. "eth,ib" "^docker,lo" "=eth0" "^=docker0".
struct InterfaceFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
  /// True when interface `name` passes the filter.
  bool matches(std::string_view name) const;
};

/// Parses a filter. @throws InvalidArgument quoting MWMS_SOCKET_IFNAME: an empty list or name, a
///   name longer than 15 bytes (IFNAMSIZ - 1), more than 64 names.
InterfaceFilter parse_interface_filter(std::string_view text);

/// The numeric host (IPv4 preferred, IPv6 without brackets) of the first interface, in
/// getifaddrs order, that passes `filter` and is up; "" when none does.
std::string interface_address(const InterfaceFilter& filter);

/// Host to advertise: with MWMS_SOCKET_IFNAME set, that interface's address (BootstrapError
/// naming the filter and the interfaces seen when none matches); else 127.0.0.1 when `toward` (the
/// leader's host, may be empty) is a loopback name; else the local address of the route toward
/// `toward` (a UDP socket connected there, nothing sent); else the host name.
/// @throws BootstrapError, InvalidArgument (a malformed MWMS_SOCKET_IFNAME).
std::string advertised_host(const std::string& toward, int toward_port);

/// Whether another task of `ring` may run on this host, asked before the peer-info exchange
/// (Note [local peers before the exchange]): false only when every other task's address is surely
/// another machine's: not this task's own host, not a loopback or this host's name, no address of
/// an interface of this host, and (a name) resolving to none of those. `ring` is rank order
/// ("host:port", "[v6]:port"), this task at `self`; a ring that does not list all `world_size`
/// tasks (MPI, torchrun), a name that does not resolve and more than 64 distinct hosts give true.
/// Never throws; blocks in name resolution (getaddrinfo) for each distinct name.
bool may_share_host(const std::vector<std::string>& ring, int self, int world_size) noexcept;

/// "[v6]" for an IPv6 literal, the host itself otherwise: ready for ":port".
std::string bracket_host(const std::string& host);

}  // namespace mwms::bootstrap
