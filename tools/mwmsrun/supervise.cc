// mwmsrun's processes: each started in its own process group with its TF_CONFIG and listener,
// then supervised: signals forwarded, output prefixed, and every task stopped when one fails
// (Note [mwmsrun shutdown], mwmsrun.cc).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "mwmsrun.h"

namespace mwmsrun {

namespace {

volatile sig_atomic_t g_signal = 0;  // the last forwarded signal (0: none)
int g_signal_pipe[2] = {-1, -1};     // wakes the poll loop (self-pipe)

void on_signal(int sig) {
  g_signal = sig;
  const char c = 1;
  (void)!::write(g_signal_pipe[1], &c, 1);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void signal_all(std::vector<Task>& tasks, int sig) {
  for (Task& t : tasks) {
    if (!t.exited && t.pid > 0) ::kill(-t.pid, sig);
  }
}

// Note [mwmsrun shutdown]: SIGCONT first, so that a stopped process (SIGSTOP, a debugger, Ctrl-Z
// of its own) runs and can act on the SIGTERM that follows instead of holding it pending until
// the SIGKILL.
void terminate_all(std::vector<Task>& tasks) {
  signal_all(tasks, SIGCONT);
  signal_all(tasks, SIGTERM);
}

// SIGKILL to every process still running, saying which ranks had to be killed and why.
void kill_all(std::vector<Task>& tasks, double grace) {
  std::string ranks;
  for (const Task& t : tasks) {
    if (!t.exited && t.pid > 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(t.rank);
  }
  if (ranks.empty()) return;
  std::fprintf(stderr,
               "mwmsrun: rank(s) %s still running %g s after SIGTERM (--grace): sending "
               "SIGKILL\n",
               ranks.c_str(), grace);
  signal_all(tasks, SIGKILL);
}

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<long>(seconds * 1000));
}

// The supervision loop's state: which rank failed first, what mwmsrun exits with, and when the
// next step of Note [mwmsrun shutdown] is due.
struct Supervisor {
  Supervisor(std::vector<Task>& all, double grace_seconds)
      : tasks(all), grace(grace_seconds), running(static_cast<int>(all.size())) {}
  std::vector<Task>& tasks;
  double grace;
  int first_failure = -1;  // rank
  int result = 0;
  Clock::time_point kill_at{};
  Clock::time_point term_at{};
  bool term_pending = false;  // a failure's SIGTERM is still to be sent (at term_at)
  bool terminating = false;
  int running;
  int forwarded = 0;

  // One poll of the signal pipe and every open output pipe (100 ms at most), then their output.
  void poll_once() {
    std::vector<pollfd> fds;
    std::vector<Task*> owners;  // the task of fds[i] (null for the signal pipe)
    std::vector<Stream*> streams;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.push_back(nullptr);
    streams.push_back(nullptr);
    for (Task& t : tasks) {
      for (Stream& s : t.streams) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        owners.push_back(&t);
        streams.push_back(&s);
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      char buf[64];
      while (::read(g_signal_pipe[0], buf, sizeof(buf)) > 0) {
      }
    }
    forward_signal();
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(*streams[i], owners[i]->rank);
    }
  }

  // A SIGINT/SIGTERM/SIGHUP of mwmsrun goes to every process group, once per new signal.
  void forward_signal() {
    if (g_signal == 0 || g_signal == forwarded) return;
    forwarded = g_signal;
    std::fprintf(stderr, "mwmsrun: forwarding signal %d to %d process(es)\n", forwarded, running);
    signal_all(tasks, forwarded);
    if (!terminating) {
      terminating = true;
      kill_at = after(grace);
    }
    if (result == 0) result = 128 + forwarded;
  }

  // Reaps what exited; the first failure starts the shutdown.
  void reap() {
    for (Task& t : tasks) {
      if (t.exited) continue;
      int status = 0;
      if (::waitpid(t.pid, &status, WNOHANG) != t.pid) continue;
      t.exited = true;
      t.status = status;
      --running;
      const int code = exit_code_of(status);
      if (code != 0 && first_failure < 0 && !terminating) on_failure(t, status, code);
    }
  }

  void on_failure(const Task& t, int status, int code) {
    first_failure = t.rank;
    result = code;
    if (WIFSIGNALED(status)) {
      std::fprintf(stderr,
                   "mwmsrun: rank %d was killed by signal %d (%s); stopping the "
                   "other %d process(es)\n",
                   t.rank, WTERMSIG(status), ::strsignal(WTERMSIG(status)), running);
    } else {
      std::fprintf(stderr,
                   "mwmsrun: rank %d exited with status %d; stopping the other %d "
                   "process(es)\n",
                   t.rank, code, running);
    }
    terminating = true;
    // Note [mwmsrun shutdown]: a moment to end by themselves, then SIGTERM, then SIGKILL.
    term_at = after(std::min(1.0, grace));
    kill_at = term_at + std::chrono::milliseconds(static_cast<long>(grace * 1000));
    term_pending = true;
  }

