// mwmsrun's parts (the program itself: mwmsrun.cc), one file each: the command line
// (command_line.cc), the ports and TF_CONFIG of each task (cluster.cc), starting and supervising
// the processes (supervise.cc) and their rank-prefixed output (output.cc).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

namespace mwmsrun {

/// What the command line asked for (defaults as --help prints them).
struct Options {
  int np = 0;                        ///< -np N: training tasks on this machine
  bool chief = false;                ///< --chief: task 0 is the chief
  int num_ps = 0;                    ///< --ps M: parameter-server tasks after the N training tasks
  double grace = 5;                  ///< --grace: seconds between SIGTERM and SIGKILL
  std::string hosts;                 ///< --hosts HOST[:SLOTS],... (with --print-tf-config only)
  bool print_only = false;           ///< --print-tf-config
  int port_base = 23456;             ///< --port-base (with --hosts)
  std::vector<std::string> command;  ///< PROGRAM and its arguments
};

/// Parses argv into `o`. Returns -1 to go on, else the status to exit with (0 after --help, 2
/// for a bad command line, the message already on stderr).
int parse_command_line(int argc, char** argv, Options& o);

/// A socket listening on a task's port, close-on-exec (Note [inherited listener]).
struct Listener {
  int port = 0;
  int fd = -1;
};

/// Every task's address ("host:port", rank order) and, for -np N, its listening socket.
/// Returns -1 to go on, else the status to exit with (the message already on stderr).
int assign_addresses(const Options& o, std::vector<std::string>& addresses,
                     std::vector<Listener>& listeners);

/// TF_CONFIG of task `rank` of a cluster whose tasks are at `addresses`: the first `training`
/// are the training tasks (with_chief: the first of them is the chief, the others workers
/// 0..n-2), the rest the ps tasks 0..M-1 (--ps M).
std::string tf_config(const std::vector<std::string>& addresses, int rank, bool with_chief,
                      int training);

/// One of a task's output pipes.
struct Stream {
  int fd = -1;
  std::string pending;  ///< bytes after the last newline
  FILE* out = nullptr;  ///< where its lines go (stdout or stderr)
};

/// A started process.
struct Task {
  int rank = 0;
  pid_t pid = -1;
  Stream streams[2];  ///< stdout, stderr
  bool exited = false;
  int status = 0;
};

/// Writes every complete line of `s` (and, with `all`, the rest) prefixed "[rank] ".
void flush_lines(Stream& s, int rank, bool all);
/// Reads what `s` has (one read); at end of file or an error, flushes the rest and closes it.
void read_stream(Stream& s, int rank);
/// After the last exit: everything left in the pipes, prefixed, and the pipes closed.
void drain_output(std::vector<Task>& tasks);

/// SIGINT/SIGTERM/SIGHUP are recorded and wake the supervision loop (self-pipe); SIGPIPE is
/// ignored. False (perror printed) when the pipe cannot be made.
bool install_signal_forwarding();

/// Starts one process of o.command per address with its TF_CONFIG and listener into `tasks`.
/// Returns -1 to go on, else 2 (a program that cannot start: every started process killed and
/// reaped, the message on stderr).
int start_tasks(const Options& o, const std::vector<std::string>& addresses, int training,
                const std::vector<Listener>& listeners, std::vector<Task>& tasks);

/// Forwards signals, prefixes output and stops every task when one fails (Note [mwmsrun
/// shutdown]) until every task has been reaped. Returns mwmsrun's exit status.
int supervise(std::vector<Task>& tasks, double grace);

}  // namespace mwmsrun
