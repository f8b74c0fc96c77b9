#include "engine/engine.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "engine/check.h"
#include "engine/cpu_backend.h"
#include "engine/output_processor.h"
#include "engine/sampler.h"
#include "engine/status_macros.h"
#include "engine/step_input.h"
#include "spdlog/spdlog.h"

namespace inferd {

struct Engine::SequenceState {
  Sequence seq;
  std::unique_ptr<OutputProcessor> output;
  std::mt19937_64 rng;
  std::vector<int32_t> banned_until_min;  // eos and stop ids, not sampled before min_tokens
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const Config& config) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  const absl::Time t0 = absl::Now();
  INFERD_ASSIGN_OR_RETURN(e->model_, LoadModel(config.model.path));
  if (!config.model.name.empty()) e->model_->name = config.model.name;
  const ModelConfig& mc = e->model_->config;
  spdlog::info(
      "model '{}' loaded in {:.2f} s: {} with {} layers, hidden {}, heads {}/{} (q/kv), head_dim {}, vocab {}, "
      "weights {}",
      e->model_->name, absl::ToDoubleSeconds(absl::Now() - t0), mc.architecture, mc.num_layers, mc.hidden_size,
      mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size, e->model_->weights.stored_dtype);

  std::string backend = config.engine.backend;
  if (backend == "cuda") {
    return absl::UnimplementedError(
        "engine.backend = 'cuda' is not available in this build: the CUDA backend has not landed yet; use cpu or auto");
  }
  backend = "cpu";
  INFERD_ASSIGN_OR_RETURN(const MemoryPlan plan, PlanCpuMemory(*e->model_, config.engine, config.scheduler));
  INFERD_ASSIGN_OR_RETURN(e->backend_, CreateCpuBackend(*e->model_, config.engine, plan));
  e->backend_name_ = backend;
  spdlog::info("memory plan ({}): {}", backend, plan.ToString());

  e->pool_ = std::make_unique<BlockPool>(plan.num_blocks);
  e->scheduler_ = std::make_unique<Scheduler>(
      SchedulerLimits{config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens, config.engine.block_size},
      e->pool_.get());
  int64_t max_len = mc.max_position_embeddings;
  if (config.model.max_model_len > 0) {
    if (config.model.max_model_len > mc.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: model.max_model_len = ", config.model.max_model_len,
                       " exceeds the model's max_position_embeddings = ", mc.max_position_embeddings));
    }
    max_len = config.model.max_model_len;
  }
  // A request must fit in the pool alone, or it could wait forever.
  max_len = std::min<int64_t>(max_len, int64_t{plan.num_blocks} * config.engine.block_size);
  e->max_model_len_ = static_cast<int32_t>(max_len);

  // Warm-up: one real step through the backend (block 0 is free, so nothing is overwritten).
  StepInput warm;
  warm.token_ids = {0};
  warm.positions = {0};
  warm.slot_mapping = {0};
  warm.query_start = {0, 1};
  warm.context_lens = {1};
  warm.block_tables = {0};
  warm.max_blocks_per_seq = 1;
  warm.logits_indices = {0};
  std::vector<float> logits;
  INFERD_RETURN_IF_ERROR(e->backend_->Forward(warm, &logits));
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

absl::Status Engine::Submit(Request request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_ || stop_) return absl::UnavailableError("the server is draining and takes no new requests");
  if (known_ids_.count(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", request.id, "' is already in use"));
  }
  if (stats_.waiting + static_cast<int32_t>(submitted_.size()) >= config_.scheduler.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue is full (scheduler.max_queue = ", config_.scheduler.max_queue, "); retry later"));
  }
  known_ids_.emplace(request.id, 0);
  request.arrival = absl::Now();
  submitted_.push_back(std::move(request));
  cv_.notify_all();
  return absl::OkStatus();
}

bool Engine::Abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!known_ids_.count(request_id)) return false;
  aborts_.push_back(request_id);
  cv_.notify_all();
  return true;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.waiting += static_cast<int32_t>(submitted_.size());
  return s;
}

void Engine::PublishStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = scheduler_ ? static_cast<int32_t>(scheduler_->running().size()) : 0;
  stats_.waiting = scheduler_ ? static_cast<int32_t>(scheduler_->waiting().size()) : 0;
  stats_.total_blocks = pool_->num_total();
  stats_.free_blocks = pool_->num_free();
}

