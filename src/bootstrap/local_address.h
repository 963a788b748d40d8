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

/// "[v6]" for an IPv6 literal, the host itself otherwise: ready for ":port".
std::string bracket_host(const std::string& host);

}  // namespace mwms::bootstrap
