// Copies for the transports' landing areas (Note [streaming copy-out]).
//
// Note [streaming copy-out]: the last pass of a large all-reduce copies the peers' reduced chunks
// out of the shared-memory ring into the caller's buffer, which nobody reads again during the
// collective. A cached store first reads each destination line from memory (read for ownership),
// so a result larger than the last-level cache costs a read it does not need on top of its write
// (docs/PERFORMANCE.md, "Memory-traffic bound"). Non-temporal stores write whole lines without
// reading them. They are weakly ordered: copy_streaming() ends with a store fence, so the copy is
// visible before anything the caller publishes afterwards (a completion flag another thread
// reads). Used only for messages of at least streaming_copy_min_bytes(): below the cache size the
// result is better left in cache for the caller. The choice is local to a rank and changes no
// collective's order or result.
#pragma once

#include <cstddef>

namespace mwms::kernels {

/// Copies `n` bytes from `src` to `dst` (not overlapping) with non-temporal stores where the CPU
/// has them (x86-64: SSE2), then fences them (sfence); elsewhere std::memcpy. Any alignment.
/// Thread-safe (touches only its arguments).
void copy_streaming(void* dst, const void* src, std::size_t n) noexcept;

/// The bytes a rank must land in one collective for its copy-outs to stream:
/// MWMS_STREAMING_COPY_MIN_BYTES when >= 0 (0: never stream), else the size of cpu0's
/// last-level cache instance (sysfs; 32 MiB when unknown). Read once; thread-safe; never throws.
std::size_t streaming_copy_min_bytes() noexcept;

}  // namespace mwms::kernels
