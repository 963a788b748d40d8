// MonitoredTrainingSession and its hooks (mwms/session.h) over a scripted SessionCreator: when
// the session creates, saves, stops and recovers, and what each hook does.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mwms/session.h"

namespace {

using Catch::Matchers::Contains;

// A job without a network: global step = steps run; the chief "saves" by recording the step.
class FakeCreator : public mwms::SessionCreator {
 public:
  bool chief = true;
  std::int64_t restore_step = 0;  // what create_session() returns after a recovery
  std::int64_t step = 0;
  int creates = 0, abandons = 0, closes = 0;
  std::vector<std::int64_t> saved;
  bool fail_saves = false;
  int attempts = 0;
  bool ended = false;

  std::int64_t create_session(const std::string&) override {
    ++creates;
    if (creates > 1) step = restore_step;
    return step;
  }
  std::string save(const std::string& dir) override {
    ++attempts;
    if (fail_saves) throw mwms::CheckpointError("disk full", dir);
    saved.push_back(step);
    return dir + "/ckpt-" + std::to_string(step);
  }
  std::int64_t global_step() const override { return step; }
  bool is_chief() const override { return chief; }
  bool job_ended() const override { return ended; }
  void close() override { ++closes; }
  void abandon() noexcept override { ++abandons; }
};

double one_step(FakeCreator& c) {
  ++c.step;
  return 0.5;
}

}  // namespace

TEST_CASE("StopAtStepHook stops at last_step, or num_steps after the step the session began",
          "[unit][session]") {
  FakeCreator c;
  c.step = 7;  // as restored
  mwms::MonitoredTrainingSessionOptions o;
  auto by_num = std::make_shared<mwms::StopAtStepHook>(5, 0);
  o.hooks = {by_num};
  mwms::MonitoredTrainingSession s(c, o);
  CHECK(by_num->last_step() == 12);
  int runs = 0;
  while (!s.should_stop()) {
    s.run([&](std::int64_t) { return one_step(c); });
    ++runs;
  }
  CHECK(runs == 5);
  CHECK(c.step == 12);
  CHECK_THROWS_AS(s.run([&](std::int64_t) { return one_step(c); }), mwms::InvalidUsage);
  s.close();
  s.close();  // idempotent
  CHECK(c.closes == 1);

  FakeCreator past;
  past.step = 20;
  mwms::MonitoredTrainingSessionOptions p;
  p.hooks = {std::make_shared<mwms::StopAtStepHook>(0, 20)};
  mwms::MonitoredTrainingSession done(past, p);
  CHECK(done.should_stop());  // created at its last step: nothing to run

  CHECK_THROWS_AS(mwms::StopAtStepHook(0, 0), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::StopAtStepHook(3, 4), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::StopAtStepHook(-1, 4), mwms::InvalidArgument);
}

TEST_CASE("the chief's CheckpointSaverHook saves at the start, every save_steps and at the end",
          "[unit][session]") {
  FakeCreator c;
  mwms::MonitoredTrainingSessionOptions o;
  o.checkpoint_dir = "/ckpt";
  o.save_checkpoint_steps = 4;
  o.hooks = {std::make_shared<mwms::StopAtStepHook>(0, 10)};
  {
    mwms::MonitoredTrainingSession s(c, o);
    while (!s.should_stop()) s.run([&](std::int64_t) { return one_step(c); });
    s.close();
  }
  CHECK(c.saved == std::vector<std::int64_t>{0, 4, 8, 10});

  // Asynchronous ps steps jump: a save whenever a multiple of save_steps was crossed.
  FakeCreator j;
  mwms::MonitoredTrainingSessionOptions oj = o;
  oj.hooks = {std::make_shared<mwms::StopAtStepHook>(0, 12)};
  {
    mwms::MonitoredTrainingSession s(j, oj);
    while (!s.should_stop()) s.run([&](std::int64_t) { j.step += 3; return 0.0; });
    s.close();
  }
  CHECK(j.saved == std::vector<std::int64_t>{0, 6, 9, 12});

  // A worker other than the chief never saves; a failed save is not fatal.
  FakeCreator w;
  w.chief = false;
  {
    mwms::MonitoredTrainingSession s(w, o);
    for (int i = 0; i < 5; ++i) s.run([&](std::int64_t) { return one_step(w); });
    CHECK_THROWS_AS(s.save_checkpoint(), mwms::InvalidUsage);
    s.close();
  }
  CHECK(w.saved.empty());
  FakeCreator full;
  full.fail_saves = true;
  {
    mwms::MonitoredTrainingSession s(full, o);
    for (int i = 0; i < 5; ++i) s.run([&](std::int64_t) { return one_step(full); });
    s.close();
  }
  CHECK(full.step == 5);
  CHECK(full.attempts == 3);  // step 0, step 4, the end: a failure does not retry every step
  CHECK(full.closes == 1);

  CHECK_THROWS_AS(mwms::CheckpointSaverHook("", 1, 0), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::CheckpointSaverHook("/d", 1, 5), mwms::InvalidArgument);
  CHECK_THROWS_AS(mwms::CheckpointSaverHook("/d", 0, 0), mwms::InvalidArgument);
}

