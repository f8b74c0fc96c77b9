#include "engine/engine.h"

#include <malloc.h>

#include <algorithm>
#include <random>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/trace.h"
#if INFERD_WITH_CUDA
#include "engine/backends/cuda/cuda_backend.h"
#endif
#include "engine/check.h"
#include "engine/grammar/output_constraint.h"
#include "engine/runtime/philox.h"
#include "engine/runtime/step_input.h"
#include "engine/spec/draft_budget.h"
#include "engine/spec/verify.h"
#include "engine/status_macros.h"
#include "spdlog/spdlog.h"

namespace inferd {

namespace {

// engine.backend: cpu, cuda (when built with CUDA), or auto: cuda when a GPU is present and the model is
// supported there, else cpu, saying why.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Config& config, const Model& model) {
  const std::string& want = config.engine.backend;
#if INFERD_WITH_CUDA
  if (want == "cuda") return CreateCudaBackend(model, config.engine);
  if (want == "auto") {
    const std::string why = CudaUnsupportedReason(model.config);
    if (why.empty()) {
      spdlog::info("engine.backend = auto: cuda");
      return CreateCudaBackend(model, config.engine);
    }
    spdlog::info("engine.backend = auto: cpu, because {}", why);
  }
#else
  if (want == "cuda") {
    return absl::FailedPreconditionError(
        "engine.backend = 'cuda' is not available: this build has no CUDA (build with -DINFERD_CUDA=ON); use cpu or "
        "auto");
  }
  if (want == "auto") spdlog::info("engine.backend = auto: cpu, because this build has no CUDA");
#endif
  return CreateCpuBackend(model, config.engine);
}

// Whether the num_output-th generated token ends the request, and why: eos and stop token ids (once min_tokens
// are out), then max_tokens. Stop strings are the server's (Engine::StopAt).
FinishReason TokenFinish(const StoppingParams& stop, std::span<const int32_t> eos_ids, int32_t token,
                         int32_t num_output) {
  if (num_output >= stop.min_tokens) {
    if (!stop.ignore_eos && std::ranges::count(eos_ids, token)) return FinishReason::kEos;
    if (std::ranges::count(stop.stop_token_ids, token)) return FinishReason::kStopToken;
  }
  return num_output >= stop.max_tokens ? FinishReason::kLength : FinishReason::kNone;
}

}  // namespace

int64_t VisibleGpuFreeBytes() {
#if INFERD_WITH_CUDA
  return CudaVisibleFreeBytes();
#else
  return 0;
#endif
}

struct Engine::SequenceState {
  Sequence seq;
  uint64_t seed = 0;                      // the client's, or drawn at admission
  std::vector<int32_t> banned_until_min;  // eos and stop ids, not sampled before min_tokens
  std::vector<double> inter_token_s;      // between consecutive output tokens (metrics)
  absl::Time last_token;
  std::vector<TokenLogprob> prompt_logprobs;  // prompt_logprobs: [num_prompt_tokens - 1], sent with the first token
  std::optional<ConstraintState> constraint;  // structured output: where the output is in its constraint
  std::vector<uint32_t> allowed;              // the tokens it allows next, for the step being launched
  // Speculative decoding (null: it does not draft): where its drafts come from and how many it checks a step.
  std::unique_ptr<DraftSource> drafter;
  std::optional<DraftBudget> draft_budget;
  std::vector<int32_t> drafted;                    // its tokens, then its drafts: the drafted rows' spans
  std::vector<std::vector<uint32_t>> draft_masks;  // constrained: the masks of its 1 + k rows
};

