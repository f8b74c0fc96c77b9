#include "engine/backends/cpu/spin_pool.h"

#include <pthread.h>
#include <sched.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace inferd {
namespace {

// Pauses (each some tens of cycles) a waiting thread spins through before it yields its core between checks.
constexpr int kPausesBeforeYield = 2000;

void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

SpinPool::SpinPool(int threads) {
  const std::vector<int> cpus = AllowedCpus();
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { Work(i); });
    if (static_cast<int>(cpus.size()) >= threads) {  // worker i on the i-th allowed CPU after the first
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[i], &one);
      pthread_setaffinity_np(workers_.back().native_handle(), sizeof(one), &one);  // a hint: failure is harmless
    }
  }
}

SpinPool::~SpinPool() {
  stop_ = true;
  generation_.fetch_add(1);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void SpinPool::Run(int64_t n, int64_t parts, Call call, void* fn) {
  call_ = call;
  fn_ = fn;
  n_ = n;
  parts_ = parts;
  done_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst with the workers' sleepers_ increment: one side sees the other
  if (sleepers_.load() > 0) generation_.notify_all();
  RunPart(0);
  // Spin for the others, then yield to them: on cores shared with more threads than there are, a worker that has
  // not been scheduled yet needs this thread's core.
  for (int spins = 0; done_.load(std::memory_order_acquire) != static_cast<int>(workers_.size()); ++spins) {
    if (spins < kPausesBeforeYield) {
      Pause();
    } else {
      std::this_thread::yield();
    }
  }
}

void SpinPool::RunPart(int index) {
  if (index >= parts_) return;
  const int64_t begin = n_ * index / parts_, end = n_ * (index + 1) / parts_;
  call_(fn_, begin, end);
}

void SpinPool::Work(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (int spins = 0; now == seen; now = generation_.load(std::memory_order_acquire)) {
      if (++spins < kPausesBeforeYield) {
        Pause();
      } else {
        std::this_thread::yield();  // as above: the thread that will post the job may need this core
      }
      if (spins % 64 != 0 || std::chrono::steady_clock::now() < deadline) continue;
      sleepers_.fetch_add(1);
      generation_.wait(seen);  // returns at once if a job came after the load above
      sleepers_.fetch_sub(1);
      deadline = std::chrono::steady_clock::now() + kSpin;
    }
    seen = now;
    if (stop_) return;
    RunPart(index);
    done_.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace inferd
