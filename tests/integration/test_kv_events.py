"""KV-cache events (kv_events: a ZeroMQ PUB socket and its replay socket) decoded as vLLM's subscribers decode them:
msgspec structs as vLLM's: the batch array-like, each event a map tagged by "type" (what vllm-router's KV-aware
policy reads; tools/router_hit_rate.py runs it against inferd's events). A subscriber that rebuilds the replica's prefix-cache
index from the events alone must end with exactly the blocks the replica reports cached, on both tiers, after a
workload that fills the device pool many times over (evictions, write-backs to the host tier, reuse)."""
import random
import threading
import time

import msgspec
import pytest
import zmq

from conftest import Server, free_port, inferd_pb2 as pb, wait_until_idle

MASK = (1 << 64) - 1


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True, forbid_unknown_fields=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def block_key(parent, tokens):
    """The prefix cache's chained key (BlockPool::BlockKey), so that a subscriber can check every hash it is told."""
    h = parent ^ 0x9E3779B97F4A7C15
    for t in tokens:
        h ^= ((t & 0xFFFFFFFF) + 0x9E3779B97F4A7C15 + ((h << 6) & MASK) + (h >> 2)) & MASK
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
        h ^= h >> 31
    return h or 1


class Index:
    """What a KV-aware router knows of one replica: the blocks each medium holds, from the events alone."""

    def __init__(self):
        self.blocks = {"GPU": {}, "CPU": {}}
        self.stored = self.removed = 0

    def apply(self, batch):
        for e in batch.events:
            if isinstance(e, AllBlocksCleared):
                for held in self.blocks.values():
                    held.clear()
            elif isinstance(e, BlockStored):
                assert e.block_size == 16 and e.lora_id is None and len(e.token_ids) == 16 * len(e.block_hashes)
                parent = e.parent_block_hash or 0
                for i, h in enumerate(e.block_hashes):
                    tokens = e.token_ids[16 * i:16 * (i + 1)]
                    assert h == block_key(parent, tokens), "a hash that is not the chain's"
                    assert h not in self.blocks[e.medium], f"{e.medium} stored {h:#x} twice"
                    self.blocks[e.medium][h] = tokens
                    parent = h
                    self.stored += 1
            else:
                for h in e.block_hashes:
                    assert h in self.blocks[e.medium], f"{e.medium} removed {h:#x}, which it never stored"
                    del self.blocks[e.medium][h]
                    self.removed += 1


def replay(endpoint, first):
    """Every batch the replay socket still holds from sequence `first` on, as (sequence, payload) pairs."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send_multipart([b"", first.to_bytes(8, "big")])
    out = []
    while True:
        assert s.poll(5000), "no answer from the replay socket"
        _, seq, payload = s.recv_multipart()
        seq = int.from_bytes(seq, "big", signed=True)
        if seq == -1:
            assert payload == b""
            break
        out.append((seq, payload))
    s.close()
    return out


@pytest.fixture(scope="module")
def replica():
    pub, rep = free_port(), free_port()
    s = Server(engine={"backend": "cpu", "block_size": 16, "num_blocks": 24, "host_kv_cache_gib": 0.0005},
               kv_events={"enabled": "true", "endpoint": f"tcp://127.0.0.1:{pub}",
                          "replay_endpoint": f"tcp://127.0.0.1:{rep}", "topic": "kv@replica-1"})
    s.pub, s.replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
    yield s
    assert s.stop() == 0, s.logs()


def test_a_subscriber_rebuilds_the_replicas_cache_index_exactly_under_churn(replica):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(replica.pub)
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv@")
    live = []
    stop = threading.Event()

    def listen():
        while not stop.is_set():
            if sub.poll(50):
                live.append(sub.recv_multipart())

    listener = threading.Thread(target=listen)
    listener.start()
    time.sleep(0.3)  # a SUB socket misses what is sent before it has joined: the replay fills that in below

    # Conversations over a few shared system prompts, 4 at a time: prefixes are reused, the 24-block device pool
    # turns over many times, evicted prefixes go to the host tier and come back from it.
    rng = random.Random(5)
    systems = [[rng.randrange(10, 500) for _ in range(40)] for _ in range(3)]
    requests = []
    for i in range(36):
        ids = systems[i % 3] + [rng.randrange(10, 500) for _ in range(rng.randrange(5, 60))]
        requests.append(pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(temperature=0),
                                           stopping=pb.StoppingParams(max_tokens=12, ignore_eos=True)))
    for start in range(0, len(requests), 4):
        futures = [replica.stub.Generate.future(r) for r in requests[start:start + 4]]
        for f in futures:
            f.result(timeout=120)
    info = wait_until_idle(replica.stub)
    time.sleep(0.5)  # the publisher sends within milliseconds of a step
    stop.set()
    listener.join()
    sub.close()

    batches = replay(replica.replay, 0)
    seqs = [n for n, _ in batches]
    assert seqs == list(range(len(seqs))), "sequence numbers run from 0 without a gap"
    first = DECODER.decode(batches[0][1])
    assert [type(e) for e in first.events] == [AllBlocksCleared]
    assert abs(first.ts - time.time()) < 600
    # What the SUB socket got is the same batches, byte for byte, from where it joined.
    assert live, "the subscriber received nothing"
    for topic, seq, payload in live:
        assert topic == b"kv@replica-1"
        n = int.from_bytes(seq, "big")
        assert batches[n][1] == payload
    index = Index()
    for _, payload in batches:
        index.apply(DECODER.decode(payload))
    assert index.removed > 0, "the workload evicted nothing: it does not test churn"
    assert len(index.blocks["CPU"]) > 0, "nothing reached the host tier"
    assert len(index.blocks["GPU"]) == info.cached_kv_blocks
    assert len(index.blocks["CPU"]) == info.host_cached_kv_blocks
    # Each conversation's first full block is its system prompt's: a router's index finds it under its chain key.
    for system in systems:
        key = block_key(0, system[:16])
        assert any(key in held for held in index.blocks.values())


def test_a_replay_from_a_later_sequence_number_starts_there(replica):
    replica.stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(20, 60))),
                                             sampling=pb.SamplingParams(temperature=0),
                                             stopping=pb.StoppingParams(max_tokens=4, ignore_eos=True)))
    time.sleep(0.3)
    every = replay(replica.replay, 0)
    later = replay(replica.replay, len(every) - 2)
    assert later == every[-2:]
    assert replay(replica.replay, len(every) + 1000) == []


def test_an_endpoint_that_cannot_be_bound_is_refused_naming_the_key():
    with pytest.raises(RuntimeError) as e:
        Server(kv_events={"enabled": "true", "endpoint": "tcp://256.1.1.1:1"})
    assert "kv_events.endpoint" in str(e.value)


def test_a_malformed_replay_request_gets_no_answer_and_the_socket_keeps_serving(replica):
    ctx = zmq.Context.instance()
    bad = ctx.socket(zmq.DEALER)
    bad.setsockopt(zmq.LINGER, 0)
    bad.connect(replica.replay)
    bad.send_multipart([b"", b"short"])                    # not 8 bytes
    bad.send_multipart([b"", b"\0" * 8, b"x", b"y", b"z"])  # too many frames
    bad.send_multipart([b"", b"\0" * 5000])                # over the socket's message limit: the peer is dropped
    assert not bad.poll(500), "a malformed request was answered"
    bad.close()
    assert replay(replica.replay, 0)[0][0] == 0  # and a good one still is
