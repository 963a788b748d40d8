// mwmsrun: a local launcher (horovodrun -np N on one host, torchrun --standalone, the Spark
// TensorFlow Distributor's MirroredStrategyRunner(local_mode=True)). Starts N processes of a
// program on this machine, each with its own TF_CONFIG for a cluster of free loopback ports and,
// with N > 1, the socket already listening on its port (inherited, named by MWMS_LISTEN_FD: Note
// [inherited listener] in src/bootstrap/rendezvous.cc, so no other process can take the port
// before the task listens), prefixes every output line with the task's rank ("[1] ..."), forwards SIGINT/SIGTERM/SIGHUP,
// ends the others when one fails and exits with the first failure's status.
//
//   mwmsrun -np 2 build/bin/train --epochs 1
//   mwmsrun -np 3 --chief -- build/bin/all_reduce_perf -b 1M -e 1M
//   mwmsrun --hosts h1:2,h2:2 --print-tf-config    # TF_CONFIG of every task of a 2-host job
//
// Exit status: 0 when every process exited 0; otherwise the first failure's exit status (128 + N
// for a process killed by signal N); 2 for a bad command line or a program that cannot start.
//
// Note [mwmsrun shutdown]: each process runs in its own process group, so a terminal's Ctrl-C
// reaches the processes once, through mwmsrun, which forwards SIGINT/SIGTERM/SIGHUP to every
// group. When one process fails, the others first get a moment to end by themselves (at most
// 1 s, and never more than --grace): a libmwms survivor notices a dead peer within ~10-150 ms and
// exits with the error that names it, and a SIGTERM at once would cut that line off. Then they
// get SIGCONT (a stopped process could not act on what follows) and SIGTERM and, after --grace
// seconds more, SIGKILL, naming the ranks it had to kill: a collective waiting on the failed peer
// would fail by itself within its timeout, but there is no reason to wait for that. mwmsrun never
// exits before every process it started has been reaped,
// and a killed mwmsrun takes its processes with it (PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;  // the last forwarded signal (0: none)
int g_signal_pipe[2] = {-1, -1};     // wakes the poll loop (self-pipe)

void on_signal(int sig) {
  g_signal = sig;
  const char c = 1;
  (void)!::write(g_signal_pipe[1], &c, 1);
}

// Note [inherited listener] (src/bootstrap/rendezvous.cc): a socket listening on `port` as the
// task's own listener would (common::listen_tcp: every interface, dual-stack IPv6 where the
// kernel has it, else IPv4; SO_REUSEADDR), close-on-exec; -1 when the port is taken.
int listen_on(int port) {
  const int one = 1;
  const int zero = 0;
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 128) == 0) {
      return fd;
    }
    const int e = errno;
    ::close(fd);
    if (e == EADDRINUSE) return -1;
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // no IPv6 in this kernel
  if (fd < 0) return -1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 128) == 0) {
    return fd;
  }
  ::close(fd);
  return -1;
}

struct Listener {
  int port = 0;
  int fd = -1;  // listening, close-on-exec
};

// n sockets listening on distinct random ports in 20000-31999 (below Linux's ephemeral range,
// so that no outgoing connection holds one of them). They stay open until each task has them:
// nothing can take a port between this choice and the task's use of it.
std::vector<Listener> listen_on_free_ports(int n) {
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                   static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(20000, 31999);
  std::set<int> tried;
  std::vector<Listener> out;
  for (int tries = 0; static_cast<int>(out.size()) < n && tries < 100000; ++tries) {
    const int p = pick(rng);
    if (!tried.insert(p).second) continue;
    const int fd = listen_on(p);
    if (fd >= 0) out.push_back({p, fd});
  }
  if (static_cast<int>(out.size()) < n) {
    for (const Listener& l : out) ::close(l.fd);
    throw std::runtime_error("no " + std::to_string(n) + " free TCP ports in 20000-31999");
  }
  return out;
}

// TF_CONFIG of task `rank` of a cluster whose tasks are at `addresses`: the first `training` are
// the training tasks (with_chief: the first of them is the chief, the others workers 0..n-2), the
// rest the ps tasks 0..M-1 (--ps M).
std::string tf_config(const std::vector<std::string>& addresses, int rank, bool with_chief,
                      int training) {
  nlohmann::json cluster;
  nlohmann::json workers = nlohmann::json::array();
  nlohmann::json ps = nlohmann::json::array();
  for (int i = with_chief ? 1 : 0; i < training; ++i) workers.push_back(addresses[i]);
  for (std::size_t i = static_cast<std::size_t>(training); i < addresses.size(); ++i) {
    ps.push_back(addresses[i]);
  }
  cluster["worker"] = workers;
  if (with_chief) cluster["chief"] = nlohmann::json::array({addresses[0]});
  if (!ps.empty()) cluster["ps"] = ps;
  nlohmann::json task;
  if (rank >= training) {
    task["type"] = "ps";
    task["index"] = rank - training;
  } else {
    task["type"] = with_chief && rank == 0 ? "chief" : "worker";
    task["index"] = with_chief ? (rank == 0 ? 0 : rank - 1) : rank;
  }
  return nlohmann::json{{"cluster", cluster}, {"task", task}}.dump();
}

