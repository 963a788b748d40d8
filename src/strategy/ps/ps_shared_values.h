// A parameter server's values in memory its workers on the same host map read-only (Note [ps
// shared values]): the ps's flat buffer of every shard it holds (Note [ps segments] in
// ps_protocol.h), after a control page with the progress of the update being written.
//
// Note [ps shared values]: a reply over shared memory used to copy the ps's values into each
// worker's ring, and the worker copied them out again: two 814 KB passes per reply for train's
// MLP, the ps's on the one core that serves every worker. Now a synchronous ps whose link to a
// worker is shared memory (and MWMS_PS_SHARED_VALUES is not 0) keeps its values in a memfd, tells
// the worker its address in kReady, and answers a pull or push with kSharedValues alone: the
// worker copies the values straight from the ps's buffer into its variables. Only synchronous
// mode: there a step's update starts once the step's gradients are in, and each worker copied
// the last values before it pushed, so the ps (almost) never waits for a reader; asynchronous
// updates follow each other, and waiting for the previous worker's copy before the next update
// cost more than the ps's own copy into the ring (ps_perf, 2 workers: sync 402 -> 331 us,
// async 272-305 -> 345-364 us; Note [ps serving]). Three rules keep every copy one consistent
// version:
// - progress: the control page's `ready` counts the elements of the buffer that are final for
//   the version being written; the ps sets it to 0 before an update changes anything and raises
//   it (release) as the update reaches each range, so a worker copies behind the update as the
//   ring replies did (Note [ps step pipeline]); at rest it is the whole buffer.
// - readers: from kSharedValues on, the worker is reading; it says kCopied once its copy is
//   done, before any other request. The ps starts no update (begin_update) while a worker that
//   is still alive is reading: it waits for its kCopied. A worker that dies or is lost meanwhile
//   is no longer waited for (the heartbeat's deadline); one still alive after half the timeout
//   is dropped as frozen (the workers waiting for the update then see it go on), and if it was
//   still copying it sees `ready` fall below what it copied and fails naming the ps instead of
//   returning a mix of two versions. A goodbye instead of kCopied (a copy cut short) is taken.
// - order: the ps resets `ready` before it sends the kSharedValues of the next version, and a
//   worker reads `ready` only after that header (the ring's release/acquire), so it never takes
//   the previous version's "complete" for the new one.
// The memfd is opened as ShmSegment's (Note [shm segment]: /proc/<pid>/fd/<fd>, checked against
// a 128-bit nonce in the control page; nothing named is left behind), read-only on the worker.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mwms::strategy::ps {

/// The longest address SharedValues::open accepts ("pid:fd:bytes:nonce").
inline constexpr std::size_t kMaxSharedAddressBytes = 96;

class SharedValues {
 public:
  /// The ps's buffer of `count` floats, zeroed, `ready` = count. @throws BackendError naming the
  /// call and the bytes (memfd_create, ftruncate, fallocate: a /dev/shm too small, mmap).
  static std::unique_ptr<SharedValues> create(std::size_t count);
  /// A worker's read-only view of the ps's buffer at `address`, which must hold exactly `count`
  /// floats. @throws BootstrapError saying what is wrong (malformed or stale address, another
  /// size; the caller adds the ps), BackendError (mmap).
  static std::unique_ptr<SharedValues> open(const std::string& address, std::size_t count);
  ~SharedValues();
  SharedValues(const SharedValues&) = delete;
  SharedValues& operator=(const SharedValues&) = delete;

  std::string address() const;
  std::size_t count() const noexcept { return count_; }
  /// The values (the ps writes them; a worker's mapping is read-only).
  float* data() const noexcept { return values_; }
  /// Elements final for the version being written (acquire). At most count().
  std::size_t ready() const noexcept;
  /// ps: elements [0, n) are final now (release); never lowers it but through reset().
  void publish(std::size_t n) noexcept;
  /// ps: an update starts; nothing is final until publish().
  void reset() noexcept;

 private:
  SharedValues() = default;
  int fd_ = -1;
  char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t count_ = 0;
  float* values_ = nullptr;
  std::atomic<std::uint64_t>* ready_ = nullptr;
  std::uint64_t nonce_[2] = {0, 0};
};

}  // namespace mwms::strategy::ps