StepLimits StepLimitsFor(const Config& config) {
  StepLimits limits;
  limits.max_num_seqs = config.scheduler.max_num_seqs;
  limits.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
  limits.block_size = config.engine.block_size;
  if (config.speculative.method != "off") {
    limits.max_drafts = config.speculative.max_tokens;
    limits.max_draft_batch = config.speculative.max_batch;
  }
  return limits;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config) {
  return Create(config, CreateBackend);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config, const BackendFactory& factory) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  const absl::Time t0 = absl::Now();
  const bool random_weights = config.model.load_format == "dummy";
  INFERD_ASSIGN_OR_RETURN(e->model_, LoadModel(config.model.path, {.random_weights = random_weights}));
  if (random_weights) {
    spdlog::warn("model.load_format = dummy: every weight is random; answers mean nothing (benchmarks and tests only)");
  }
  if (!config.model.name.empty()) e->model_->name = config.model.name;
  const ModelConfig& mc = e->model_->config;
  spdlog::info(
      "model '{}' loaded in {:.2f} s: {} with {} layers, hidden {}, heads {}/{} (q/kv), head_dim {}, vocab {}, "
      "weights {}",
      e->model_->name, absl::ToDoubleSeconds(absl::Now() - t0), mc.architecture, mc.num_layers, mc.hidden_size,
      mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size, e->model_->tensors.stored_dtype);

  INFERD_ASSIGN_OR_RETURN(
      e->constraint_compiler_,
      ConstraintCompiler::Create(*e->model_->tokenizer, mc.vocab_size, e->model_->eos_token_ids,
                                 {.max_bytes = config.engine.structured_output_max_bytes,
                                  .cache_bytes = int64_t{config.engine.structured_output_cache_mib} << 20,
                                  .in_reasoning = config.engine.structured_output_in_reasoning,
                                  .compile_timeout_ms = config.engine.structured_output_compile_timeout_ms}));
  if (config.speculative.method == "suffix" && config.speculative.suffix_cache_tokens > 0) {
    e->suffix_cache_ =
        std::make_unique<SuffixCache>(config.speculative.suffix_max_depth, config.speculative.suffix_cache_tokens);
  }
  if (config.speculative.method != "off") {
    spdlog::info("speculative decoding: {} drafts, up to {} tokens a step, while a step has at most {} sequences",
                 config.speculative.method, config.speculative.max_tokens,
                 config.speculative.max_batch > 0 ? absl::StrCat(config.speculative.max_batch) : "any number of");
  }
  INFERD_ASSIGN_OR_RETURN(e->backend_, factory(config, *e->model_));
  // Every backend holds its own weights now: the checkpoint is unmapped (for an 8B model ~0.2 s of start-up).
  ReleaseTensorBytes(&e->model_->tensors).clear();
  e->plan_ahead_ =
      config.engine.plan_ahead == "on" || (config.engine.plan_ahead == "auto" && e->backend_->name() == "cuda");
  const absl::Time t1 = absl::Now();
  spdlog::info("{} backend built its weights in {:.2f} s", e->backend_->name(), absl::ToDoubleSeconds(t1 - t0));

  // Measure the largest step, then give the KV pool what is left.
  INFERD_ASSIGN_OR_RETURN(e->memory_plan_, e->backend_->MeasureMemory(StepLimitsFor(config)));
  const absl::Time t2 = absl::Now();
  INFERD_ASSIGN_OR_RETURN(e->ceilings_, e->backend_->MeasureCeilings());
  if (e->ceilings_.read_bytes_per_s > 0) {
    spdlog::info("device ceilings, measured in {:.2f} s: read {:.1f} GB/s ({}), GEMM {:.1f} TFLOP/s ({})",
                 absl::ToDoubleSeconds(absl::Now() - t2), e->ceilings_.read_bytes_per_s * 1e-9, e->ceilings_.read_test,
                 e->ceilings_.gemm_flops_per_s * 1e-12, e->ceilings_.gemm_test);
  }
  INFERD_RETURN_IF_ERROR(SizeKvPool(config.engine, &e->memory_plan_));
  INFERD_RETURN_IF_ERROR(e->backend_->AllocateKvCache(e->memory_plan_));
  e->kernel_choices_ = e->backend_->KernelChoices();
  if (!e->kernel_choices_.empty()) {
    std::vector<std::string> parts;
    for (const KernelChoice& c : e->kernel_choices_) parts.push_back(absl::StrCat(c.op, ": ", c.choice));
    spdlog::info("{} kernels on {}: {}", e->backend_->name(), e->memory_plan_.device, absl::StrJoin(parts, "; "));
  }
  const MemoryPlan& plan = e->memory_plan_;
  spdlog::info("memory plan: {}", plan.ToString());
  e->step_cost_.emplace(mc, plan, config.engine.block_size, config.engine.tensor_parallel_size);

  e->pool_ = std::make_unique<BlockPool>(plan.num_blocks);
  e->kv_groups_ = KvGroupsOf(mc);
  if (e->kv_groups_.num_groups() > 1) {
    spdlog::info(
        "KV blocks hold {} layers each, in {} groups (windows {}): a window group's blocks go back to the "
        "pool once no position to come attends to them",
        e->kv_groups_.slots, e->kv_groups_.num_groups(), absl::StrJoin(e->kv_groups_.windows, ", "));
  }
  if (plan.num_host_cache_blocks > 0 && !config.scheduler.prefix_caching) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: engine.host_kv_cache_gib = ", config.engine.host_kv_cache_gib,
                     " is a tier of the prefix cache; it needs scheduler.prefix_caching: "
                     "true (it is false)"));
  }
  if (plan.num_host_blocks() > 0) {
    INFERD_RETURN_IF_ERROR(e->backend_->AllocateHostBlocks(plan.num_host_blocks()));
    e->host_pool_ = std::make_unique<BlockPool>(plan.num_host_blocks());
    const double mib = static_cast<double>(plan.kv_bytes_per_block) / 1048576.0;
    spdlog::info("host KV pool: {} blocks ({:.1f} MiB): swap space up to {} blocks, the prefix cache's host tier {}",
                 plan.num_host_blocks(), plan.num_host_blocks() * mib, plan.num_swap_blocks,
                 plan.num_host_cache_blocks > 0 ? "in the rest" : "off");
  }
  if (config.kv_events.enabled) {
    e->pool_->RecordEvents(&e->kv_events_, /*host=*/false);
    if (e->host_pool_) e->host_pool_->RecordEvents(&e->kv_events_, /*host=*/true);
  }
  e->scheduler_ = std::make_unique<Scheduler>(
      SchedulerLimits{.max_num_seqs = config.scheduler.max_num_seqs,
                      .max_num_batched_tokens = config.scheduler.max_num_batched_tokens,
                      .block_size = config.engine.block_size,
                      .prefix_caching = config.scheduler.prefix_caching,
                      .long_prefill_chunk = config.scheduler.long_prefill_chunk,
                      .priority_aging_s = config.scheduler.priority_aging_s,
                      .kv_windows = e->kv_groups_.windows},
      e->pool_.get(), e->host_pool_.get(),
      HostShares{.swap_blocks = plan.num_swap_blocks, .cache = plan.num_host_cache_blocks > 0});
  int64_t max_len = mc.max_position_embeddings;
  if (config.model.max_model_len > 0) {
    if (config.model.max_model_len > mc.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: model.max_model_len = ", config.model.max_model_len,
                       " exceeds the model's max_position_embeddings = ", mc.max_position_embeddings));
    }
    max_len = config.model.max_model_len;
  }
  // A request must fit in the pool alone, or it could wait forever: the longest whose blocks, every KV group's,
  // fit the pool.
  max_len = e->kv_groups_.MaxTokens(plan.num_blocks, config.engine.block_size, config.scheduler.max_num_batched_tokens,
                                    max_len);
  e->max_model_len_ = static_cast<int32_t>(max_len);

  // Warm-up: one real step through the backend (block 0 is free, so nothing is overwritten).
  StepInput warm = EmptyStepInput(config.engine.block_size, e->kv_groups_.num_groups());
  const int32_t zero = 0;
  AddSequence(&warm, {&zero, 1}, 0, 1, {&zero, 1}, /*sampled=*/true);
  warm.sampling.push_back(SamplingRow{.params = SamplingParams{.temperature = 0}, .position = 1});
  StepOutput warm_out;
  INFERD_RETURN_IF_ERROR(e->backend_->Step(warm, &warm_out));
