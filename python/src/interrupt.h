// Note [python interrupts]: Ctrl-C must stop a blocking call within about a second even when a
// peer never arrives (its deadline may be minutes away), without slowing small collectives.
// Blocking calls run on the calling thread with the GIL released. While one runs on the main
// thread, a SIGINT handler of ours sits in front of Python's: it writes a byte to a pipe that a
// watcher thread reads, then calls Python's handler, which records the signal as always.
// signal.signal() puts Python's handler back, so ours is checked (one sigaction(2) query) at a
// call's start unless it was checked less than 50 ms before, and by the watcher when a call
// runs 100 ms without one: only the main thread can call signal.signal(), and it is inside the
// call meanwhile. (A sigaction(2) per call cost 0.4 us of a 4-byte all-reduce's ~2.2 us here.)
// The one SIGINT this misses: one sent less than 0.1 s into a call that started less than 50 ms
// after signal.signal() put Python's handler back; it still raises once the call returns. Only
// a SIGINT sent while the call is armed acts on it (Note [sigint generation] in interrupt.cc).
// When
// SIGINT's Python handler is the default one (it raises KeyboardInterrupt), the watcher calls
// Communicator::abort() on the communicator the call runs on; the library then fails the blocked
// collective at its next wait slice (Note [local abort] in the engine: ~10 ms on shared memory,
// ~100 ms on TCP) and tells the peers; the call comes back with an InvalidUsage, and the pending
// KeyboardInterrupt is raised in its place. A handler of the program's own is left alone: it
// runs when the call returns. Python's wakeup fd is not touched (CPython does not export
// PySignal_SetWakeupFd, and asyncio owns it). Creating a communicator, which has nothing to
// abort yet, runs on a Job thread instead, waited for in slices between which Python's handlers
// run.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "bindings.h"
#include "mwms/communicator.h"
#include "mwms/errors.h"

namespace mwms::python {

/// Longest time a Job wait goes without running Python's signal handlers.
constexpr double kSliceSeconds = 0.1;

/// Arms the watcher for one blocking call on `comm` (Note [python interrupts]). Construct and
/// destroy with the GIL held; between them, release the GIL and block. Does nothing off the main
/// thread (only the main thread gets KeyboardInterrupt).
class InterruptScope {
 public:
  InterruptScope(Communicator& comm, const char* op);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  /// Call with the GIL held right after construction: runs Python's signal handlers if a signal
  /// came before the call was armed (Note [sigint generation]) and throws nb::python_error if
  /// one raised (KeyboardInterrupt: the call then never starts).
  void raise_if_signalled();
  /// Call with the GIL held when the blocking call failed: when the watcher aborted it, runs
  /// Python's signal handlers and throws nb::python_error (KeyboardInterrupt) if one raised.
  void raise_if_interrupted();

 private:
  bool armed_ = false;
};


/// Runs `call()` (blocking, no Python objects) with the GIL released under an InterruptScope on
/// `comm`; rethrows its error, or the KeyboardInterrupt that aborted it. A template, so that a
/// small collective's call is not a std::function (an allocation for most lambdas).
template <typename Call>
void run_interruptibly(Communicator& comm, const char* op, Call&& call) {
  InterruptScope scope(comm, op);
  scope.raise_if_signalled();
  try {
    nb::gil_scoped_release nogil;
    call();
  } catch (const Error&) {
    scope.raise_if_interrupted();
    throw;
  }
}

/// A function running on a thread of its own (detached), so that the caller can wait for it
/// interruptibly. The function must not touch Python objects.
class Job {
 public:
  /// Starts `fn` on a new thread and waits for it with the GIL released, running Python's
  /// signal handlers every kSliceSeconds; when one raises, throws nb::python_error and leaves
  /// `fn` to finish on its own (it must own everything it uses).
  static void run(std::function<void()> fn);

 private:
  bool wait_for(double seconds);
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace mwms::python
