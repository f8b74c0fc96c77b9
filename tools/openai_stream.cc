#include "tools/openai_stream.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "nlohmann/json.hpp"

namespace inferd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

void Connect(const std::string& address, asio::io_context& ioc, beast::tcp_stream& stream) {
  const size_t colon = address.rfind(':');
  tcp::resolver resolver(ioc);
  stream.connect(resolver.resolve(address.substr(0, colon), address.substr(colon + 1)));
  stream.socket().set_option(tcp::no_delay(true));
}

json Body(const v1::GenerateRequest& r, std::string* path) {
  json body = {{"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"max_tokens", r.stopping().max_tokens()},
               {"ignore_eos", r.stopping().ignore_eos()},
               {"temperature", r.sampling().temperature()}};
  if (r.has_messages()) {
    *path = "/v1/chat/completions";
    json messages = json::array();
    for (const auto& m : r.messages().messages()) messages.push_back({{"role", m.role()}, {"content", m.content()}});
    body["messages"] = std::move(messages);
  } else {
    *path = "/v1/completions";
    if (r.has_token_ids()) {
      body["prompt"] = std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end());
    } else {
      body["prompt"] = r.text();
    }
  }
  return body;
}

}  // namespace

StreamTiming RunOpenAiStream(const std::string& address, const v1::GenerateRequest& request) {
  StreamTiming res;
  try {
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    Connect(address, ioc, stream);
    std::string path;
    http::request<http::string_body> req{http::verb::post, "", 11};
    req.body() = Body(request, &path).dump();
    req.target(path);
    req.set(http::field::host, address);
    req.set(http::field::content_type, "application/json");
    req.prepare_payload();
    const Clock::time_point t0 = Clock::now();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    http::read_header(stream, buffer, parser);
    if (parser.get().result_int() != 200) {
      res.error = "HTTP " + std::to_string(parser.get().result_int());
      return res;
    }
    std::string pending;  // bytes of events not yet whole
    bool done = false;
    char chunk[16384];
    while (!parser.is_done() && !done) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      beast::error_code ec;
      http::read_some(stream, buffer, parser, ec);  // what has arrived: each event is timed as it comes
      if (ec && ec != http::error::need_buffer) throw beast::system_error(ec);
      pending.append(chunk, sizeof(chunk) - parser.get().body().size);
      const Clock::time_point now = Clock::now();
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
        const std::string event = pending.substr(0, end);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string data = event.substr(6);
        if (data == "[DONE]") {
          done = true;
          break;
        }
        const json j = json::parse(data);
        if (j.contains("error")) {
          res.error = j["error"].value("message", "error event");
          return res;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          res.prompt_tokens = j["usage"]["prompt_tokens"];
          res.output_tokens = j["usage"]["completion_tokens"];
        }
        if (j["choices"].empty()) continue;
        res.Chunk(t0, now);
      }
    }
    res.latency = std::chrono::duration<double>(Clock::now() - t0).count();
    res.ok = done && res.output_tokens > 0;
    if (!res.ok && res.error.empty()) res.error = "the stream ended without [DONE] and a usage";
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

bool OpenAiModelInfo(const std::string& address, v1::ModelInfo* model, std::string* error) {
  try {
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(10));
    Connect(address, ioc, stream);
    http::request<http::empty_body> req{http::verb::get, "/v1/models", 11};
    req.set(http::field::host, address);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    const json j = json::parse(res.body());
    if (res.result_int() != 200 || j["data"].empty()) {
      *error = "GET /v1/models answered " + std::to_string(res.result_int()) + ": " + res.body();
      return false;
    }
    const json& m = j["data"][0];
    model->set_name(m.value("id", ""));
    // vLLM's fields (inferd answers them), else llama.cpp's llama-server's: meta.n_ctx (a slot's context) and
    // meta.n_vocab.
    const json meta = m.value("meta", json::object());
    model->set_max_model_len(m.value("max_model_len", meta.value("n_ctx", 0)));
    model->set_vocab_size(m.value("vocab_size", meta.value("n_vocab", 0)));
    if (model->max_model_len() <= 0 || model->vocab_size() <= 0) {
      *error =
          "GET /v1/models names no context length and vocabulary (vLLM's max_model_len and vocab_size, or "
          "llama.cpp's meta.n_ctx and meta.n_vocab): random prompts cannot be sized";
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace inferd
