// Health that means progress: while requests are pending and for server.liveness_timeout_s neither an engine step
// has finished nor the step running has advanced (Backend::Progress: a long cpu prefill moves row by row),
// health reports NOT_SERVING; once steps resume, SERVING again. Each flip is logged.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"

namespace inferd {

class Liveness {
 public:
  // set_serving flips the health status; timeout_s 0 watches nothing.
  Liveness(std::shared_ptr<Engine> engine, double timeout_s, std::function<void(bool)> set_serving);
  ~Liveness() { Stop(); }
  // Stops watching (before the drain takes the health status over). Idempotent.
  void Stop();

 private:
  void Watch();

  std::shared_ptr<Engine> engine_;
  const double timeout_s_;
  std::function<void(bool)> set_serving_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace inferd