  // SIGTERM once the settling moment is over, SIGKILL once --grace has passed after it.
  void escalate() {
    if (term_pending && running > 0 && Clock::now() >= term_at) {
      terminate_all(tasks);
      term_pending = false;
    }
    if (terminating && running > 0 && Clock::now() >= kill_at) {
      kill_all(tasks, grace);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
};

// The forked child: its own process group, its output into the pipes, its TF_CONFIG and
// listener, then PROGRAM; a failed exec reports errno through `exec_err` and exits 127.
// Everything it needs is made before the fork (nothing allocates after it).
[[noreturn]] void exec_task(std::vector<char*>& argv, const std::string& config, int listen_fd,
                            const std::string& listen_fd_text, int out, int err, int exec_err,
                            pid_t parent) {
  ::setpgid(0, 0);
  // Note [mwmsrun shutdown]: a killed mwmsrun (SIGKILL, the OOM killer) takes its processes with
  // it: SIGTERM on the parent's death (kept across exec), and no start if it is already gone.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(128 + SIGTERM);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  ::setenv("TF_CONFIG", config.c_str(), 1);
  // Note [inherited listener]: this task's listening socket alone survives the exec (the other
  // tasks' sockets, and every pipe, are close-on-exec).
  if (listen_fd >= 0) {
    ::fcntl(listen_fd, F_SETFD, 0);
    ::setenv("MWMS_LISTEN_FD", listen_fd_text.c_str(), 1);
  } else {
    ::unsetenv("MWMS_LISTEN_FD");  // not one of this job (mwmsrun's own environment)
  }
  ::execvp(argv[0], argv.data());
  const int e = errno;
  (void)!::write(exec_err, &e, sizeof(e));
  ::_exit(127);
}

}  // namespace

bool install_signal_forwarding() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("mwmsrun: pipe");
    return false;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}

int start_tasks(const Options& o, const std::vector<std::string>& addresses, int training,
                const std::vector<Listener>& listeners, std::vector<Task>& tasks) {
  const int n = static_cast<int>(addresses.size());
  tasks.assign(static_cast<std::size_t>(n), Task{});
  std::vector<std::string> command = o.command;  // execvp takes char*
  std::vector<char*> argv_child;
  for (std::string& s : command) argv_child.push_back(s.data());
  argv_child.push_back(nullptr);
  for (int r = 0; r < n; ++r) {
    Task& t = tasks[static_cast<std::size_t>(r)];
    t.rank = r;
    int out[2], err[2], exec_err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::pipe2(exec_err, O_CLOEXEC) != 0) {
      std::perror("mwmsrun: pipe");
      signal_all(tasks, SIGKILL);
      return 2;
    }
    const std::string config = tf_config(addresses, r, o.chief, training);
    const int listen_fd = listeners.empty() ? -1 : listeners[static_cast<std::size_t>(r)].fd;
    const std::string listen_fd_text = std::to_string(listen_fd);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      exec_task(argv_child, config, listen_fd, listen_fd_text, out[1], err[1], exec_err[1], parent);
    }
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_err[1]);
    // The task holds its own copy; one kept here would accept connections for a task that has
    // died (Note [inherited listener]).
    if (listen_fd >= 0) ::close(listen_fd);
    int e = 0;
    const bool exec_failed = pid > 0 && ::read(exec_err[0], &e, sizeof(e)) == sizeof(e);
    ::close(exec_err[0]);
    if (pid < 0 || exec_failed) {
      std::cerr << "mwmsrun: error: cannot start " << command[0] << ": "
                << std::strerror(pid < 0 ? errno : e) << std::endl;
      if (pid > 0) ::waitpid(pid, nullptr, 0);
      ::close(out[0]);
      ::close(err[0]);
      t.exited = true;
      signal_all(tasks, SIGKILL);
      for (Task& other : tasks) {
        if (!other.exited && other.pid > 0) ::waitpid(other.pid, nullptr, 0);
      }
      return 2;
    }
    ::setpgid(pid, pid);                   // also here: no race with the child's own call
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);  // a grandchild may keep a pipe open after the exit
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    t.pid = pid;
    t.streams[0] = {out[0], "", stdout};
    t.streams[1] = {err[0], "", stderr};
  }
  return -1;
}

int supervise(std::vector<Task>& tasks, double grace) {
  Supervisor s(tasks, grace);
  while (s.running > 0) {
    s.poll_once();
    s.reap();
    s.escalate();
  }
  return s.result;
}

}  // namespace mwmsrun