#if defined(__GLIBC__)
  // Loading's temporaries (the checkpoint's metadata, tokenizer tables, weights reshaped) are freed by now, but
  // glibc keeps the freed pages inside its heap: hand them back (70 MB of Gemma 3 270M's 612 MB, 2026-11-28).
  malloc_trim(0);
#endif
  spdlog::info("engine ready in {:.2f} s{}", absl::ToDoubleSeconds(absl::Now() - t0),
               e->plan_ahead_ ? "; each step is planned while the one before it runs" : "");
  e->PublishStats();
  e->thread_ = std::thread([raw = e.get()] { raw->Loop(); });
  return e;
}

Engine::~Engine() {
  Stop();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Requests still active end as aborted, so no client waits forever.
  for (auto& [id, state] : active_) {
    RequestOutput out;
    out.finish = FinishReason::kAborted;
    out.error = absl::UnavailableError("the server is shutting down");
    state->seq.request.sink->Push(std::move(out));
  }
  active_.clear();
  std::deque<Request> submitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted.swap(submitted_);
  }
  for (Request& r : submitted) {
    RequestOutput out;
    out.finish = FinishReason::kAborted;
    out.error = absl::UnavailableError("the server is shutting down");
    r.sink->Push(std::move(out));
  }
}

absl::StatusOr<RequestHandle> Engine::Submit(Request request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_ || stop_) return absl::UnavailableError("the server is draining and takes no new requests");
  if (live_ids_.count(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", request.id, "' is already in use"));
  }
  if (static_cast<int64_t>(seats_.size()) >= config_.scheduler.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue is full (scheduler.max_queue = ", config_.scheduler.max_queue, "); retry later"));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  // A sequence never outgrows max_model_len, what the backend sized its page tables and the pool for: a prompt
  // that reaches it is refused, and a request ends there (FinishReason::kLength) whatever its max_tokens. The front
  // ends refuse both first, naming the field (server/request_builder.cc); this holds for any other caller.
  if (prompt_tokens >= max_model_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_tokens, " tokens; allowed: fewer than max_model_len = ", max_model_len_));
  }
  request.stopping.max_tokens =
      static_cast<int32_t>(std::min<int64_t>(request.stopping.max_tokens, max_model_len_ - prompt_tokens));
  if (not_started_tokens_ + prompt_tokens > config_.scheduler.max_queued_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue holds ", not_started_tokens_, " prompt tokens; this request's ", prompt_tokens,
        " would pass scheduler.max_queued_tokens = ", config_.scheduler.max_queued_tokens, "; retry later"));
  }
  const RequestHandle handle = next_handle_++;
  live_ids_.emplace(request.id, handle);
  seats_.emplace(handle, prompt_tokens);
  not_started_tokens_ += prompt_tokens;
  request.handle = handle;
  request.arrival = absl::Now();
  submitted_.push_back(std::move(request));
  cv_.notify_all();
  return handle;
}

bool Engine::Abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_ids_.find(request_id);
  if (it == live_ids_.end()) return false;
  aborts_.push_back(it->second);
  ReleaseSeat(it->second);
  cv_.notify_all();
  return true;
}

void Engine::StopAt(RequestHandle handle, int32_t num_output) {
  std::lock_guard<std::mutex> lock(mu_);
  stops_.emplace_back(handle, num_output);  // a handle that already finished is ignored by the engine thread
  cv_.notify_all();
}

void Engine::Cancel(RequestHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(handle);  // a handle that already finished is ignored by the engine thread
  ReleaseSeat(handle);
  cv_.notify_all();
}

void Engine::ReleaseSeat(RequestHandle handle) {
  const auto it = seats_.find(handle);
  if (it == seats_.end()) return;
  not_started_tokens_ -= it->second;
  seats_.erase(it);
}

void Engine::MarkStarted(Sequence* seq, absl::Time now) {
  if (seq->first_scheduled != absl::InfinitePast()) return;
  seq->first_scheduled = now;
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseSeat(seq->seq_id);
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.waiting += static_cast<int32_t>(submitted_.size());
  s.unfinished = static_cast<int32_t>(live_ids_.size());
  s.step_progress = backend_ ? backend_->Progress() : 0;
  return s;
}

