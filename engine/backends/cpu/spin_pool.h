// The cpu backend's threads: a fixed team that runs a loop's parts side by side and spins between jobs, so that
// the ~200 small loops of a decode step (each layer's products, attention, norms) cost about a microsecond each to
// hand out. Under OpenMP those fork-joins cost more than splitting saved (a one-row step of SmolLM2-135M took
// 16–18 ms split over two cores against 6.5–7 ms on one), so small steps ran on one thread; on this team they split
// (kernels/NOTES.md). A waiting thread yields its core after a few thousand pauses (on cores shared with more
// threads than there are, the one it waits for may need it), and a worker that sees no job for kSpin sleeps on a
// futex until the next one.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace inferd {

class SpinPool {
 public:
  // `threads` in all: the caller of For and threads - 1 workers, each pinned to its own CPU of those this process
  // may run on (the caller's left to the scheduler), where there are enough of them.
  explicit SpinPool(int threads);
  ~SpinPool();
  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end) over [0, n) cut into contiguous parts of at least `grain` items, at most one per thread, the
  // first on the calling thread; returns when every part has. One caller at a time; fn must not call For.
  template <typename F>
  void For(int64_t n, int64_t grain, F&& fn) {
    const int64_t parts =
        n <= 0 ? 0 : std::min<int64_t>(threads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
    if (parts <= 1) {
      if (n > 0) fn(int64_t{0}, n);
      return;
    }
    Run(
        n, parts, [](void* f, int64_t begin, int64_t end) { (*static_cast<F*>(f))(begin, end); }, &fn);
  }

  // How long a worker spins for the next job before it sleeps.
  static constexpr std::chrono::microseconds kSpin{500};

 private:
  using Call = void (*)(void* fn, int64_t begin, int64_t end);
  void Run(int64_t n, int64_t parts, Call call, void* fn);
  void RunPart(int index);
  void Work(int index);

  std::vector<std::thread> workers_;
  // The job: fn over [0, n) in parts; generation_ counts jobs (a worker runs each new one), done_ the workers
  // finished with the current one.
  Call call_ = nullptr;
  void* fn_ = nullptr;
  int64_t n_ = 0, parts_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleepers_{0};
  bool stop_ = false;  // written before the last generation_ bump
};

}  // namespace inferd
