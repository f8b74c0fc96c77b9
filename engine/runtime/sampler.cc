#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "engine/check.h"

namespace inferd {
namespace {

// The top n (id, logprob) of the raw logits and the log-sum-exp they were normalized with.
TokenLogprob RawLogprobs(std::span<const float> logits, int32_t top_n, float* log_z) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  *log_z = mx + static_cast<float>(std::log(sum));
  TokenLogprob out;
  if (top_n > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    const int32_t n = std::min<int32_t>(top_n, static_cast<int32_t>(idx.size()));
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int32_t i = 0; i < n; ++i) out.top.push_back({idx[i], logits[idx[i]] - *log_z});
  }
  return out;
}

// A penalized logit stays a finite float: a valid but tiny repetition penalty (1e-45 is inside (0, 10]) would
// otherwise divide a logit into +inf, and inf - inf is NaN in the softmax. At ±FLT_MAX the token is simply
// the most (least) likely, which is what such a penalty asks for.
float Finite(double v) {
  return static_cast<float>(std::clamp(v, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX)));
}

void ApplyPenalties(std::span<float> logits, const SamplingRow& ctx) {
  const SamplingParams& p = ctx.params;
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(logits.size(), 0);
    for (int32_t t : ctx.tokens) {
      if (t < 0 || t >= static_cast<int32_t>(logits.size()) || seen[t]) continue;
      seen[t] = 1;
      const double l = logits[t];
      logits[t] = Finite(l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty);
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (size_t i = ctx.num_prompt_tokens; i < ctx.tokens.size(); ++i) counts[ctx.tokens[i]]++;
    for (const auto& [t, n] : counts) {
      if (t < 0 || t >= static_cast<int32_t>(logits.size())) continue;
      logits[t] = Finite(double{logits[t]} - (double{p.frequency_penalty} * n + p.presence_penalty));
    }
  }
  for (const auto& [t, bias] : p.logit_bias) {
    if (t >= 0 && t < static_cast<int32_t>(logits.size())) logits[t] = Finite(double{logits[t]} + bias);
  }
}

// The first index of the largest value (std::max_element's answer; NaNs are never taken), in lanes that the
// compiler keeps in vector registers: a greedy row of a 262,144-token vocabulary, scanned one compare at a time, had
// taken a tenth of a 16-stream cpu step.
int32_t ArgMax(std::span<const float> x) {
  constexpr int kLanes = 16;
  const int64_t n = static_cast<int64_t>(x.size());
  float best[kLanes];
  int32_t at[kLanes];
  for (int l = 0; l < kLanes; ++l) best[l] = -INFINITY, at[l] = -1;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const bool more = x[i + l] > best[l];
      best[l] = more ? x[i + l] : best[l];
      at[l] = more ? static_cast<int32_t>(i + l) : at[l];
    }
  }
  float m = -INFINITY;
  int32_t arg = -1;
  for (int l = 0; l < kLanes; ++l) {  // each lane holds its first largest; the lowest index among equals wins
    if (at[l] >= 0 && (best[l] > m || (best[l] == m && at[l] < arg))) m = best[l], arg = at[l];
  }
  for (; i < n; ++i) {
    if (x[i] > m) m = x[i], arg = static_cast<int32_t>(i);
  }
  if (arg < 0) return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());  // all -inf or NaN
  return arg;
}

}  // namespace

void ShapeLogits(std::span<float> logits, const SamplingRow& ctx) {
  ApplyPenalties(logits, ctx);
  for (int32_t b : ctx.banned) {
    if (b >= 0 && b < static_cast<int32_t>(logits.size())) logits[b] = -INFINITY;
  }
  if (!ctx.allowed.empty()) {  // structured output: the constraint's mask
    for (size_t t = 0; t < logits.size(); ++t) {
      if (t / 32 >= ctx.allowed.size() || !(ctx.allowed[t / 32] >> (t % 32) & 1u)) logits[t] = -INFINITY;
    }
  }
}

Candidates CandidatesOf(std::span<const float> logits, const SamplingParams& p) {
  INFERD_CHECK(!logits.empty(), "logits are not empty");
  Candidates c;
  if (p.temperature == 0.0f) {
    c.ids = {ArgMax(logits)};
    c.probs = {1.0};
    return c;
  }
  // Candidates sorted by logit, cut by top-k, then softmax at the temperature, then top-p and min-p.
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const int32_t k =
      p.top_k > 0 ? std::min<int32_t>(p.top_k, static_cast<int32_t>(idx.size())) : static_cast<int32_t>(idx.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(k);
  std::vector<double> probs(k);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int32_t i = 0; i < k; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
  for (double& v : probs) v /= sum;
  int32_t keep = k;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int32_t i = 0; i < k; ++i) {
      cum += probs[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double floor = p.min_p * probs[0];
    int32_t n = 0;
    while (n < keep && probs[n] >= floor) ++n;
    keep = std::max(n, 1);
  }
  idx.resize(keep);
  probs.resize(keep);
  c.total = 0;
  for (double v : probs) c.total += v;
  c.ids = std::move(idx);
  c.probs = std::move(probs);
  return c;
}

int32_t Draw(const Candidates& c, double uniform) {
  INFERD_CHECK(!c.ids.empty() && c.ids.size() == c.probs.size(), "a draw has candidates");
  const double u = uniform * c.total;
  double cum = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    cum += c.probs[i];
    if (u < cum) return c.ids[i];
  }
  return c.ids.back();
}

SampleResult Sample(std::span<float> logits, const SamplingRow& ctx) {
  INFERD_CHECK(!logits.empty(), "logits are not empty");
  SampleResult result;
  float log_z = 0;
  if (ctx.target >= 0) {  // a prompt row: the raw logprob of the token that follows, nothing sampled
    INFERD_CHECK(ctx.target < static_cast<int32_t>(logits.size()), "a prompt row's token is in the vocabulary");
    result.token = ctx.target;
    result.has_logprob = true;
    result.logprob = RawLogprobs(logits, ctx.top_logprobs, &log_z);
    result.logprob.token_id = ctx.target;
    result.logprob.logprob = logits[ctx.target] - log_z;
    return result;
  }
  if (ctx.top_logprobs > 0) {
    result.has_logprob = true;
    result.logprob = RawLogprobs(logits, ctx.top_logprobs, &log_z);
  }
  const std::vector<float> raw =
      ctx.top_logprobs > 0 ? std::vector<float>(logits.begin(), logits.end()) : std::vector<float>();
  ShapeLogits(logits, ctx);
  const Candidates candidates = CandidatesOf(logits, ctx.params);
  const int32_t token = Draw(candidates, ctx.uniform);  // greedy: the argmax alone, whatever the uniform
  result.token = token;
  if (result.has_logprob) {
    result.logprob.token_id = token;
    result.logprob.logprob = raw[token] - log_z;
  }
  return result;
}

}  // namespace inferd