void Engine::PublishStats() {
  if (!kv_events_.empty()) {
    std::lock_guard<std::mutex> lock(kv_events_mu_);
    if (on_kv_events_) on_kv_events_(std::move(kv_events_));
    kv_events_.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = scheduler_ ? static_cast<int32_t>(scheduler_->running().size()) : 0;
  stats_.waiting = scheduler_ ? static_cast<int32_t>(scheduler_->waiting().size()) : 0;
  stats_.total_blocks = pool_->num_total();
  stats_.free_blocks = pool_->num_free();
  stats_.cached_blocks = pool_->num_cached();
  stats_.engine_steps = engine_steps_;
  stats_.constraint_mask_s = constraint_mask_s_;
  stats_.constraint_masked_rows = constraint_masked_rows_;
  stats_.spec_drafts = spec_drafts_;
  stats_.spec_draft_tokens = spec_draft_tokens_;
  stats_.spec_accepted_tokens = spec_accepted_tokens_;
  if (scheduler_) {
    const CapacityCounters& k = scheduler_->counters();
    stats_.preemptions = k.preemptions;
    stats_.preempted_tokens = k.preempted_tokens;
    stats_.prefix_query_tokens = k.prefix_query_tokens;
    stats_.prefix_hit_tokens = k.prefix_hit_tokens;
    stats_.swapped_preemptions = k.swapped_preemptions;
    stats_.host_hit_tokens = k.host_hit_tokens;
    stats_.host_swap_blocks = scheduler_->capacity().swap_blocks_held();
    const int64_t block = memory_plan_.kv_bytes_per_block;
    stats_.copied_to_host_bytes = (k.swapped_blocks + k.offloaded_blocks) * block;
    stats_.copied_to_device_bytes = (k.swapped_in_blocks + k.restored_blocks) * block;
  }
  if (host_pool_) {
    stats_.host_blocks = host_pool_->num_total();
    stats_.host_cached_blocks = host_pool_->num_cached();
  }
  if (backend_) {
    const StepCounters k = backend_->counters();
    stats_.steps = k.steps;
    stats_.device_busy_s = k.device_busy_s;
    stats_.copy_s = k.copy_busy_s;
    stats_.copy_waited_s = k.copy_waited_s;
  }
}

void Engine::TakeQueued() {
  std::deque<Request> submitted;
  std::vector<RequestHandle> aborts;
  std::vector<std::pair<RequestHandle, int32_t>> stops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted.swap(submitted_);
    aborts.swap(aborts_);
    stops.swap(stops_);
  }
  const absl::Time now = absl::Now();
  for (Request& r : submitted) {
    auto state = std::make_unique<SequenceState>();
    Sequence& seq = state->seq;
    seq.seq_id = r.handle;
    seq.request = std::move(r);
    seq.tokens = seq.request.prompt;
    seq.num_prompt_tokens = seq.num_tokens();
    seq.arrival = seq.request.arrival;
    if (seq.request.sampling.seed) {
      state->seed = *seq.request.sampling.seed;
    } else {
      std::random_device rd;
      state->seed = (uint64_t{rd()} << 32) ^ rd();
    }
    if (seq.request.stopping.min_tokens > 0) {
      if (!seq.request.stopping.ignore_eos) state->banned_until_min = model_->eos_token_ids;
      for (int32_t id : seq.request.stopping.stop_token_ids) state->banned_until_min.push_back(id);
    }
    if (seq.request.constraint) state->constraint.emplace(seq.request.constraint);
    const SpeculativeSection& spec = config_.speculative;
    if (spec.method != "off" && seq.request.speculative) {
      if (spec.method == "ngram") {
        state->drafter = std::make_unique<NgramDrafts>(spec.ngram_min, spec.ngram_max);
      } else {
        state->drafter =
            std::make_unique<SuffixDrafts>(SuffixOptions{.max_depth = spec.suffix_max_depth}, suffix_cache_.get());
      }
      state->draft_budget.emplace(spec.max_tokens, std::min(spec.min_acceptance, 0.999));
    }
    scheduler_->Add(&seq);
    active_[seq.seq_id] = std::move(state);
  }
  for (auto [handle, num_output] : stops) {
    auto it = active_.find(handle);
    if (it == active_.end()) continue;
    Sequence* seq = &it->second->seq;
    // Tokens generated after the stop string's last are not the request's output: usage leaves them out.
    const size_t keep = static_cast<size_t>(seq->num_prompt_tokens) + std::max(num_output, 0);
    FinishSequence(seq, FinishReason::kStopString, absl::OkStatus(), {}, keep);
  }
  for (RequestHandle handle : aborts) {
    auto it = active_.find(handle);
    if (it != active_.end()) FinishSequence(&it->second->seq, FinishReason::kAborted, absl::OkStatus());
  }
  for (auto it = active_.begin(); it != active_.end();) {
    Sequence* seq = &(it++)->second->seq;  // advance first: FinishSequence erases
    if (now > seq->request.deadline) {
      FinishSequence(seq, FinishReason::kAborted, absl::DeadlineExceededError("the request's deadline expired"));
    }
  }
}

Usage Engine::UsageOf(const Sequence& seq, int32_t num_output) {
  return {seq.num_prompt_tokens, num_output, seq.num_cached_tokens};
}

Timing Engine::TimingOf(const Sequence& seq, absl::Time now) {
  auto secs = [&](absl::Time t) { return t == absl::InfinitePast() ? 0.0 : absl::ToDoubleSeconds(t - seq.arrival); };
  return {secs(seq.first_scheduled), secs(seq.first_token), absl::ToDoubleSeconds(now - seq.arrival)};
}

