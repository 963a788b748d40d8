// mwmsrun's output: every line of every task, prefixed with its rank ("[1] ...").
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "mwmsrun.h"

namespace mwmsrun {

void flush_lines(Stream& s, int rank, bool all) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(s.out, "[%d] %.*s\n", rank, static_cast<int>(nl - start),
                 s.pending.data() + start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (all && !s.pending.empty()) {
    std::fprintf(s.out, "[%d] %s\n", rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.out);
}

void read_stream(Stream& s, int rank) {
  char buf[65536];
  const ssize_t got = ::read(s.fd, buf, sizeof(buf));
  if (got > 0) {
    s.pending.append(buf, static_cast<std::size_t>(got));
    flush_lines(s, rank, false);
  } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
    flush_lines(s, rank, true);
    ::close(s.fd);
    s.fd = -1;
  }
}

void drain_output(std::vector<Task>& tasks) {
  for (Task& t : tasks) {
    for (Stream& s : t.streams) {
      if (s.fd < 0) continue;
      char buf[65536];
      ssize_t got;
      while ((got = ::read(s.fd, buf, sizeof(buf))) > 0)
        s.pending.append(buf, static_cast<std::size_t>(got));
      flush_lines(s, t.rank, true);
      ::close(s.fd);
    }
  }
}

}  // namespace mwmsrun
