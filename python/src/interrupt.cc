// Interruptible waits (Note [python interrupts]).
#include "interrupt.h"

#include <chrono>
#include <thread>

#include "mwms/errors.h"

namespace mwms::python {

void wait_interruptibly(const std::function<bool(double)>& wait_slice,
                        const std::function<void()>& on_interrupt) {
  for (;;) {
    bool done;
    {
      nb::gil_scoped_release nogil;
      done = wait_slice(kSliceSeconds);
    }
    if (done) return;
    // Runs the handlers (main thread only; elsewhere it does nothing and returns 0).
    if (PyErr_CheckSignals() != 0) {
      on_interrupt();
      throw nb::python_error();
    }
  }
}

void wait_work(Work& work, const std::function<void()>& on_interrupt) {
  wait_interruptibly(
      [&work](double seconds) {
        try {
          work.wait(seconds);
          return true;
        } catch (const TimeoutError&) {
          // Either this slice ended, or the collective itself failed with a TimeoutError: the
          // Work has then completed, and wait() rethrows the collective's own error.
          if (!work.test()) return false;
          work.wait();
          return true;
        }
      },
      on_interrupt);
}

std::shared_ptr<Job> Job::start(std::function<void()> fn) {
  auto job = std::make_shared<Job>();
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
  return job;
}

bool Job::wait_for(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Job::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void Job::run(std::function<void()> fn, const std::function<void()>& on_interrupt,
              std::shared_ptr<Job>* stuck) {
  std::shared_ptr<Job> job;
  {
    nb::gil_scoped_release nogil;  // starting a thread may take a while on a loaded machine
    job = start(std::move(fn));
  }
  wait_interruptibly([&job](double seconds) { return job->wait_for(seconds); },
                     [&] {
                       *stuck = job;
                       on_interrupt();
                     });
}

}  // namespace mwms::python