void Engine::FinishSequence(Sequence* seq, FinishReason reason, absl::Status error, RequestOutput out,
                            size_t keep_tokens) {
  scheduler_->Finish(seq);  // blocks are back in the pool before the next step
  while (IsPendingToken(seq->tokens.back())) seq->tokens.pop_back();  // sampled by a step still running: not output
  if (seq->tokens.size() > keep_tokens) seq->tokens.resize(keep_tokens);
  if (suffix_cache_ && seq->num_output_tokens() > 0) {
    suffix_cache_->AddOutput(std::vector<int32_t>(seq->tokens.begin() + seq->num_prompt_tokens, seq->tokens.end()));
  }
  out.finish = reason;
  out.error = std::move(error);
  out.usage = UsageOf(*seq, seq->num_output_tokens());
  out.timing = TimingOf(*seq, absl::Now());
  std::shared_ptr<OutputSink> sink = seq->request.sink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseSeat(seq->seq_id);
    auto it = live_ids_.find(seq->request.id);
    if (it != live_ids_.end() && it->second == seq->seq_id) live_ids_.erase(it);
  }
  const RequestHandle handle = seq->seq_id;
  if (on_request_) {
    FinishedRequest f{reason, out.error.code(), out.usage, out.timing, {}};
    if (auto it = active_.find(handle); it != active_.end()) f.inter_token_s = std::move(it->second->inter_token_s);
    on_request_(f);
  }
  auto node = active_.extract(handle);
  node.mapped()->seq.finished = true;
  // A launched step may still name it: kept until that step is collected (it drops the row).
  if (launches_ > collections_) retired_.emplace_back(launches_, std::move(node.mapped()));
  node = {};       // otherwise destroys *seq: nothing below reads it
  PublishStats();  // a client that saw its request finish sees its blocks free
  sink->Push(std::move(out));
}

struct Engine::InFlight {
  StepPlan plan;
  StepInput input;
  // Constrained rows launched ahead of the token their mask follows from (SamplingRow::allowed_later), in row
  // order: their masks go to the backend once the step before is collected (SupplyMasks).
  std::vector<SequenceState*> masks_later;
  absl::Time scheduled;   // when its planning began
  double schedule_s = 0;  // host time of its Schedule()
  double launch_s = 0;    // host time building its input and launching it
};

void Engine::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!in_flight_) {
        cv_.wait(lock, [&] {
          return stop_ || !submitted_.empty() || !aborts_.empty() || !stops_.empty() || !active_.empty();
        });
      }
      if (stop_) break;
    }
    iteration_start_ = absl::Now();
    TakeQueued();
    scheduler_->CopiesCompleted(backend_->CompletedCopies());  // sequences whose KV came in may run
    draft_next_ = WantsDrafts();
    if (in_flight_ && (sync_next_ || !CanPlanAhead())) CollectInFlight();
    const bool ahead = in_flight_ != nullptr;
    if (!ahead) ProposeDrafts();
    const absl::Time scheduling = absl::Now();
    StepPlan plan = [&] {
      TraceRange range("schedule");
      return scheduler_->Schedule(scheduling, ahead);
    }();
    const double schedule_s = absl::ToDoubleSeconds(absl::Now() - scheduling);
    sync_next_ = plan.needs_sync;
    for (const Sequence* seq : plan.preempted) {
      if (seq->swapped_blocks.empty()) {
        spdlog::info("request '{}' (priority {}) preempted, #{}: {} computed tokens to recompute", seq->request.id,
                     seq->priority(), seq->num_preemptions, seq->num_tokens() - 1);
      } else {
        spdlog::info("request '{}' (priority {}) preempted, #{}: {} blocks swapped out to host memory", seq->request.id,
                     seq->priority(), seq->num_preemptions, seq->swapped_blocks.size());
      }
    }
    if (!plan.copies.empty()) {
      if (absl::Status st = backend_->StartCopies(plan.copies); !st.ok()) {
        // The copies' requests cannot go on: their KV is unknown. They end with the error, like a failed step.
        spdlog::error("KV block copies failed: {}", st.ToString());
        std::vector<Sequence*> lost(plan.preempted.begin(), plan.preempted.end());
        for (const ScheduledSeq& sc : plan.seqs) lost.push_back(sc.seq);
        for (Sequence* seq : scheduler_->running()) {
          if (seq->loading_ticket == plan.copies.ticket) lost.push_back(seq);
        }
        for (Sequence* seq : lost) {
          if (!seq->finished) FinishSequence(seq, FinishReason::kAborted, st);
        }
        PublishStats();
        continue;
      }
    }
    // Step N + 1 is queued behind step N before N's tokens are taken: the device goes from one to the other
    // while the host emits N's tokens and plans N + 2.
    std::unique_ptr<InFlight> launched = plan.empty() ? nullptr : LaunchStep(std::move(plan), schedule_s);
    if (in_flight_ && !CollectInFlight() && launched) {
      // The step it read pending tokens from failed: its own tokens are meaningless.
      if (!launched->masks_later.empty()) SupplyMasks(*launched);
      in_flight_ = std::move(launched);
      const absl::Status lost = absl::InternalError("an earlier step whose tokens this step read failed");
      StepOutput ignored;
      (void)backend_->Collect(&ignored);
      ++collections_;
      for (const ScheduledSeq& s : in_flight_->plan.seqs) {
        if (!s.seq->finished) FinishSequence(s.seq, FinishReason::kAborted, lost);
      }
      in_flight_.reset();
    }
    if (launched && !launched->masks_later.empty()) SupplyMasks(*launched);
    if (launched) in_flight_ = std::move(launched);
    if (!in_flight_ && active_.empty() && scheduler_->copies_in_flight() > 0) {
      // Going idle with the last steps' write-backs still out: once they are done, the host blocks they held are
      // free, so that the stats an idle server publishes (and its KV events' subscribers) see every cached block.
      if (absl::Status st = backend_->WaitForCopies(scheduler_->copies_in_flight()); st.ok()) {
        scheduler_->CopiesCompleted(backend_->CompletedCopies());
      } else {
        spdlog::error("waiting for KV block copies failed: {}", st.ToString());
      }
    }
    PublishStats();
    if (!in_flight_ && !active_.empty() && scheduler_->copies_in_flight() > 0) {
      // Nothing could run but what waits for KV coming in: wait for those copies.
      if (absl::Status st = backend_->WaitForCopies(scheduler_->copies_in_flight()); !st.ok()) {
        spdlog::error("waiting for KV block copies failed: {}", st.ToString());
      }
    } else if (!in_flight_ && !active_.empty()) {
      // Nothing could be scheduled (cannot happen while one request fits the pool); avoid spinning.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  if (in_flight_) CollectInFlight();  // the backend is idle before Stop() ends the requests left
}

