// An asynchronous HTTP/1.1 server (Boost.Beast on Asio): a few threads serve every connection, plain or TLS.
// Each request becomes an HttpExchange that a handler answers once, as a whole response or as a chunked stream
// (Server-Sent Events) written piece by piece; what a handler calls may come from any thread. Request heads and
// bodies are bounded in size and time (slow clients are closed), and a client that goes away while its response
// is being made is reported at once, so the work for it can stop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace inferd {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // the path and query, as sent
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  // The whole response, once. The connection stays open for the next request when the client asked for it.
  virtual void Respond(int status, const std::string& content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // A chunked response instead: the head now, then each Write in order (done(ok) once it is written; false: the
  // client is gone), then End.
  virtual void StartStream(int status, const std::string& content_type,
                           std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Write(std::string data, std::function<void(bool ok)> done) = 0;
  virtual void End() = 0;
  // Called once, from the connection's thread, when the client goes away before the response is complete.
  virtual void OnGone(std::function<void()> gone) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct TlsFiles {
  std::string cert_file;       // PEM certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle: clients must present a certificate it signed; empty: no client certs
};

class HttpServer {
 public:
  struct Options {
    std::string listen;  // HOST:PORT (port 0 picks one)
    int threads = 2;
    int64_t max_body_bytes = 4 << 20;
    double request_timeout_s = 30;  // to receive a request's head and body; and for a kept-alive connection to
                                    // send its next request
    const TlsFiles* tls = nullptr;  // null: plain HTTP
    int64_t max_connections = 0;    // open at once; one more is closed as it is accepted; 0: no bound of its own
    std::string config_key = "server.http_listen";  // what errors about `listen` name
  };
  // Listening on return; fails naming server.http_listen or the TLS file it could not use.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const Options& options, HttpHandler handler);
  virtual ~HttpServer() = default;
  virtual int port() const = 0;
  virtual int64_t open_connections() const = 0;
  // Stops accepting, closes every connection and joins the threads.
  virtual void Stop() = 0;
};

}  // namespace inferd
