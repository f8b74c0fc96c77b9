#include "server/http/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/request_head.h"
#include "spdlog/spdlog.h"

namespace inferd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// What Stop closes: every open connection, by its session's Shutdown on the session's own strand.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void Shutdown() = 0;
};

struct Shared {
  HttpHandler handler;
  std::mutex mu;
  std::unordered_map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
  int64_t max_body_bytes;
  std::chrono::milliseconds request_timeout;
  int64_t max_connections = 0;
  std::string config_key;
  std::atomic<int64_t> open{0};
};

// A transport failure answered before any handler sees the request, in the JSON error shape the API uses (the
// messages are our own: nothing of the request is quoted).
std::string ErrorBody(int status, const std::string& message) {
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  return absl::StrCat(R"({"error":{"message":")", message, R"(","type":")", type, R"(","param":null,"code":)", status,
                      "}}");
}

constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  Session(std::shared_ptr<asio::io_context> ioc, Stream stream, std::shared_ptr<Shared> shared)
      : ioc_(std::move(ioc)), stream_(std::move(stream)), shared_(std::move(shared)) {
    ++shared_->open;
  }
  ~Session() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->sessions.erase(this);
    --shared_->open;
  }

  void Run() {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->sessions[this] = this->shared_from_this();
    }
    if constexpr (kTls) {
      beast::get_lowest_layer(stream_).expires_after(shared_->request_timeout);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return;  // not TLS, or not trusted: closed
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  asio::any_io_executor executor() { return stream_.get_executor(); }

  void Shutdown() override {
    asio::post(executor(), [self = this->shared_from_this()] {
      if (self->responding_) self->Gone();
      self->Close();
    });
  }

  void Respond(int status, const std::string& content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> headers) {
    if (closed_ || answered_) return;
    answered_ = true;
    if (head_only_) {  // HEAD: the head a GET would have, without its body
      Pending p{.kind = Pending::kHeadOnly};
      SetHead(p.head, status, content_type, headers);
      p.head.set(http::field::content_length, std::to_string(body.size()));
      writes_.push_back(std::move(p));
      return Pump();
    }
    Pending p{.kind = Pending::kWhole};
    SetHead(p.whole, status, content_type, headers);
    p.whole.body() = std::move(body);
    p.whole.prepare_payload();
    writes_.push_back(std::move(p));
    Pump();
  }
  void StartStream(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) {
    if (closed_ || answered_) return;
    answered_ = true;
    Pending p{.kind = Pending::kHead};
    SetHead(p.head, status, content_type, headers);
    p.head.set(http::field::cache_control, "no-cache");
    p.head.set("X-Accel-Buffering", "no");  // proxies pass each event on at once
    p.head.chunked(true);
    writes_.push_back(std::move(p));
    Pump();
  }
  void Write(std::string data, std::function<void(bool)> done) {
    if (closed_) {
      if (done) done(false);
      return;
    }
    writes_.push_back(Pending{.kind = Pending::kChunk, .data = std::move(data), .done = std::move(done)});
    Pump();
  }
  void End() {
    if (closed_) return;
    writes_.push_back(Pending{.kind = Pending::kLast});
    Pump();
  }
  void SetGone(std::function<void()> gone) {
    if (gone_reported_) {
      gone();
      return;
    }
    gone_ = std::move(gone);
  }

 private:
  struct Pending {
    enum Kind { kWhole, kHeadOnly, kHead, kChunk, kLast } kind;
    std::string data;
    std::function<void(bool)> done;
    http::response<http::string_body> whole;
    http::response<http::empty_body> head;
  };

  // What every response's head carries: status, server, content type, the handler's fields, keep-alive.
  template <class Message>
  void SetHead(Message& m, int status, const std::string& content_type,
               const std::vector<std::pair<std::string, std::string>>& headers) const {
    m.result(status);
    m.version(11);
    m.set(http::field::server, "inferd");
    m.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers) m.set(name, value);
    m.keep_alive(keep_alive_);
  }

  void ReadRequest() {
    parser_.emplace();
    parser_->body_limit(shared_->max_body_bytes);
    parser_->header_limit(16 << 10);
    parser_->eager(true);
    answered_ = false;
    head_only_ = false;
    beast::get_lowest_layer(stream_).expires_after(shared_->request_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
  }

  // A transport-level refusal: answered, and the connection closes (what follows cannot be framed reliably).
  void Refuse(int status, const std::string& message) {
    keep_alive_ = false;
    Respond(status, "application/json", ErrorBody(status, message), {});
  }

  // Beast's parser failed: too large, malformed, or the client closed or was too slow.
  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return Refuse(413, absl::StrCat("the request body is larger than server.max_request_bytes = ",
                                      shared_->max_body_bytes, " bytes"));
    }
    if (ec == http::error::header_limit) return Refuse(431, "the request head is larger than 16 KiB");
    if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    }
    Close();
  }

  // The head is in: RFC 9112's checks, then the body (after 100 Continue when the client waits for it).
  void OnHead(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    const auto& head = parser_->get();
    head_only_ = head.method() == http::verb::head;
    std::vector<std::pair<std::string_view, std::string_view>> fields;
    for (const auto& field : head) fields.emplace_back(field.name_string(), field.value());
    RequestHeadCheck check = CheckRequestHead(head.method_string(), head.target(), head.version(), fields);
    if (check.status != 0) return Refuse(check.status, check.message);
    target_ = std::move(check.target);
    if (check.expect_continue && !parser_->is_done()) {
      return asio::async_write(stream_, asio::buffer(kContinue, sizeof(kContinue) - 1),
                               [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                 if (ec) return self->Close();
                                 self->ReadBody();
                               });
    }
    ReadBody();
  }

  // The body, parsed here from what is read rather than by Beast's read loop: Beast waits for a CRLF that a chunked
  // body with bare LF line endings never sends, and a client would get no answer. Whenever the parser needs more,
  // what it left unconsumed starts at a line it is waiting to complete (a chunk size, the CRLF after a chunk's data,
  // a trailer), so a LF without its CR there is a framing error, answered at once.
  void ReadBody() {
    while (buffer_.size() > 0 && !parser_->is_done()) {
      beast::error_code ec;
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == http::error::need_more) break;
      if (ec) return OnReadError(ec);
    }
    if (parser_->is_done()) return OnRequest();
    if (parser_->chunked()) {
      const std::string_view pending(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      const size_t lf = pending.find('\n');
      if (lf != std::string_view::npos && (lf == 0 || pending[lf - 1] != '\r')) {
        return Refuse(400, "a line of the chunked body ends in a bare LF; allowed: CRLF");
      }
      if (pending.size() > (16 << 10)) return Refuse(400, "a line of the chunked body is longer than 16 KiB");
    }
    stream_.async_read_some(buffer_.prepare(64 << 10),
                            [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->OnReadError(ec);
                              self->buffer_.commit(n);
                              self->ReadBody();
                            });
  }

  void OnRequest() {
    http::request<http::string_body> req = parser_->release();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::move(target_);
    for (const auto& field : req) {
      request.headers[absl::AsciiStrToLower(std::string(field.name_string()))] = std::string(field.value());
    }
    request.body = std::move(req.body());
    keep_alive_ = req.keep_alive();
    responding_ = true;
    beast::get_lowest_layer(stream_).expires_never();  // a generation takes as long as it takes
    // Pipelined requests already read wait in the buffer, answered in order once this one is; with none there,
    // a read watches for the client going away.
    if (buffer_.size() == 0) Watch();
    shared_->handler(std::make_shared<Exchange>(this->shared_from_this(), std::move(request)));
  }

  // A read while the response is made: it ends with the client's EOF (gone: its work stops) or brings the next
  // request's first bytes, which wait in the buffer.
  void Watch() {
    if (watching_ || closed_ || buffer_.size() > (64 << 10)) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
      self->OnWatch(ec, n);
    });
  }
  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec) {
      if (responding_) return Gone();
      return Close();  // idle too long, or closed between requests
    }
    buffer_.commit(n);
    if (next_wanted_) {
      next_wanted_ = false;
      if (idle_) idle_->cancel();
      return ReadRequest();
    }
    // Bytes of the client's next request (it is not gone): they wait in the buffer, and Finished reads the request
    // once this response is out. Watching on would leave a request that arrived whole before Finished ran waiting
    // for a read that never ends, until the idle timeout closed the connection.
    if (buffer_.size() == 0) Watch();
  }

  void Gone() {
    if (!gone_reported_) {
      gone_reported_ = true;
      if (gone_) std::exchange(gone_, nullptr)();
    }
    Close();
  }

  void Pump() {
    if (writing_ || writes_.empty()) return;
    if (closed_) {
      for (Pending& p : writes_) {
        if (p.done) p.done(false);
      }
      writes_.clear();
      return;
    }
    writing_ = true;
    Pending& p = writes_.front();
    auto done = [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); };
    switch (p.kind) {
      case Pending::kWhole:
        http::async_write(stream_, p.whole, std::move(done));
        break;
      case Pending::kHeadOnly:  // a HEAD request's whole answer, or a stream's head
      case Pending::kHead:
        head_serializer_.emplace(p.head);
        http::async_write_header(stream_, *head_serializer_, std::move(done));
        break;
      case Pending::kChunk:
        asio::async_write(stream_, http::make_chunk(asio::buffer(p.data)), std::move(done));
        break;
      case Pending::kLast:
        asio::async_write(stream_, http::make_chunk_last(), std::move(done));
        break;
    }
  }
  void OnWritten(beast::error_code ec) {
    writing_ = false;
    Pending p = std::move(writes_.front());
    writes_.pop_front();
    if (ec) {
      if (p.done) p.done(false);
      Gone();
      return Pump();  // fails what is left
    }
    if (p.done) p.done(true);
    if (p.kind == Pending::kWhole || p.kind == Pending::kHeadOnly || p.kind == Pending::kLast) return Finished();
    Pump();
  }

  // The response is out: the next request, or the end of the connection.
  void Finished() {
    responding_ = false;
    gone_ = nullptr;
    if (!keep_alive_) return Linger();
    if (!watching_) return ReadRequest();
    // The watch read still waits for the next request; the stream's own timeout cannot cover a read already out,
    // so a timer of its own closes the connection if none comes.
    next_wanted_ = true;
    idle_.emplace(stream_.get_executor());
    idle_->expires_after(shared_->request_timeout);
    idle_->async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (!ec && self->next_wanted_) self->Close();
    });
  }

  // Ends the connection after a response to a client that may still be sending (a body over the limit): our
  // side is shut, what it still sends is read and dropped for a few seconds, so it reads the answer instead of
  // a reset.
  void Linger() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (watching_) return;  // the watch read ends it
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
    Drop();
  }
  void Drop() {
    buffer_.clear();
    beast::get_lowest_layer(stream_).async_read_some(buffer_.prepare(64 << 10),
                                                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                                       if (ec) return beast::get_lowest_layer(self->stream_).close();
                                                       self->Drop();
                                                     });
  }

  void Close() {
    if (idle_) idle_->cancel();
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(stream_).close();
  }

  class Exchange final : public HttpExchange {
   public:
    Exchange(std::shared_ptr<Session> session, HttpRequest request)
        : session_(std::move(session)), request_(std::move(request)) {}
    const HttpRequest& request() const override { return request_; }
    void Respond(int status, const std::string& content_type, std::string body,
                 std::vector<std::pair<std::string, std::string>> headers) override {
      asio::post(session_->executor(),
                 [s = session_, status, content_type, body = std::move(body), headers = std::move(headers)]() mutable {
                   s->Respond(status, content_type, std::move(body), std::move(headers));
                 });
    }
    void StartStream(int status, const std::string& content_type,
                     std::vector<std::pair<std::string, std::string>> headers) override {
      asio::post(session_->executor(), [s = session_, status, content_type, headers = std::move(headers)] {
        s->StartStream(status, content_type, headers);
      });
    }
    void Write(std::string data, std::function<void(bool)> done) override {
      asio::post(session_->executor(), [s = session_, data = std::move(data), done = std::move(done)]() mutable {
        s->Write(std::move(data), std::move(done));
      });
    }
    void End() override {
      asio::post(session_->executor(), [s = session_] { s->End(); });
    }
    void OnGone(std::function<void()> gone) override {
      asio::post(session_->executor(),
                 [s = session_, gone = std::move(gone)]() mutable { s->SetGone(std::move(gone)); });
    }

   private:
    std::shared_ptr<Session> session_;
    HttpRequest request_;
  };

  std::shared_ptr<asio::io_context> ioc_;  // outlives the stream
  Stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<Pending> writes_;
  std::optional<http::response_serializer<http::empty_body>> head_serializer_;
  std::function<void()> gone_;
  std::optional<asio::steady_timer> idle_;  // a kept-alive connection waiting for its next request
  std::string target_;                      // the request's origin-form target, from its head
  bool head_only_ = false;                  // a HEAD request: responses carry no body
  bool keep_alive_ = false;
  bool responding_ = false;  // a request is being answered
  bool answered_ = false;    // its answer has begun
  bool watching_ = false;
  bool next_wanted_ = false;  // read the next request once the watch returns
  bool writing_ = false;
  bool gone_reported_ = false;
  bool closed_ = false;
};