bool Engine::CanPlanAhead() const {
  if (!plan_ahead_) return false;
  // A step planned ahead cannot draft (its sequences' last tokens are pending), nor follow one that checked drafts
  // (how many tokens it keeps is not known): a step that drafts is planned after the one before is collected.
  if (draft_next_) return false;
  for (const ScheduledSeq& s : in_flight_->plan.seqs) {
    if (s.num_drafts > 0) return false;  // how many tokens it keeps is known once it is collected
    if (!s.wants_token || s.seq->finished) continue;
    // Penalties count the output so far on the host: the pending token must be known. (A constraint's mask,
    // which follows from it too, comes after the launch: SupplyMasks.)
    if (s.seq->request.sampling.penalized()) return false;
  }
  return true;
}

std::unique_ptr<Engine::InFlight> Engine::LaunchStep(StepPlan plan, double schedule_s) {
  const absl::Time now = absl::Now();
  for (const ScheduledSeq& s : plan.seqs) MarkStarted(s.seq, now);
  auto step = std::make_unique<InFlight>();
  step->scheduled = now - absl::Seconds(schedule_s);
  step->schedule_s = schedule_s;
  step->input = BuildStepInput(plan, config_.engine.block_size, kv_groups_.num_groups());
  StepInput& input = step->input;
  std::vector<ConstraintState*> constrained;
  std::vector<std::span<uint32_t>> masks;
  // Planned ahead, a constrained row's mask waits for the token the step in flight samples for it.
  const bool ahead = in_flight_ != nullptr;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.wants_token) continue;
    const Sequence& seq = *s.seq;
    SequenceState& st = *active_.at(seq.seq_id);
    if (s.num_drafts > 0) {
      st.drafted.assign(seq.tokens.begin(), seq.tokens.end());
      st.drafted.insert(st.drafted.end(), seq.drafts.begin(), seq.drafts.begin() + s.num_drafts);
    }
    // Row i checks draft i (row 0 is the ordinary decode row): sampled as the token at its position would be
    // without drafts, after the drafts before it.
    for (int32_t i = 0; i <= s.num_drafts; ++i) {
      SamplingRow& row = input.sampling.emplace_back();
      row.params = seq.request.sampling;
      row.position = seq.num_tokens() + i;
      row.uniform = SamplingUniform(st.seed, row.position);
      row.tokens = std::span<const int32_t>(i == 0 ? seq.tokens : st.drafted).first(row.position);
      row.num_prompt_tokens = seq.num_prompt_tokens;
      if (seq.num_output_tokens() + i < seq.request.stopping.min_tokens) row.banned = st.banned_until_min;
      row.top_logprobs = seq.request.top_logprobs;
      if (!st.constraint) continue;
      if (s.num_drafts > 0) {
        row.allowed = st.draft_masks[i];  // ConstrainDrafts filled them
      } else if (ahead) {
        st.allowed.resize(ConstraintState::MaskWords(model_->config.vocab_size));
        row.allowed_later = true;
        step->masks_later.push_back(&st);
      } else {
        st.allowed.resize(ConstraintState::MaskWords(model_->config.vocab_size));
        row.allowed = st.allowed;
        constrained.push_back(&*st.constraint);
        masks.push_back(st.allowed);
      }
    }
  }
  FillMasks(constrained, masks);
  for (const ScheduledSeq& s : plan.seqs) {  // prompt rows, in BuildStepInput's order
    for (int32_t p = s.rows_begin; p < s.rows_end; ++p) {
      SamplingRow& row = input.sampling.emplace_back();
      row.position = p + 1;
      row.top_logprobs = *s.seq->request.prompt_logprobs;
      row.target = s.seq->tokens[p + 1];
    }
  }
  absl::Status launched = backend_->Launch(input);
  step->launch_s = absl::ToDoubleSeconds(absl::Now() - now);
  if (!launched.ok()) {
    spdlog::error("step failed to launch: {}", launched.ToString());
    for (const ScheduledSeq& s : plan.seqs) FinishSequence(s.seq, FinishReason::kAborted, launched);
    return nullptr;
  }
  ++launches_;
  // Launch has read the rows' spans; Launched may move the tokens they point into.
  for (SamplingRow& row : input.sampling) {
    row.tokens = row.banned = {};
    row.allowed = {};
  }
  scheduler_->Launched(plan);
  step->plan = std::move(plan);
  return step;
}

bool Engine::WantsDrafts() {
  const SpeculativeSection& spec = config_.speculative;
  const int32_t n = static_cast<int32_t>(scheduler_->running().size());
  if (spec.method == "off" || n == 0 || (spec.max_batch > 0 && n > spec.max_batch)) return false;
  return !spec.adaptive || draft_payoff_.ShouldDraft(n);
}

void Engine::ProposeDrafts() {
  const std::deque<Sequence*>& running = scheduler_->running();
  for (Sequence* seq : running) seq->drafts.clear();
  if (!draft_next_) return;
  for (Sequence* seq : running) {
    SequenceState& st = *active_.at(seq->seq_id);
    if (!st.drafter || seq->num_tokens() - seq->num_computed != 1 || scheduler_->loading(*seq)) continue;
    // The step samples a token after its drafts: every token kept stays within max_tokens and max_model_len.
    const int32_t room =
        std::min(seq->request.stopping.max_tokens - seq->num_output_tokens(), max_model_len_ - seq->num_tokens()) - 1;
    if (room <= 0) continue;
    const int32_t k = std::min(st.draft_budget->Next(), room);
    if (k <= 0) continue;
    seq->drafts = st.drafter->Propose(seq->tokens, k);
    if (!seq->drafts.empty() && st.constraint) ConstrainDrafts(st);
  }
}

