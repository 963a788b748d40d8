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
  std::uint64_t generation = 0;   // the armed call's, Note [sigint generation]
  bool aborted = false;           // the watcher aborted the armed call
  bool verified = false;          // on_sigint was checked in front during the armed call
};

std::atomic<Watcher*> g_watcher{nullptr};  // lock-free: read by the signal handler

// Note [sigint generation]: every armed call gets a generation of its own, published here from
// its start to its end (0: no call armed). on_sigint writes the generation it saw, none when no
// call is armed, and the watcher acts on a SIGINT only if it was sent during the call armed now:
// the watcher may read the pipe long after the write (both ranks on one busy core), and a SIGINT
// that came while no call ran, or in an earlier call, was Python's to handle (the program may
// well have caught its KeyboardInterrupt and gone on); it must not abort the next call. A
// SIGINT just before a call is armed is not lost: on_sigint reads the generation after Python's
// handler marked the signal pending, and the call, once armed (a sequentially consistent store),
// runs Python's handlers if one is pending (InterruptScope::raise_if_signalled), so every SIGINT
// is seen by one of the two.
std::atomic<std::uint64_t> g_armed_generation{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "on_sigint reads g_armed_generation: it must be async-signal-safe");
std::uint64_t g_last_generation = 0;  // the main thread's, which alone arms calls
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

// Async-signal-safe: Python's own handler (which records the signal for the main thread's next
// check and writes Python's wakeup fd), then the armed call's generation to the watcher (one
// 8-byte write, atomic on a pipe; nothing when no call is armed: Note [sigint generation]).
void on_sigint(int signo, siginfo_t* info, void* context) {
  if (g_chained.sa_flags & SA_SIGINFO) {
    g_chained.sa_sigaction(signo, info, context);
  } else if (g_chained.sa_handler != SIG_DFL && g_chained.sa_handler != SIG_IGN) {
    g_chained.sa_handler(signo);
  }
  const int saved_errno = errno;
  // After Python's handler: a call armed too late to be seen here sees that handler's mark.
  const std::uint64_t generation = g_armed_generation.load(std::memory_order_seq_cst);
  Watcher* w = g_watcher.load(std::memory_order_acquire);
  if (w != nullptr && generation != 0) (void)!::write(w->write_fd, &generation, sizeof generation);
  errno = saved_errno;
}

// SIGINT's Python handler is the default one (it raises KeyboardInterrupt). With the GIL.
std::atomic<PyObject*> g_signal_module{nullptr};  // Note [python statics]
bool default_sigint_handler() {
  nb::handle module(cached_object(g_signal_module, [] { return nb::module_::import_("signal"); }));
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

// The newest generation in what the pipe holds that is the armed call's, 0 if none: the rest is
// stale and dropped (Note [sigint generation]). Every write is 8 bytes and atomic, so reads of
// a multiple of 8 bytes return whole generations.
std::uint64_t armed_generation_sent(Watcher* w, const std::uint64_t* sent, std::size_t count) {
  std::lock_guard<std::mutex> lock(w->mutex);
  if (w->comm == nullptr || w->aborted) return 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (sent[i] == w->generation) return sent[i];
  }
  return 0;
}

void watch(Watcher* w) {
  std::uint64_t sent[8];
  for (;;) {
    pollfd p{w->read_fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, kWatcherRecheckMs);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return;
    if (ready == 0) {
      recheck_armed_call(w);
      continue;
    }
    const ssize_t n = ::read(w->read_fd, sent, sizeof sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const std::uint64_t generation =
        armed_generation_sent(w, sent, static_cast<std::size_t>(n) / sizeof sent[0]);
    if (generation == 0) continue;
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
    if (w->comm != nullptr && !w->aborted && w->generation == generation) {
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

std::atomic<unsigned long> g_main_ident{0};  // 0: not looked up yet (Note [python statics])
bool on_main_thread() {
  unsigned long main_ident = g_main_ident.load(std::memory_order_acquire);
  if (main_ident == 0) {  // no guard: two threads may both look it up, with the same result
    main_ident = nb::cast<unsigned long>(
        nb::module_::import_("threading").attr("main_thread")().attr("ident"));
    g_main_ident.store(main_ident, std::memory_order_release);
  }
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
  const std::uint64_t generation = ++g_last_generation;
  std::lock_guard<std::mutex> lock(w->mutex);
  w->comm = &comm;
  w->op = op;
  w->generation = generation;
  w->aborted = false;
  w->verified = !checked;
  g_armed_generation.store(generation, std::memory_order_seq_cst);
  armed_ = true;
}

InterruptScope::~InterruptScope() {
  if (!armed_) return;
  Watcher* w = watcher();
  std::lock_guard<std::mutex> lock(w->mutex);  // waits for an abort() in progress
  g_armed_generation.store(0, std::memory_order_release);
  w->comm = nullptr;
}


void InterruptScope::raise_if_signalled() {
  // Cheap when nothing is pending (one atomic load in CPython).
  if (armed_ && PyErr_CheckSignals() != 0) throw nb::python_error();
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
