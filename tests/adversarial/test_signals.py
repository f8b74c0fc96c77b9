"""Signals under load: SIGTERM in the middle of a burst drains it (every stream ends OK, or UNAVAILABLE once the
drain gives up), SIGINT twice exits at once; neither crashes. Own servers, not the battery's."""
import signal
import threading
import time

import grpc

from conftest import Server, inferd_pb2 as pb


def burst(server, n, max_tokens):
    outcomes, threads = [], []

    def run():
        try:
            chunks = list(server.stub.GenerateStream(pb.GenerateRequest(
                text="Hello", sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=True))))
            outcomes.append(chunks[-1].finish_reason)
        except grpc.RpcError as e:
            outcomes.append(e.code())

    for _ in range(n):
        threads.append(threading.Thread(target=run))
        threads[-1].start()
    return outcomes, threads


def test_sigterm_during_a_burst_drains_it_and_exits_zero(server):
    s = Server(model="llama3-tiny", server={"drain_timeout_s": 20})
    outcomes, threads = burst(s, 24, 200)
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert s.proc.wait(timeout=30) == 0, s.logs()
    assert len(outcomes) == 24
    assert set(outcomes) <= {pb.LENGTH, grpc.StatusCode.UNAVAILABLE}, set(outcomes)


def test_sigint_twice_under_load_exits_at_once(server):
    s = Server(model="llama3-tiny", server={"drain_timeout_s": 60})
    outcomes, threads = burst(s, 16, 480)
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGINT)
    # Two signals sent back to back can reach the process as one (a pending signal is not queued twice): the
    # second goes once the server says it is draining, as a person's second Ctrl-C would.
    end = time.time() + 30
    while "draining" not in s.logs() and s.proc.poll() is None and time.time() < end:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGINT)
    rc = s.proc.wait(timeout=10)
    assert rc in (0, 128 + signal.SIGINT), (rc, s.logs())  # 0 if the burst had already drained
    for t in threads:
        t.join(timeout=30)
    assert all(o in (pb.LENGTH, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) for o in outcomes), outcomes