void Engine::ConstrainDrafts(SequenceState& st) {
  const absl::Time start = absl::Now();
  std::vector<int32_t>& drafts = st.seq.drafts;
  const int32_t words = ConstraintState::MaskWords(model_->config.vocab_size);
  st.draft_masks.resize(drafts.size() + 1);
  int32_t accepted = 0;  // drafts the constraint has taken, to undo
  for (size_t i = 0;; ++i) {
    std::vector<uint32_t>& mask = st.draft_masks[i];
    mask.resize(words);
    st.constraint->FillAllowed(mask);
    if (i == drafts.size()) break;
    const int32_t d = drafts[i];
    const bool allowed = (mask[d / 32] >> (d % 32) & 1) && st.constraint->Accept(d);
    accepted += allowed;
    // A draft the constraint refuses is never sampled; one that completes it ends the request, sampled as usual.
    if (!allowed || st.constraint->Terminated()) {
      drafts.resize(i);
      break;
    }
  }
  st.draft_masks.resize(drafts.size() + 1);
  if (accepted > 0) INFERD_CHECK(st.constraint->Rollback(accepted), "a constraint takes back the drafts it took");
  constraint_mask_s_ += absl::ToDoubleSeconds(absl::Now() - start);
  constraint_masked_rows_ += static_cast<int64_t>(st.draft_masks.size());
}

void Engine::FillMasks(std::span<ConstraintState* const> states, std::span<const std::span<uint32_t>> masks) {
  if (states.empty()) return;
  // The rows' masks together (one by one, or on xgrammar's pool: ConstraintBatch).
  const absl::Time start = absl::Now();
  if (!constraint_batch_) constraint_batch_ = std::make_unique<ConstraintBatch>(model_->config.vocab_size);
  constraint_batch_->FillAllowed(states, masks);
  constraint_mask_s_ += absl::ToDoubleSeconds(absl::Now() - start);
  constraint_masked_rows_ += static_cast<int64_t>(states.size());
}

void Engine::SupplyMasks(InFlight& step) {
  // The step before has been collected: each row's constraint has taken the token it follows. A request that
  // ended meanwhile (its row is dropped when the step is collected) gets every token.
  std::vector<ConstraintState*> constrained;
  std::vector<std::span<uint32_t>> masks;
  std::vector<std::span<const uint32_t>> rows;
  for (SequenceState* st : step.masks_later) {
    if (st->seq.finished) {
      std::fill(st->allowed.begin(), st->allowed.end(), ~0u);
    } else {
      constrained.push_back(&*st->constraint);
      masks.push_back(st->allowed);
    }
    rows.push_back(st->allowed);
  }
  FillMasks(constrained, masks);
  if (absl::Status st = backend_->SupplyMasks(rows); !st.ok()) {
    // The step cannot sample: Collect reports the failure and its requests end with it.
    spdlog::error("a step's masks could not be supplied: {}", st.ToString());
  }
}