TEST_CASE("NanTensorHook fails on a NaN or infinite loss, or stops", "[unit][session]") {
  FakeCreator c;
  mwms::MonitoredTrainingSessionOptions o;
  o.hooks = {std::make_shared<mwms::NanTensorHook>()};
  mwms::MonitoredTrainingSession s(c, o);
  s.run([&](std::int64_t) { return one_step(c); });
  try {
    s.run([&](std::int64_t) {
      one_step(c);
      return std::nan("");
    });
    FAIL("no NanLossDuringTrainingError");
  } catch (const mwms::NanLossDuringTrainingError& e) {
    CHECK_THAT(e.what(), Contains("NaN") && Contains("global step 2"));
  }

  FakeCreator q;
  mwms::MonitoredTrainingSessionOptions oq;
  oq.hooks = {std::make_shared<mwms::NanTensorHook>(false)};
  mwms::MonitoredTrainingSession t(q, oq);
  t.run([&](std::int64_t) { return one_step(q); });
  CHECK_FALSE(t.should_stop());
  t.run([&](std::int64_t) {
    one_step(q);
    return HUGE_VAL;
  });
  CHECK(t.should_stop());
}

TEST_CASE("a PeerError or TimeoutError recovers up to max_recoveries, other errors end the run",
          "[unit][session]") {
  FakeCreator c;
  c.restore_step = 4;
  mwms::MonitoredTrainingSessionOptions o;
  o.max_recoveries = 2;
  auto stop = std::make_shared<mwms::StopAtStepHook>(0, 9);
  o.hooks = {stop};
  mwms::MonitoredTrainingSession s(c, o);
  for (int i = 0; i < 6; ++i) s.run([&](std::int64_t) { return one_step(c); });
  const mwms::SessionRunValues v = s.run([&](std::int64_t) -> double {
    throw mwms::PeerError("ps 0 at localhost:1 failed");
  });
  CHECK(v.recovered);
  CHECK(v.global_step == 4);
  CHECK(std::isnan(v.loss));
  CHECK(c.abandons == 1);
  CHECK(c.creates == 2);
  CHECK(s.recoveries() == 1);
  CHECK(s.created_at_step() == 4);
  CHECK(stop->last_step() == 9);  // the goal stays
  s.run([&](std::int64_t step) {
    CHECK(step == 4);  // the step function sees the restored step
    return one_step(c);
  });
  CHECK(s.run([&](std::int64_t) -> double { throw mwms::TimeoutError("no reply"); }).recovered);
  CHECK(s.recoveries() == 2);
  CHECK_THROWS_AS(s.run([&](std::int64_t) -> double { throw mwms::PeerError("again"); }),
                  mwms::PeerError);
  CHECK(c.abandons == 2);

  FakeCreator m;
  mwms::MonitoredTrainingSessionOptions om;
  om.max_recoveries = 5;
  mwms::MonitoredTrainingSession t(m, om);
  CHECK_THROWS_AS(t.run([&](std::int64_t) -> double {
                    throw mwms::CollectiveMismatchError("refused");
                  }),
                  mwms::CollectiveMismatchError);
  CHECK(t.recoveries() == 0);
  CHECK(m.abandons == 0);

  mwms::MonitoredTrainingSessionOptions bad;
  bad.max_recoveries = -1;
  CHECK_THROWS_AS(mwms::MonitoredTrainingSession(m, bad), mwms::InvalidArgument);
}

TEST_CASE("the job ending elsewhere stops the session, and LoggingHook reports every N steps",
          "[unit][session]") {
  FakeCreator c;
  std::vector<std::string> lines;
  mwms::MonitoredTrainingSessionOptions o;
  o.hooks = {std::make_shared<mwms::LoggingHook>(
      2, [&](const std::string& line) { lines.push_back(line); })};
  mwms::MonitoredTrainingSession s(c, o);
  for (int i = 0; i < 5; ++i) s.run([&](std::int64_t) { return one_step(c); });
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Contains("step 2: loss 0.5000"));
  CHECK_THAT(lines[1], Contains("step 4: loss 0.5000"));
  CHECK_FALSE(s.should_stop());
  c.ended = true;
  CHECK(s.should_stop());
  CHECK_THROWS_AS(mwms::LoggingHook(0), mwms::InvalidArgument);
}