// Splits "h1:2,h2:2" into hosts repeated by their slot count; throws on a malformed list.
std::vector<std::string> parse_hosts(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    std::size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const std::size_t colon = item.rfind(':');
    std::string host = item;
    int slots = 1;
    if (colon != std::string::npos) {
      host = item.substr(0, colon);
      const std::string n = item.substr(colon + 1);
      char* e = nullptr;
      const long v = std::strtol(n.c_str(), &e, 10);
      if (n.empty() || *e != '\0' || v < 1 || v > 1024) {
        throw std::runtime_error("--hosts: '" + item + "' is not HOST or HOST:SLOTS (1-1024)");
      }
      slots = static_cast<int>(v);
    }
    if (host.empty() || host.size() > 253) {
      throw std::runtime_error("--hosts: '" + item + "' has no host name (or one over 253 bytes)");
    }
    for (int i = 0; i < slots; ++i) out.push_back(host);
    pos = end + 1;
  }
  return out;
}

struct Stream {
  int fd = -1;
  std::string pending;  // bytes after the last newline
  FILE* out = nullptr;
};

struct Task {
  int rank = 0;
  pid_t pid = -1;
  Stream streams[2];  // stdout, stderr
  bool exited = false;
  int status = 0;
};

// Writes every complete line of `s` (and, at the end, the rest) with the rank prefix.
void flush_lines(Stream& s, int rank, bool all) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(s.out, "[%d] %.*s\n", rank, static_cast<int>(nl - start), s.pending.data() + start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (all && !s.pending.empty()) {
    std::fprintf(s.out, "[%d] %s\n", rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.out);
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
  std::fprintf(stderr, "mwmsrun: rank(s) %s still running %g s after SIGTERM (--grace): sending "
               "SIGKILL\n", ranks.c_str(), grace);
  signal_all(tasks, SIGKILL);
}

// The help's one usage line (CLI11's own would read "Usage: [OPTIONS]": the app has no name when
// parsing a vector, and it knows nothing of PROGRAM).
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: mwmsrun -np N [--chief] [--ps M] [--grace S] [--] PROGRAM [ARGS...]\n"
           "       mwmsrun (-np N | --hosts HOST[:SLOTS],...) [--chief] [--ps M] "
           "--print-tf-config\n";
  }
};