class Server final : public HttpServer {
 public:
  Server(std::shared_ptr<Shared> shared, std::optional<ssl::context> tls)
      : ioc_(std::make_shared<asio::io_context>()),
        acceptor_(*ioc_),
        shared_(std::move(shared)),
        tls_(std::move(tls)) {}
  ~Server() override { Stop(); }

  absl::Status Listen(const std::string& listen, int threads) {
    const size_t colon = listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(shared_->config_key, " = '", listen, "' is not allowed; allowed: HOST:PORT, PORT 0..65535"));
    }
    std::string host = listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    beast::error_code ec;
    tcp::resolver resolver(*ioc_);
    auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec || endpoints.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(shared_->config_key, " = '", listen, "': ", ec.message()));
    }
    const tcp::endpoint endpoint = *endpoints.begin();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", shared_->config_key, " = '", listen, "': ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { ioc_->run(); });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  int64_t open_connections() const override { return shared_->open.load(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    // Every connection closes, and the handlers of its pending operations run (aborted) and let go of it.
    std::vector<std::shared_ptr<SessionBase>> open;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (auto& [raw, weak] : shared_->sessions) {
        if (auto s = weak.lock()) open.push_back(std::move(s));
      }
    }
    for (auto& s : open) s->Shutdown();
    open.clear();
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (shared_->open.load() > 0 && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ioc_->stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(*ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec && shared_->max_connections > 0 && shared_->open.load() >= shared_->max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // over the bound: closed at once, before it holds anything
      } else if (!ec) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);  // each event leaves at once
        if (tls_) {
          std::make_shared<Session<TlsStream>>(ioc_, TlsStream(std::move(socket), *tls_), shared_)->Run();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(ioc_, beast::tcp_stream(std::move(socket)), shared_)->Run();
        }
      } else if (ec == asio::error::no_descriptors) {
        spdlog::warn("http: out of file descriptors; accepting again in 100 ms");
        auto timer = std::make_shared<asio::steady_timer>(*ioc_, std::chrono::milliseconds(100));
        return timer->async_wait([this, timer](beast::error_code) { Accept(); });
      }
      Accept();
    });
  }

  std::shared_ptr<asio::io_context> ioc_;
  tcp::acceptor acceptor_;
  std::shared_ptr<Shared> shared_;
  std::optional<ssl::context> tls_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
  int port_ = 0;
};