void Engine::TakeQueued() {
  std::deque<Request> submitted;
  std::vector<std::string> aborts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted.swap(submitted_);
    aborts.swap(aborts_);
  }
  const absl::Time now = absl::Now();
  for (Request& r : submitted) {
    auto state = std::make_unique<SequenceState>();
    Sequence& seq = state->seq;
    seq.seq_id = next_seq_id_++;
    seq.request = std::move(r);
    seq.tokens = seq.request.prompt;
    seq.num_prompt_tokens = seq.num_tokens();
    seq.arrival = seq.request.arrival;
    state->output = std::make_unique<OutputProcessor>(model_->tokenizer.get(), &seq.request, model_->eos_token_ids);
    state->rng.seed(seq.request.sampling.seed ? *seq.request.sampling.seed : std::random_device{}());
    if (seq.request.stopping.min_tokens > 0) {
      if (!seq.request.stopping.ignore_eos) state->banned_until_min = model_->eos_token_ids;
      for (int32_t id : seq.request.stopping.stop_token_ids) state->banned_until_min.push_back(id);
    }
    scheduler_->Add(&seq);
    const std::string id = seq.request.id;
    active_[id] = std::move(state);
  }
  for (const std::string& id : aborts) {
    auto it = active_.find(id);
    if (it != active_.end()) FinishSequence(&it->second->seq, FinishReason::kAborted, absl::OkStatus());
  }
  for (auto it = active_.begin(); it != active_.end();) {
    Sequence* seq = &(it++)->second->seq;  // advance first: FinishSequence erases
    if (now > seq->request.deadline) {
      FinishSequence(seq, FinishReason::kAborted, absl::DeadlineExceededError("the request's deadline expired"));
    }
  }
}

void Engine::FinishSequence(Sequence* seq, FinishReason reason, absl::Status error, RequestOutput out) {
  scheduler_->Finish(seq);  // blocks are back in the pool before the next step
  out.finish = reason;
  out.error = std::move(error);
  const absl::Time now = absl::Now();
  out.usage = {seq->num_prompt_tokens, seq->num_output_tokens(), 0};
  auto secs = [&](absl::Time t) { return t == absl::InfinitePast() ? 0.0 : absl::ToDoubleSeconds(t - seq->arrival); };
  out.timing = {secs(seq->first_scheduled), secs(seq->first_token), absl::ToDoubleSeconds(now - seq->arrival)};
  std::shared_ptr<OutputSink> sink = seq->request.sink;
  const std::string id = seq->request.id;
  active_.erase(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    known_ids_.erase(id);
  }
  PublishStats();  // a client that saw its request finish sees its blocks free
  sink->Push(std::move(out));
}

void Engine::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !submitted_.empty() || !aborts_.empty() || !active_.empty(); });
      if (stop_) return;
    }
    TakeQueued();
    const StepPlan plan = scheduler_->Schedule();
    if (!plan.empty()) RunStep(plan);
    PublishStats();
    if (plan.empty() && !active_.empty()) {
      // Nothing could be scheduled (cannot happen while one request fits the pool); avoid spinning.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
}

void Engine::RunStep(const StepPlan& plan) {
  const absl::Time now = absl::Now();
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.seq->first_scheduled == absl::InfinitePast()) s.seq->first_scheduled = now;
  }
  const StepInput input = BuildStepInput(plan, config_.engine.block_size);
  std::vector<float> logits;
  if (absl::Status st = backend_->Forward(input, &logits); !st.ok()) {
    spdlog::error("forward failed: {}", st.ToString());
    for (const ScheduledSeq& s : plan.seqs) FinishSequence(s.seq, FinishReason::kAborted, st);
    return;
  }
  const int32_t vocab = model_->config.vocab_size;
  std::vector<int32_t> sampled;
  std::vector<SampleResult> results;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.wants_token) continue;
    SequenceState& st = *active_.at(s.seq->request.id);
    SampleContext ctx;
    ctx.params = &s.seq->request.sampling;
    ctx.tokens = s.seq->tokens;
    ctx.num_prompt_tokens = s.seq->num_prompt_tokens;
    if (s.seq->num_output_tokens() < s.seq->request.stopping.min_tokens) ctx.banned = st.banned_until_min;
    ctx.top_logprobs = s.seq->request.top_logprobs;
    std::span<float> row(logits.data() + results.size() * vocab, vocab);
    results.push_back(Sample(row, ctx, st.rng));
    sampled.push_back(results.back().token);
  }
  scheduler_->Update(plan, sampled);

  const absl::Time done = absl::Now();
  size_t r = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.wants_token) continue;
    Sequence* seq = s.seq;
    SequenceState& st = *active_.at(seq->request.id);
    const SampleResult& res = results[r++];
    if (seq->first_token == absl::InfinitePast()) seq->first_token = done;
    FinishReason finish = FinishReason::kNone;
    std::string text = st.output->Add(res.token, seq->num_output_tokens(), &finish);
    RequestOutput out;
    out.token_ids = {res.token};
    out.text = std::move(text);
    if (res.has_logprob) out.logprobs.push_back(res.logprob);
    if (finish != FinishReason::kNone) {
      FinishSequence(seq, finish, absl::OkStatus(), std::move(out));
      continue;
    }
    seq->request.sink->Push(std::move(out));
  }
}

}  // namespace inferd