// A whole number in [lo, hi], saying "not a number" for one that is not (CLI::Range alone calls
// "abc" "not in range").
CLI::Validator whole_number_in(int lo, int hi) {
  const std::string range = "[" + std::to_string(lo) + " - " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno == ERANGE) {
          return "'" + value + "' is not a number (a whole number in " + range + ")";
        }
        if (v < lo || v > hi) return value + " is not in " + range;
        return std::string();
      },
      "INT in " + range);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mwmsrun: starts N local processes of PROGRAM, each with its own TF_CONFIG "
               "(free loopback ports) and, for N > 1, the socket already listening on its port "
               "(inherited; its number in MWMS_LISTEN_FD, which libmwms adopts instead of "
               "binding), prefixes their output with the rank and ends them together"};
  int np = 0;
  bool chief = false;
  int num_ps = 0;
  double grace = 5;
  std::string hosts;
  bool print_only = false;
  int port_base = 23456;
  std::vector<std::string> command;
  app.add_option("-n,--np", np, "number of processes (tasks) to start on this machine")
      ->check(whole_number_in(1, 1024));
  app.add_flag("--chief", chief, "task 0 is the chief and the others workers 0..N-2 "
               "(default: N workers)");
  app.add_option("--ps", num_ps, "also start M parameter-server tasks (TF_CONFIG job \"ps\"), "
                 "after the N training tasks: N + M processes (with --hosts: the last M slots)")
      ->check(whole_number_in(0, 1024));
  app.add_option("--grace", grace, "seconds between SIGTERM and SIGKILL when stopping the others "
                 "after a failure")->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  app.add_option("--hosts", hosts, "with --print-tf-config: HOST[:SLOTS],... of a multi-host "
                 "job (tasks in that order)");
  app.add_flag("--print-tf-config", print_only, "print the TF_CONFIG of every task and exit "
               "(of --hosts, else of -np N on localhost)");
  app.add_option("--port-base", port_base, "with --hosts: task i on a host listens on "
                 "port-base + its slot on that host")->capture_default_str()
      ->check(CLI::Range(1, 65535 - 1024));
  app.prefix_command();  // PROGRAM and everything after it (or after --) belong to PROGRAM
  app.formatter(std::make_shared<UsageFormatter>());
  // "-np N" as mpirun and horovodrun spell it (CLI11 reads "-np" as -n with value "p"): rewrite
  // it among mwmsrun's own options, never inside PROGRAM's arguments.
  // Anything else that looks like an option before PROGRAM is a mistake (a typo, or PROGRAM's
  // own option without PROGRAM): refused, not taken as the program's name.
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::set<std::string> with_value{"-n", "--np", "--ps", "--grace", "--hosts",
                                        "--port-base"};
  const std::set<std::string> flags{"--chief", "--print-tf-config", "-h", "--help"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') break;  // PROGRAM starts here
    if (a == "-np") a = args[i] = "--np";
    if (a.rfind("-np", 0) == 0 && a.size() > 3 && std::isdigit(static_cast<unsigned char>(a[3]))) {
      args[i] = "--np=" + a.substr(3);  // -np2, as mpirun accepts it
      continue;
    }
    const std::string name = a.substr(0, a.find('='));
    if (with_value.count(name) != 0) {
      if (name == a) ++i;  // the option's value follows
      continue;
    }
    if (a.size() > 2 && a[0] == '-' && a[1] == 'n' && std::isdigit(static_cast<unsigned char>(a[2]))) {
      continue;  // -n2
    }
    if (flags.count(a) == 0) {
      std::cerr << "mwmsrun: error: unknown option " << a << " (PROGRAM's own options go after "
                << "PROGRAM: mwmsrun -np N [--] PROGRAM ARGS...)\nRun with --help for usage."
                << std::endl;
      return 2;
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
    command = app.remaining();
    if (!command.empty() && command.front() == "--") command.erase(command.begin());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "mwmsrun: error: " << e.what() << "\nRun with --help for usage." << std::endl;
    return 2;
  }

  std::vector<std::string> addresses;
  std::vector<Listener> listeners;  // -np N: task r's listening socket (Note [inherited listener])
  try {
    if (!hosts.empty()) {
      if (!print_only) {
        std::cerr << "mwmsrun: error: --hosts starts nothing; use it with --print-tf-config and "
                     "start each host's tasks there (or use mpirun/srun)" << std::endl;
        return 2;
      }
      std::vector<std::string> per_task = parse_hosts(hosts);
      if (np != 0 && np + num_ps != static_cast<int>(per_task.size())) {
        std::cerr << "mwmsrun: error: -np " << np << " + --ps " << num_ps << " but --hosts " << hosts << " lists "
                  << per_task.size() << " slot(s); give one of them, or make them agree"
                  << std::endl;
        return 2;
      }
      std::map<std::string, int> slot;
      for (const std::string& h : per_task) {
        addresses.push_back(h + ":" + std::to_string(port_base + slot[h]++));
      }
    } else {
      if (np < 1) {
        std::cerr << "mwmsrun: error: -np N is required (or --hosts with --print-tf-config)"
                  << std::endl;
        return 2;
      }
      listeners = listen_on_free_ports(np + num_ps);
      for (const Listener& l : listeners) {
        addresses.push_back("127.0.0.1:" + std::to_string(l.port));
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "mwmsrun: error: " << e.what() << std::endl;
    return 2;
  }
  const int n = static_cast<int>(addresses.size());
  const int training = n - num_ps;
  if (training < 1) {
    std::cerr << "mwmsrun: error: --ps " << num_ps << " leaves no training task (" << n
              << " in all): a parameter-server job needs at least one worker" << std::endl;
    return 2;
  }
  if (print_only || n == 1) {
    // Nothing listens: printed for tasks started elsewhere, or one task (world size 1, which
    // has no listener).
    for (Listener& l : listeners) ::close(l.fd);
    listeners.clear();
  }
  if (print_only) {
    for (int r = 0; r < n; ++r) {
      const std::string host = addresses[static_cast<std::size_t>(r)].substr(
          0, addresses[static_cast<std::size_t>(r)].rfind(':'));
      std::cout << "# task " << r << " on " << host << "\nTF_CONFIG='"
                << tf_config(addresses, r, chief, training) << "'\n";
    }
    return 0;
  }
  if (command.empty()) {
    std::cerr << "mwmsrun: error: no PROGRAM to run (mwmsrun -np N [--] PROGRAM ARGS...)"
              << std::endl;
    return 2;
  }

  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("mwmsrun: pipe");
    return 2;
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Task> tasks(static_cast<std::size_t>(n));
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
    const std::string config = tf_config(addresses, r, chief, training);
    const int listen_fd = listeners.empty() ? -1 : listeners[static_cast<std::size_t>(r)].fd;
    const std::string listen_fd_text = std::to_string(listen_fd);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      // Note [mwmsrun shutdown]: a killed mwmsrun (SIGKILL, the OOM killer) takes its processes
      // with it: SIGTERM on the parent's death (kept across exec), and no start if it is
      // already gone.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(128 + SIGTERM);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::setenv("TF_CONFIG", config.c_str(), 1);
      // Note [inherited listener]: this task's listening socket alone survives the exec (the
      // other tasks' sockets, and every pipe, are close-on-exec).
      if (listen_fd >= 0) {
        ::fcntl(listen_fd, F_SETFD, 0);
        ::setenv("MWMS_LISTEN_FD", listen_fd_text.c_str(), 1);
      } else {
        ::unsetenv("MWMS_LISTEN_FD");  // not one of this job (mwmsrun's own environment)
      }
      ::execvp(argv_child[0], argv_child.data());
      const int e = errno;
      (void)!::write(exec_err[1], &e, sizeof(e));
      ::_exit(127);
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
      for (Task& o : tasks) {
        if (!o.exited && o.pid > 0) ::waitpid(o.pid, nullptr, 0);
      }
      return 2;
    }
    ::setpgid(pid, pid);  // also here: no race with the child's own call
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);  // a grandchild may keep a pipe open after the exit
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    t.pid = pid;
    t.streams[0] = {out[0], "", stdout};
    t.streams[1] = {err[0], "", stderr};
  }

  int first_failure = -1;  // rank
  int result = 0;
  std::chrono::steady_clock::time_point kill_at{};
  std::chrono::steady_clock::time_point term_at{};
  bool term_pending = false;  // a failure's SIGTERM is still to be sent (at term_at)
  bool terminating = false;
  int running = n;
  int forwarded = 0;
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.push_back(nullptr);
    for (Task& t : tasks) {
      for (Stream& s : t.streams) {
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          owners.push_back(&s);
        }
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      char buf[64];
      while (::read(g_signal_pipe[0], buf, sizeof(buf)) > 0) {
      }
    }
    if (g_signal != 0 && g_signal != forwarded) {
      forwarded = g_signal;
      std::fprintf(stderr, "mwmsrun: forwarding signal %d to %d process(es)\n", forwarded, running);
      signal_all(tasks, forwarded);
      if (!terminating) {
        terminating = true;
        kill_at = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<long>(grace * 1000));
      }
      if (result == 0) result = 128 + forwarded;
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = *owners[i];
      char buf[65536];
      const ssize_t got = ::read(s.fd, buf, sizeof(buf));
      Task* owner = nullptr;
      for (Task& t : tasks) {
        if (&t.streams[0] == &s || &t.streams[1] == &s) owner = &t;
      }
      if (got > 0) {
        s.pending.append(buf, static_cast<std::size_t>(got));
        flush_lines(s, owner->rank, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        flush_lines(s, owner->rank, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
    for (Task& t : tasks) {
      if (t.exited) continue;
      int status = 0;
      if (::waitpid(t.pid, &status, WNOHANG) != t.pid) continue;
      t.exited = true;
      t.status = status;
      --running;
      const int code = exit_code_of(status);
      if (code != 0 && first_failure < 0 && !terminating) {
        first_failure = t.rank;
        result = code;
        if (WIFSIGNALED(status)) {
          std::fprintf(stderr, "mwmsrun: rank %d was killed by signal %d (%s); stopping the "
                       "other %d process(es)\n", t.rank, WTERMSIG(status),
                       ::strsignal(WTERMSIG(status)), running);
        } else {
          std::fprintf(stderr, "mwmsrun: rank %d exited with status %d; stopping the other %d "
                       "process(es)\n", t.rank, code, running);
        }
        terminating = true;
        // Note [mwmsrun shutdown]: a moment to end by themselves, then SIGTERM, then SIGKILL.
        const double settle = std::min(1.0, grace);
        term_at = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<long>(settle * 1000));
        kill_at = term_at + std::chrono::milliseconds(static_cast<long>(grace * 1000));
        term_pending = true;
      }
    }
    if (term_pending && running > 0 && std::chrono::steady_clock::now() >= term_at) {
      terminate_all(tasks);
      term_pending = false;
    }
    if (terminating && running > 0 && std::chrono::steady_clock::now() >= kill_at) {
      kill_all(tasks, grace);
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
  }
  // Output left in the pipes after the last exit.
  for (Task& t : tasks) {
    for (Stream& s : t.streams) {
      if (s.fd < 0) continue;
      char buf[65536];
      ssize_t got;
      while ((got = ::read(s.fd, buf, sizeof(buf))) > 0) s.pending.append(buf, static_cast<std::size_t>(got));
      flush_lines(s, t.rank, true);
      ::close(s.fd);
    }
  }
  return result;
}
