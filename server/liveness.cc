#include "server/liveness.h"

#include <chrono>

#include "spdlog/spdlog.h"

namespace inferd {

Liveness::Liveness(std::shared_ptr<Engine> engine, double timeout_s, std::function<void(bool)> set_serving)
    : engine_(std::move(engine)), timeout_s_(timeout_s), set_serving_(std::move(set_serving)) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { Watch(); });
}

void Liveness::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Liveness::Watch() {
  using Clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  const auto tick = std::chrono::duration<double>(std::min(0.05, timeout_s_ / 4));
  const EngineStats first = engine_->Stats();
  int64_t last_steps = first.engine_steps;
  uint64_t last_progress_count = first.step_progress;
  Clock::time_point last_progress = Clock::now();
  bool serving = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, tick, [&] { return stop_; })) {
    const EngineStats s = engine_->Stats();
    const Clock::time_point now = Clock::now();
    // A step that is long but moving (its layers advance) is busy, not stuck.
    if (s.engine_steps != last_steps || s.step_progress != last_progress_count || s.unfinished == 0) {
      last_steps = s.engine_steps;
      last_progress_count = s.step_progress;
      last_progress = now;
    }
    const bool stalled = now - last_progress > timeout;
    if (stalled && serving) {
      spdlog::warn("liveness: no engine progress for {:.1f} s while {} requests are pending: health NOT_SERVING",
                   std::chrono::duration<double>(now - last_progress).count(), s.unfinished);
      set_serving_(false);
      serving = false;
    } else if (!stalled && !serving) {
      spdlog::info("liveness: engine steps resumed: health SERVING");
      set_serving_(true);
      serving = true;
    }
  }
}

}  // namespace inferd
