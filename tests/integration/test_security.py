"""TLS and API keys on both front ends, with a CA made here: clients without a key or with a wrong one are refused
(HTTP 401, gRPC UNAUTHENTICATED) and counted, SIGHUP adds and revokes keys without a restart, keys never reach the
log, with TLS on plaintext is refused, and mutual TLS refuses a client without a certificate."""
import http.client
import os
import signal
import ssl
import subprocess
import tempfile
import time

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK is built on
import openai
import pytest

from conftest import INFERD_BIN, Server, free_port, inferd_pb2 as pb

KEY1, KEY2 = "sk-inferd-test-one-4f1c2a", "sk-inferd-test-two-9b7e3d"
REQUEST = pb.GenerateRequest(text="hello", stopping=pb.StoppingParams(max_tokens=2))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture(scope="module")
def pki():
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    d = tempfile.mkdtemp(prefix="inferd-pki-")

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=inferd test CA")
    for name, ext in [("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "extendedKeyUsage=clientAuth")]:
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=inferd test {name}")
        write(os.path.join(d, f"{name}.ext"), ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {k: os.path.join(d, f"{k.replace('_', '.')}") for k in
            ["ca.pem", "server.pem", "server.key", "client.pem", "client.key"]}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def metric(text, name, labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def get(url, path, headers=None):
    conn = http.client.HTTPConnection(url.split("//")[1], timeout=10)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.read().decode()


@pytest.fixture(scope="module")
def keyed():
    keys = write(tempfile.mktemp(prefix="inferd-keys-"), f"# test keys\n{KEY1}\n\n")
    s = Server(http=True, server={"api_keys_file": keys})
    s.keys_file = keys
    yield s
    assert s.stop() == 0, s.logs()


def test_grpc_needs_a_valid_key(keyed):
    for metadata in [None, (("authorization", "Bearer wrong"),), (("authorization", KEY1),)]:
        with pytest.raises(grpc.RpcError) as e:
            keyed.stub.Generate(REQUEST, metadata=metadata, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
    with pytest.raises(grpc.RpcError) as e:
        list(keyed.stub.GenerateStream(REQUEST, timeout=10))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        keyed.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    ok = (("authorization", f"Bearer {KEY1}"),)
    assert keyed.stub.Generate(REQUEST, metadata=ok, timeout=30).usage.completion_tokens == 2
    assert len(list(keyed.stub.GenerateStream(REQUEST, metadata=ok, timeout=30))) >= 1


def test_http_needs_a_valid_key_but_health_and_metrics_are_exempt(keyed):
    def client(key):
        return openai.OpenAI(base_url=keyed.http_url + "/v1", api_key=key, max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError, match="not valid"):
        client("wrong").completions.create(model="", prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        client(KEY1[:-1]).models.list()
    status, body = get(keyed.http_url, "/v1/models")
    assert status == 401 and "Authorization: Bearer" in body
    assert client(KEY1).completions.create(model="", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert get(keyed.http_url, "/health")[0] == 200
    status, text = get(keyed.http_url, "/metrics")
    assert status == 200
    assert metric(text, "inferd_auth_failures_total", 'api="http"') >= 3
    assert metric(text, "inferd_auth_failures_total", 'api="grpc"') >= 1
    assert KEY1 not in keyed.logs() and "wrong" not in keyed.logs()


def test_sighup_adds_and_revokes_keys_without_a_restart(keyed):
    def accepted(key):
        try:
            keyed.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=(("authorization", f"Bearer {key}"),),
                                    timeout=10)
            return True
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            return False
    assert accepted(KEY1) and not accepted(KEY2)
    write(keyed.keys_file, f"{KEY2}\n")
    keyed.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 5
    while accepted(KEY1) and time.time() < deadline:
        time.sleep(0.05)
    assert not accepted(KEY1) and accepted(KEY2)
    status, _ = get(keyed.http_url, "/v1/models", {"Authorization": f"Bearer {KEY2}"})
    assert status == 200
    # A file that can no longer be read keeps the keys there were.
    os.remove(keyed.keys_file)
    keyed.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert accepted(KEY2) and keyed.proc.poll() is None
    assert "cannot be read" in keyed.logs() and KEY2 not in keyed.logs()


def test_health_and_metrics_ask_for_a_key_when_not_exempt():
    keys = write(tempfile.mktemp(prefix="inferd-keys-"), KEY1 + "\n")
    s = Server(http=True, server={"api_keys_file": keys, "api_keys_exempt_health": "false",
                                  "api_keys_exempt_metrics": "false"})
    try:
        assert get(s.http_url, "/health")[0] == 401 and get(s.http_url, "/metrics")[0] == 401
        assert get(s.http_url, "/health", {"Authorization": f"Bearer {KEY1}"})[0] == 200
    finally:
        assert s.stop() == 0


def tls_server(pki, **extra):
    creds = grpc.ssl_channel_credentials(root_certificates=read(pki["ca.pem"]),
                                         private_key=read(pki["client.key"]),
                                         certificate_chain=read(pki["client.pem"]))
    return Server(http=True, grpc_credentials=creds,
                  server={"tls_cert_file": pki["server.pem"], "tls_key_file": pki["server.key"], **extra})


def test_tls_serves_both_front_ends_and_refuses_plaintext(pki):
    s = tls_server(pki)
    try:
        assert s.stub.Generate(REQUEST, timeout=30).usage.completion_tokens == 2
        with pytest.raises(grpc.RpcError) as e:
            pb_plain = grpc.insecure_channel(s.address)
            from conftest import inferd_pb2_grpc
            inferd_pb2_grpc.InferenceStub(pb_plain).Generate(REQUEST, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        sdk = openai.OpenAI(base_url=s.http_url + "/v1", api_key="x", max_retries=0,
                            http_client=httpx.Client(verify=pki["ca.pem"], timeout=30))
        assert sdk.completions.create(model="", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        plain = s.http_url.replace("https://", "http://")
        with pytest.raises(Exception):
            status, _ = get(plain, "/health")
            assert status != 200
    finally:
        assert s.stop() == 0, s.logs()


def test_mutual_tls_refuses_a_client_without_a_certificate(pki):
    s = tls_server(pki, tls_client_ca_file=pki["ca.pem"])
    try:
        assert s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).vocab_size > 0  # with its certificate
        without = grpc.secure_channel(s.address, grpc.ssl_channel_credentials(root_certificates=read(pki["ca.pem"])))
        from conftest import inferd_pb2_grpc
        with pytest.raises(grpc.RpcError) as e:
            inferd_pb2_grpc.InferenceStub(without).GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        ctx = ssl.create_default_context(cafile=pki["ca.pem"])
        with pytest.raises((ssl.SSLError, ConnectionError, httpx.HTTPError)):
            httpx.get(s.http_url + "/health", verify=ctx, timeout=5)
        ctx.load_cert_chain(pki["client.pem"], pki["client.key"])
        assert httpx.get(s.http_url + "/health", verify=ctx, timeout=5).status_code == 200
    finally:
        assert s.stop() == 0, s.logs()


@pytest.mark.parametrize("server_section,words", [
    ({"tls_cert_file": "/nonexistent.pem"}, "tls_cert_file and server.tls_key_file go together"),
    ({"tls_cert_file": "/nonexistent.pem", "tls_key_file": "/nonexistent.key"}, "tls_cert_file = '/nonexistent.pem'"),
    ({"api_keys_file": "/nonexistent-keys"}, "api_keys_file = '/nonexistent-keys' cannot be read"),
    ({"http_listen": "nowhere"}, "http_listen"),
])
def test_bad_security_config_exits_2_naming_the_key(server_section, words):
    path = write(tempfile.mktemp(suffix=".yaml"),
                 "model: {path: /x}\nserver:\n" + "".join(f"  {k}: {v}\n" for k, v in server_section.items()) +
                 f"  listen: 127.0.0.1:{free_port()}\n")
    r = subprocess.run([INFERD_BIN, "--config", path], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and words in r.stderr, (r.returncode, r.stderr)
