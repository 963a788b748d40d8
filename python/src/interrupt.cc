// Interruptible blocking calls (Note [python interrupts]).
#include "interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <thread>

#include "mwms/errors.h"

namespace mwms::python {
namespace {

// The watcher: a pipe that our SIGINT handler writes to, and a thread that reads it. Created at
// the first armed call; lives as long as the process (the thread may outlive every Python
// object, so nothing here is ever destroyed).
struct Watcher {
  int read_fd = -1;
  int write_fd = -1;
  std::mutex mutex;               // guards the fields below against the armed call's end
  Communicator* comm = nullptr;   // the communicator of the armed call, if any
  const char* op = "";
  bool aborted = false;           // the watcher aborted the armed call
  bool verified = false;          // on_sigint was checked in front during the armed call
};

std::atomic<Watcher*> g_watcher{nullptr};  // lock-free: read by the signal handler
struct sigaction g_chained;  // Python's SIGINT action, called by ours
std::mutex g_chain_mutex;    // chain_sigint() runs on the main thread and on the watcher's

// When chain_sigint() last ran (CLOCK_MONOTONIC, ns), and how long a call start trusts it.
std::atomic<std::int64_t> g_chain_checked_ns{INT64_MIN / 2};
constexpr std::int64_t kChainRecheckNs = 50'000'000;
constexpr int kWatcherRecheckMs = 100;  // a call in flight this long gets its chain checked

std::int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool chain_sigint();

// Async-signal-safe: a byte to the watcher, then Python's own handler (which records the signal
// for the main thread's next check and writes Python's wakeup fd).
void on_sigint(int signo, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (Watcher* w = g_watcher.load(std::memory_order_acquire)) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    (void)!::write(w->write_fd, &byte, 1);
  }
  errno = saved_errno;
  if (g_chained.sa_flags & SA_SIGINFO) {
    g_chained.sa_sigaction(signo, info, context);
  } else if (g_chained.sa_handler != SIG_DFL && g_chained.sa_handler != SIG_IGN) {
    g_chained.sa_handler(signo);
  }
}

// SIGINT's Python handler is the default one (it raises KeyboardInterrupt). With the GIL.
bool default_sigint_handler() {
  static PyObject* signal_module = nb::module_::import_("signal").release().ptr();
  nb::handle module(signal_module);
  return module.attr("getsignal")(static_cast<int>(SIGINT))
      .is(module.attr("default_int_handler"));
}

// A call in flight whose start trusted a recent check (Note [python interrupts]) gets its own
// check here, so that a SIGINT handler that Python put back just before it is chained anyway.
void recheck_armed_call(Watcher* w) {
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    if (w->comm == nullptr || w->verified) return;
    w->verified = true;
  }
  chain_sigint();
}

void watch(Watcher* w) {
  unsigned char bytes[64];
  for (;;) {
    pollfd p{w->read_fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, kWatcherRecheckMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return;
    if (ready == 0) {
      recheck_armed_call(w);
      continue;
    }
    const ssize_t n = ::read(w->read_fd, bytes, sizeof bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      if (w->comm == nullptr || w->aborted) continue;
    }
    // The GIL before the mutex, never the other way round: the armed call's end takes the
    // mutex while it holds the GIL.
    bool raises;
    {
      nb::gil_scoped_acquire gil;
      try {
        raises = default_sigint_handler();
      } catch (...) {
        raises = false;
      }
    }
    if (!raises) continue;  // a handler of the program's own runs when the call returns
    std::lock_guard<std::mutex> lock(w->mutex);
    if (w->comm != nullptr && !w->aborted) {
      w->aborted = true;
      w->comm->abort(std::string("interrupted (KeyboardInterrupt) in ") + w->op + " on rank " +
                     std::to_string(w->comm->rank()));
    }
  }
}

Watcher* watcher() {
  static Watcher* w = [] {
    auto* created = new Watcher;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return created;  // not interruptible then
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) & ~O_NONBLOCK);  // the thread blocks
    created->read_fd = fds[0];
    created->write_fd = fds[1];
    std::thread([created] { watch(created); }).detach();
    g_watcher.store(created, std::memory_order_release);
    // A forked child has no watcher thread and must not wake its parent's: its SIGINTs only go
    // to Python's handler (the child's calls are then not interruptible by Ctrl-C).
    pthread_atfork(nullptr, nullptr, [] { g_watcher.store(nullptr); });
    return created;
  }();
  (void)w;
  // Null when the pipe failed, and in a forked child.
  return g_watcher.load(std::memory_order_acquire);
}

// Puts on_sigint in front of the current SIGINT action, unless it is there already (checked on
// every call: signal.signal() puts Python's own back) or the action is not a handler (SIG_DFL
// ends the process anyway, SIG_IGN ignores it). One sigaction(2) query when in place. Any thread.
bool chain_sigint() {
  std::lock_guard<std::mutex> serial(g_chain_mutex);
  g_chain_checked_ns.store(monotonic_ns(), std::memory_order_relaxed);
  struct sigaction current;
  if (::sigaction(SIGINT, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &on_sigint) return true;
  if (!(current.sa_flags & SA_SIGINFO) &&
      (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
    return false;
  }
  struct sigaction ours = current;
  ours.sa_flags = current.sa_flags | SA_SIGINFO;
  ours.sa_sigaction = &on_sigint;
  // No SIGINT may run on_sigint while g_chained changes: block it meanwhile.
  sigset_t block, previous;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, &previous);
  g_chained = current;
  const bool ok = ::sigaction(SIGINT, &ours, nullptr) == 0;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return ok;
}

bool on_main_thread() {
  static const unsigned long main_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  return PyThread_get_thread_ident() == main_ident;
}

}  // namespace

InterruptScope::InterruptScope(Communicator& comm, const char* op) {
  if (!on_main_thread()) return;
  Watcher* w = watcher();
  if (w == nullptr) return;
  // Only the main thread can change Python's SIGINT handler, and it is here: a check less than
  // kChainRecheckNs old is trusted (the watcher checks again if this call lasts), which keeps
  // the sigaction(2) off a small collective's path.
  const bool checked = monotonic_ns() - g_chain_checked_ns.load(std::memory_order_relaxed) <
                       kChainRecheckNs;
  if (!checked) chain_sigint();
  std::lock_guard<std::mutex> lock(w->mutex);
  w->comm = &comm;
  w->op = op;
  w->aborted = false;
  w->verified = !checked;
  armed_ = true;
}

InterruptScope::~InterruptScope() {
  if (!armed_) return;
  Watcher* w = watcher();
  std::lock_guard<std::mutex> lock(w->mutex);  // waits for an abort() in progress
  w->comm = nullptr;
}

void InterruptScope::raise_if_interrupted() {
  if (!armed_) return;
  Watcher* w = watcher();
  bool aborted;
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    aborted = w->aborted;
  }
  if (aborted && PyErr_CheckSignals() != 0) throw nb::python_error();
}

void Job::run(std::function<void()> fn) {
  auto job = std::make_shared<Job>();
  {
    nb::gil_scoped_release nogil;  // starting a thread may take a while on a loaded machine
    std::thread([job, fn = std::move(fn)] {
      std::exception_ptr error;
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(job->mutex_);
        job->done_ = true;
        job->error_ = error;
      }
      job->cv_.notify_all();
    }).detach();
  }
  for (;;) {
    bool done;
    {
      nb::gil_scoped_release nogil;
      done = job->wait_for(kSliceSeconds);
    }
    if (done) return;
    // Runs the handlers (main thread only; elsewhere it does nothing and returns 0).
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

bool Job::wait_for(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

}  // namespace mwms::python