bool Engine::CollectInFlight() {
  std::unique_ptr<InFlight> step = std::move(in_flight_);
  const StepPlan& plan = step->plan;
  const StepInput& input = step->input;
  StepOutput output;
  const absl::Time wait_start = absl::Now();
  absl::Status collected = backend_->Collect(&output);
  ++collections_;
  const absl::Time done = absl::Now();
  if (!collected.ok()) {
    spdlog::error("step failed: {}", collected.ToString());
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.seq->finished) FinishSequence(s.seq, FinishReason::kAborted, collected);
    }
    std::erase_if(retired_, [&](const auto& r) { return r.first <= collections_; });
    return false;
  }
  ++engine_steps_;
  const StepCounters counters = backend_->counters();
  int32_t num_sampled = 0, sampled_rows = 0, num_drafted = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    num_sampled += s.wants_token;
    sampled_rows += s.num_sampled_rows();
    num_drafted += s.num_drafts;
  }
  StepRecord record{.num_seqs = input.num_seqs(),
                    .num_tokens = input.num_tokens(),
                    .num_sampled = num_sampled,
                    .num_drafted = num_drafted,
                    .wall_s = absl::ToDoubleSeconds(done - step->scheduled),
                    .device_s = counters.last_device_s,
                    .graph = counters.last_graph,
                    .cost = step_cost_->Of(input, output.experts_touched)};
  TraceRange outputs_range("outputs");
  // Prompt rows first (they follow the sampled rows): a request's last ones arrive with its first token.
  size_t r = sampled_rows;
  for (const ScheduledSeq& s : plan.seqs) {
    const size_t row = r;
    r += s.num_prompt_rows();
    if (s.num_prompt_rows() == 0 || s.seq->finished) continue;
    std::vector<TokenLogprob>& scored = active_.at(s.seq->seq_id)->prompt_logprobs;
    scored.resize(s.seq->num_prompt_tokens - 1);
    for (int32_t p = s.rows_begin; p < s.rows_end; ++p)
      scored[p] = std::move(output.logprobs[row + (p - s.rows_begin)]);
  }
  r = 0;
  int32_t step_accepted = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.wants_token) continue;
    const size_t row = r;
    r += s.num_sampled_rows();
    Sequence* seq = s.seq;
    if (seq->finished) continue;  // ended (aborted, or stopped by an earlier token) after this step launched
    SequenceState& st = *active_.at(seq->seq_id);
    const int32_t position = s.start + s.num_new - s.num_drafts;
    // The tokens the step adds: its sampled one, or the drafts its rows confirmed and the token after them.
    std::vector<int32_t> kept = {output.tokens[row]};
    if (s.num_drafts > 0) {
      const std::span<const int32_t> drafts = std::span<const int32_t>(seq->drafts).first(s.num_drafts);
      const Verified v = VerifyDrafts(std::span<const int32_t>(output.tokens).subspan(row, s.num_drafts + 1), drafts);
      kept.assign(drafts.begin(), drafts.begin() + v.accepted);
      kept.push_back(v.next);
      st.draft_budget->Record(s.num_drafts, v.accepted);
      step_accepted += v.accepted;
      ++spec_drafts_;
      spec_draft_tokens_ += s.num_drafts;
      spec_accepted_tokens_ += v.accepted;
    }
    scheduler_->Resolve(seq, position, kept);
    for (size_t j = 0; j < kept.size(); ++j) {
      const int32_t token = kept[j], at = position + static_cast<int32_t>(j);
      ++record.num_generated;
      if (seq->first_token == absl::InfinitePast()) {
        seq->first_token = done;
      } else {
        st.inter_token_s.push_back(j == 0 ? absl::ToDoubleSeconds(done - st.last_token) : 0.0);
      }
      st.last_token = done;
      const int32_t num_output = at + 1 - seq->num_prompt_tokens;
      if (st.constraint && !st.constraint->Accept(token)) {  // cannot happen: the token was sampled under its mask
        seq->tokens.resize(at);
        FinishSequence(seq, FinishReason::kAborted,
                       absl::InternalError(absl::StrCat("token ", token, " broke the request's output constraint")));
        break;
      }
      FinishReason finish = TokenFinish(seq->request.stopping, model_->eos_token_ids, token, num_output);
      // A complete constraint allows nothing more: its stop token ends the request even with ignore_eos.
      if (finish == FinishReason::kNone && st.constraint && st.constraint->Terminated()) finish = FinishReason::kEos;
      RequestOutput out;
      out.token_ids = {token};
      if (seq->request.top_logprobs > 0) out.logprobs.push_back(std::move(output.logprobs[row + j]));
      if (seq->request.prompt_logprobs && at == seq->num_prompt_tokens) {
        out.prompt_logprobs = std::move(st.prompt_logprobs);
        st.prompt_logprobs.clear();
      }
      if (finish != FinishReason::kNone) {
        seq->tokens.resize(at +
                           1);  // tokens after it (kept drafts, or one the step now running samples) are not output
        FinishSequence(seq, finish, absl::OkStatus(), std::move(out));
        break;
      }
      out.usage = UsageOf(*seq, num_output);
      out.timing = TimingOf(*seq, done);
      seq->request.sink->Push(std::move(out));
    }
  }
  std::erase_if(retired_, [&](const auto& r) { return r.first <= collections_; });
  // Steps that decoded every sequence, with drafts or without, are what the choice to draft weighs, each at what
  // it cost the stream of tokens: the time since the step before was collected (a step planned ahead overlapped
  // it, so its own span, from scheduling, counts part of the step before twice), or its span after an idle spell.
  if (config_.speculative.method != "off" && record.decode() && record.num_seqs > 0) {
    const double since_last = absl::ToDoubleSeconds(done - last_collected_);
    draft_payoff_.Record(record.num_seqs, num_drafted, step_accepted, std::min(record.wall_s, since_last));
  }
  last_collected_ = done;
  if (on_step_) {
    record.cycle_s = absl::ToDoubleSeconds(absl::Now() - iteration_start_);
    on_step_(record);
  }
  if (engine_steps_ <= config_.engine.profile_steps) {
    const StepCounters& k = counters;
    const double wait_s = absl::ToDoubleSeconds(done - wait_start);
    const double outputs_s = absl::ToDoubleSeconds(absl::Now() - done);
    if (k.last_prepare_s > 0) {
      spdlog::info(
          "step {}: {} seqs, {} tokens: schedule {:.3f} ms, prepare and launch {:.3f} ms (pack, copy, plan, enqueue), "
          "GPU compute {:.3f} ms, GPU idle before it {:.3f} ms, host waiting for its tokens {:.3f} ms, outputs "
          "{:.3f} ms{}; device clock {:.3f}-{:.3f} ms",
          engine_steps_, plan.seqs.size(), plan.num_tokens, 1e3 * step->schedule_s, 1e3 * step->launch_s,
          1e3 * k.last_device_s, 1e3 * k.last_idle_before_s, 1e3 * wait_s, 1e3 * outputs_s,
          in_flight_ ? " (the next step was running)" : "", k.last_compute_start_ms, k.last_compute_end_ms);
      // The copy stream beside it, on the same clock (tests/gpu/copy_timeline.py draws both from this log).
      for (const CopyTiming& t : backend_->TakeCopyTimings()) {
        spdlog::info("copies {}: {} blocks out, {} in: device clock {:.3f}-{:.3f} ms, a step waited {:.3f} ms",
                     t.ticket, t.blocks_out, t.blocks_in, t.start_ms, t.end_ms, t.waited_ms);
      }
    } else {
      spdlog::info("step {}: {} seqs, {} tokens: schedule {:.3f} ms, {} backend step {:.3f} ms, outputs {:.3f} ms",
                   engine_steps_, plan.seqs.size(), plan.num_tokens, 1e3 * step->schedule_s, backend_->name(),
                   1e3 * (step->launch_s + wait_s), 1e3 * outputs_s);
    }
  }
  return true;
}

}  // namespace inferd
