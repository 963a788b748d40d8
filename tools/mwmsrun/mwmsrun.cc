// mwmsrun: a local launcher (horovodrun -np N on one host, torchrun --standalone, the Spark
// TensorFlow Distributor's MirroredStrategyRunner(local_mode=True)). Starts N processes of a
// program on this machine, each with its own TF_CONFIG for a cluster of free loopback ports and,
// with N > 1, the socket already listening on its port (inherited, named by MWMS_LISTEN_FD: Note
// [inherited listener] in src/bootstrap/rendezvous.cc, so no other process can take the port
// before the task listens), prefixes every output line with the task's rank ("[1] ..."),
// forwards SIGINT/SIGTERM/SIGHUP, ends the others when one fails and exits with the first
// failure's status. Its parts: mwmsrun.h.
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
#include "mwmsrun.h"

#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace mwmsrun;
  Options o;
  if (const int rc = parse_command_line(argc, argv, o); rc >= 0) return rc;
  std::vector<std::string> addresses;
  std::vector<Listener> listeners;  // -np N: task r's listening socket (Note [inherited listener])
  if (const int rc = assign_addresses(o, addresses, listeners); rc >= 0) return rc;
  const int n = static_cast<int>(addresses.size());
  const int training = n - o.num_ps;
  if (training < 1) {
    std::cerr << "mwmsrun: error: --ps " << o.num_ps << " leaves no training task (" << n
              << " in all): a parameter-server job needs at least one worker" << std::endl;
    return 2;
  }
  if (o.print_only || n == 1) {
    // Nothing listens: printed for tasks started elsewhere, or one task (world size 1, which
    // has no listener).
    for (Listener& l : listeners) ::close(l.fd);
    listeners.clear();
  }
  if (o.print_only) {
    for (int r = 0; r < n; ++r) {
      const std::string& a = addresses[static_cast<std::size_t>(r)];
      std::cout << "# task " << r << " on " << a.substr(0, a.rfind(':')) << "\nTF_CONFIG='"
                << tf_config(addresses, r, o.chief, training) << "'\n";
    }
    return 0;
  }
  if (o.command.empty()) {
    std::cerr << "mwmsrun: error: no PROGRAM to run (mwmsrun -np N [--] PROGRAM ARGS...)"
              << std::endl;
    return 2;
  }
  if (!install_signal_forwarding()) return 2;
  std::vector<Task> tasks;
  if (const int rc = start_tasks(o, addresses, training, listeners, tasks); rc >= 0) return rc;
  const int result = supervise(tasks, o.grace);
  drain_output(tasks);  // output left in the pipes after the last exit
  return result;
}
