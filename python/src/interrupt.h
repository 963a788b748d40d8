// Note [python interrupts]: a blocking call must let Ctrl-C through within about a second even
// when a peer never arrives (its deadline may be minutes away). CPython runs signal handlers only
// on the main thread between bytecodes, so the collective itself never runs on the calling
// thread: it runs on another thread (the communicator's progress thread through the C++ *_async
// calls, or a Job thread for the strategy's calls) while the caller waits with the GIL released,
// in slices of kSliceSeconds, running Python's signal handlers between slices. When a handler
// raises (KeyboardInterrupt), the caller aborts the communicator (peers fail at once with a
// PeerError naming this rank; this rank's later calls raise InvalidUsage) and the exception
// propagates. The collective still running then holds the caller's buffers until it fails, so
// the Python objects keep them (and, if it never ends, the C++ object) alive.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "bindings.h"
#include "mwms/communicator.h"

namespace mwms::python {

/// Longest time a blocked call goes without running Python's signal handlers.
constexpr double kSliceSeconds = 0.1;

/// Waits until `wait_slice(seconds)` returns true (done; it throws the operation's error), with
/// the GIL released, running Python's signal handlers every slice. Call with the GIL held. When a
/// handler raises, calls `on_interrupt()` (with the GIL held; it must not throw) and throws
/// nb::python_error carrying the handler's exception.
void wait_interruptibly(const std::function<bool(double)>& wait_slice,
                        const std::function<void()>& on_interrupt);

/// wait_interruptibly() on a C++ Work: returns when it completed, rethrows its error.
void wait_work(Work& work, const std::function<void()>& on_interrupt);

/// A function running on a thread of its own (detached), so that the caller can wait for it
/// interruptibly. The function must not touch Python objects.
class Job {
 public:
  /// Starts `fn` on a new thread.
  static std::shared_ptr<Job> start(std::function<void()> fn);
  /// Waits up to `seconds`; true when `fn` has returned; rethrows what it threw.
  bool wait_for(double seconds);
  /// True once `fn` has returned (or thrown). Never blocks.
  bool done();
  /// Runs `fn` on a Job and waits for it interruptibly (wait_interruptibly); on an interrupt
  /// returns the still running Job through `*stuck` before throwing.
  static void run(std::function<void()> fn, const std::function<void()>& on_interrupt,
                  std::shared_ptr<Job>* stuck);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace mwms::python
