#include "server/proto_conversion.h"

#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "server/status_mapping.h"

namespace inferd {
namespace {

void SetLogprob(const TokenLogprob& lp, v1::TokenLogprob* p) {
  p->set_token_id(lp.token_id);
  p->set_logprob(lp.logprob);
  for (const TopLogprob& t : lp.top) {
    v1::TopLogprob* tp = p->add_top();
    tp->set_token_id(t.token_id);
    tp->set_logprob(t.logprob);
  }
}

template <typename Message>
void Append(const RequestOutput& out, const std::string& text, Message* m) {
  for (int32_t id : out.token_ids) m->add_token_ids(id);
  m->mutable_text()->append(text);
  for (const TokenLogprob& lp : out.logprobs) SetLogprob(lp, m->add_logprobs());
  for (const TokenLogprob& lp : out.prompt_logprobs) SetLogprob(lp, m->add_prompt_logprobs());
  if (out.finish != FinishReason::kNone) {
    m->set_finish_reason(ToProto(out.finish));
    m->mutable_usage()->set_prompt_tokens(out.usage.prompt_tokens);
    m->mutable_usage()->set_completion_tokens(out.usage.completion_tokens);
    m->mutable_usage()->set_cached_prompt_tokens(out.usage.cached_prompt_tokens);
    m->mutable_timing()->set_queue_s(out.timing.queue_s);
    m->mutable_timing()->set_time_to_first_token_s(out.timing.time_to_first_token_s);
    m->mutable_timing()->set_total_s(out.timing.total_s);
  }
}

}  // namespace

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, const char* name, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError(absl::StrCat(name, " could not be read"));
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " does not parse: a string field holds invalid UTF-8, or the message is malformed; allowed: a ", name,
        " with valid UTF-8 in every string field"));
  }
  return absl::OkStatus();
}

void Serialize(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  grpc::Slice slice(message.SerializeAsString());
  *out = grpc::ByteBuffer(&slice, 1);
}

void AppendOutput(const RequestOutput& out, const std::string& text, v1::GenerateChunk* chunk) {
  Append(out, text, chunk);
}
void AppendOutput(const RequestOutput& out, const std::string& text, v1::GenerateResult* result) {
  Append(out, text, result);
}

v1::ModelInfo ToModelInfo(const Engine& engine) {
  const Model& m = engine.model();
  v1::ModelInfo info;
  info.set_name(m.name);
  info.set_architecture(m.config.architecture);
  info.set_vocab_size(m.config.vocab_size);
  info.set_max_model_len(engine.max_model_len());
  for (int32_t id : m.eos_token_ids) info.add_eos_token_ids(id);
  if (m.bos_token_id) info.set_bos_token_id(*m.bos_token_id);
  info.set_dtype(m.tensors.stored_dtype);
  info.set_block_size(engine.block_size());
  return info;
}

v1::ServerInfo ToServerInfo(const Engine* engine, const std::string& version) {
  v1::ServerInfo info;
  info.set_version(version);
  if (!engine) return info;
  const EngineStats s = engine->Stats();
  info.set_running_requests(s.running);
  info.set_waiting_requests(s.waiting);
  info.set_total_kv_blocks(s.total_blocks);
  info.set_free_kv_blocks(s.free_blocks);
  info.set_used_kv_blocks(s.total_blocks - s.free_blocks);
  info.set_cached_kv_blocks(s.cached_blocks);
  info.set_prefix_cache_hit_tokens(s.prefix_hit_tokens);
  info.set_prefix_cache_query_tokens(s.prefix_query_tokens);
  info.set_prefix_cache_hit_rate(s.prefix_query_tokens > 0 ? double(s.prefix_hit_tokens) / s.prefix_query_tokens : 0.0);
  info.set_preemptions_total(s.preemptions);
  info.set_preempted_tokens_total(s.preempted_tokens);
  info.set_swapped_preemptions_total(s.swapped_preemptions);
  info.set_host_kv_blocks(s.host_blocks);
  info.set_host_swapped_kv_blocks(s.host_swap_blocks);
  info.set_host_cached_kv_blocks(s.host_cached_blocks);
  info.set_host_prefix_cache_hit_tokens(s.host_hit_tokens);
  info.set_kv_copied_to_host_bytes(s.copied_to_host_bytes);
  info.set_kv_copied_to_device_bytes(s.copied_to_device_bytes);
  info.set_device_busy_seconds(s.device_busy_s);
  info.set_kv_copy_seconds(s.copy_s);
  info.set_kv_copy_waited_seconds(s.copy_waited_s);
  info.set_read_ceiling_bytes_per_s(engine->ceilings().read_bytes_per_s);
  info.set_gemm_ceiling_flops_per_s(engine->ceilings().gemm_flops_per_s);
  for (const KernelChoice& c : engine->kernel_choices()) {
    v1::KernelChoice* k = info.add_kernels();
    k->set_op(c.op);
    k->set_choice(c.choice);
  }
  info.set_draining(engine->draining());
  info.set_backend(engine->backend_name());
  const MemoryPlan& p = engine->memory_plan();
  v1::MemoryPlan* mp = info.mutable_memory_plan();
  mp->set_device(p.device);
  mp->set_device_total_bytes(p.device_total_bytes);
  mp->set_device_free_bytes(p.device_free_bytes);
  mp->set_budget_bytes(p.budget_bytes);
  mp->set_weight_bytes(p.weight_bytes);
  mp->set_activation_bytes(p.activation_bytes);
  mp->set_other_bytes(p.other_bytes);
  mp->set_kv_bytes_per_block(p.kv_bytes_per_block);
  mp->set_kv_dtype(p.kv_dtype);
  mp->set_num_blocks(p.num_blocks);
  mp->set_kv_bytes(p.kv_bytes());
  return info;
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[absl::Uniform<size_t>(gen, 0, sizeof(kAlphabet) - 1)];
  return id;
}

void ToolCallText::Add(const std::string& text, bool last, google::protobuf::RepeatedPtrField<v1::ToolCall>* calls) {
  text_ += text;
  if (!last) return;
  for (FoundToolCall& found : SplitToolCalls(format_, text_).calls) {
    v1::ToolCall* call = calls->Add();
    call->set_id(NewToolCallId());
    call->set_name(std::move(found.name));
    call->set_arguments(std::move(found.arguments));
  }
}

}  // namespace inferd