absl::StatusOr<ssl::context> TlsContext(const TlsFiles& files) {
  ssl::context ctx(ssl::context::tls_server);
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                  ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  beast::error_code ec;
  ctx.use_certificate_chain_file(files.cert_file, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("server.tls.cert_file = '", files.cert_file, "': ", ec.message()));
  ctx.use_private_key_file(files.key_file, ssl::context::pem, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("server.tls.key_file = '", files.key_file, "': ", ec.message()));
  if (!files.client_ca_file.empty()) {
    ctx.load_verify_file(files.client_ca_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("server.tls.client_ca_file = '", files.client_ca_file, "': ", ec.message()));
    }
    ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return ctx;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const Options& options, HttpHandler handler) {
  auto shared = std::make_shared<Shared>();
  shared->handler = std::move(handler);
  shared->max_body_bytes = options.max_body_bytes;
  shared->max_connections = options.max_connections;
  shared->config_key = options.config_key;
  shared->request_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.request_timeout_s * 1000));
  std::optional<ssl::context> tls;
  if (options.tls) {
    auto ctx = TlsContext(*options.tls);
    if (!ctx.ok()) return ctx.status();
    tls.emplace(std::move(*ctx));
  }
  auto server = std::make_unique<Server>(std::move(shared), std::move(tls));
  if (absl::Status st = server->Listen(options.listen, options.threads); !st.ok()) return st;
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace inferd
