"""The shaped link (stoker.bench.link) in front of the real moto server: what passes is byte-exact,
each fault looks on the wire as the issue describes it, faults follow the seed, and a stopped
link refuses connections until it starts again."""

from __future__ import annotations

import http.client
import time

import pytest

from stoker.bench.link import FAULT_KINDS, Faults, ShapedLink
from stoker.bench.link_process import start_link_process

OBJECT = bytes(range(256)) * 4096  # 1 MiB
# moto answers 403 to a request without credentials; it checks no signature
AUTH = "AWS4-HMAC-SHA256 Credential=testing/20260101/eu-west-1/s3/aws4_request, SignedHeaders=host, Signature=0"


@pytest.fixture(scope="module")
def bucket(s3) -> str:
    s3.fs.mkdir("link")
    s3.fs.pipe("link/object", OBJECT)
    return "/link/object"


def get(link, path: str, byte_range: str | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", link.port, timeout=10)
    connection.request("GET", path, headers={"Authorization": AUTH, **({"Range": byte_range} if byte_range else {})})
    return connection.getresponse()


def test_bytes_pass_unchanged_and_are_counted(s3, bucket):
    with ShapedLink(s3.port, delay=0.005, rate=50e6) as link:
        assert get(link, bucket).read() == OBJECT
        assert get(link, bucket, "bytes=10-99").read() == OBJECT[10:100]
        counts = link.counts()
    assert counts["requests"] == 2 and counts["body_bytes"] == len(OBJECT) + 90
    assert sum(counts[kind] for kind in FAULT_KINDS) == 0


def test_each_objects_requests_and_bytes_are_counted(s3, bucket):
    """What bench/nodes.py counts per node: by method and object, the query string left out."""
    with ShapedLink(s3.port) as link:
        get(link, bucket, "bytes=0-9").read()
        get(link, bucket + "?x-id=GetObject").read()
        link.inject("slow_down")
        get(link, "/link/other").read()  # answered by the link itself: a request, no object bytes counted
        traffic = link.traffic()
    assert traffic == {f"GET {bucket}": {"requests": 2, "body_bytes": 10 + len(OBJECT)},
                       "GET /link/other": {"requests": 1, "body_bytes": 0}}


def test_each_fault_as_the_client_sees_it(s3, bucket):
    with ShapedLink(s3.port) as link:
        link.inject("slow_down", "error", "cut", "reset")
        answer = get(link, bucket)
        assert answer.status == 503 and b"<Code>SlowDown</Code>" in answer.read()
        answer = get(link, bucket)
        assert answer.status == 500 and b"<Code>InternalError</Code>" in answer.read()
        answer = get(link, bucket)
        assert answer.status == 200 and int(answer.getheader("Content-Length")) == len(OBJECT)
        with pytest.raises(http.client.IncompleteRead) as cut:
            answer.read()
        assert 0 < len(cut.value.partial) < len(OBJECT) and OBJECT.startswith(cut.value.partial)
        with pytest.raises(ConnectionResetError):
            get(link, bucket).read()
        assert get(link, bucket).read() == OBJECT  # nothing left injected
        assert link.counts() | {"connections": 0, "body_bytes": 0} == {
            "requests": 5, "connections": 0, "body_bytes": 0, "reset": 1, "slow_down": 1, "error": 1, "cut": 1,
            "short": 0, "ignore_range": 0, "black_hole": 0}


def test_a_short_answer_an_ignored_range_and_a_black_hole_as_the_client_sees_them(s3, bucket):
    with ShapedLink(s3.port) as link:
        link.inject("short", "ignore_range", "black_hole")
        connection = http.client.HTTPConnection("127.0.0.1", link.port, timeout=10)
        connection.request("GET", bucket, headers={"Authorization": AUTH, "Range": "bytes=1000-200999"})
        answer = connection.getresponse()  # well framed: Content-Range promises 200,000 bytes, 199,900 come
        assert answer.status == 206 and answer.getheader("Content-Range") == f"bytes 1000-200999/{len(OBJECT)}"
        assert answer.read() == OBJECT[1000 : 200_900]
        connection.request("GET", bucket, headers={"Authorization": AUTH, "Range": "bytes=10-99"})
        answer = connection.getresponse()  # the same connection goes on; the range is dropped
        assert answer.status == 200 and answer.read() == OBJECT
        silent = http.client.HTTPConnection("127.0.0.1", link.port, timeout=0.5)
        silent.request("GET", bucket, headers={"Authorization": AUTH})
        with pytest.raises(TimeoutError):
            silent.getresponse()
        silent.close()
        assert get(link, bucket, "bytes=0-9").read() == OBJECT[:10]  # nothing left injected
        assert link.counts() | {"connections": 0, "body_bytes": 0} == {
            "requests": 4, "connections": 0, "body_bytes": 0, "reset": 0, "slow_down": 0, "error": 0, "cut": 0,
            "short": 1, "ignore_range": 1, "black_hole": 1}


def fault_pattern(s3, bucket, seed: int) -> list[int]:
    """Which of 40 distinct ranged GETs failed (any fault), with 30% of requests faulted."""
    with ShapedLink(s3.port, faults=Faults(slow_down=0.15, error=0.15), seed=seed) as link:
        return [get(link, bucket, f"bytes={i}-{i + 9}").status for i in range(40)]


def test_faults_follow_the_seed(s3, bucket):
    first = fault_pattern(s3, bucket, seed=1)
    assert first == fault_pattern(s3, bucket, seed=1)
    assert first != fault_pattern(s3, bucket, seed=2)
    assert {206, 500, 503} == set(first)


def test_a_stopped_link_refuses_until_started(s3, bucket):
    link = start_link_process(s3.port, delay=0.001)  # the benchmarks' form: same methods, another process
    try:
        kept = http.client.HTTPConnection("127.0.0.1", link.port, timeout=10)
        kept.request("GET", bucket, headers={"Authorization": AUTH, "Range": "bytes=0-9"})
        assert kept.getresponse().read() == OBJECT[:10]
        link.stop()
        with pytest.raises(ConnectionRefusedError):
            get(link, bucket)
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):  # open connections end too
            kept.request("GET", bucket, headers={"Authorization": AUTH})
            kept.getresponse()
        link.start()
        assert get(link, bucket, "bytes=0-9").read() == OBJECT[:10]
        assert link.counts()["requests"] == 2
    finally:
        link.close()


def test_a_response_is_held_to_the_stream_rate(s3, bucket):
    """Each response at most ``stream_rate`` (after a burst of 256 KiB): a lower bound on time,
    which a busy machine only lengthens."""
    with ShapedLink(s3.port, stream_rate=4e6) as link:
        start = time.monotonic()
        assert get(link, bucket).read() == OBJECT
        assert time.monotonic() - start >= (len(OBJECT) - (256 << 10)) / 4e6
        assert link.counts()["body_bytes"] == len(OBJECT)


def test_an_injected_ignored_range_waits_for_a_request_with_a_range(s3, bucket):
    with ShapedLink(s3.port) as link:
        link.inject("ignore_range")
        assert get(link, bucket).read() == OBJECT
        answer = get(link, bucket, "bytes=5-9")
        assert answer.status == 200 and answer.read() == OBJECT
        assert link.counts()["ignore_range"] == 1


def test_an_injected_reset_waits_for_a_request_with_a_body(s3, bucket):
    with ShapedLink(s3.port) as link:
        link.inject("reset")
        connection = http.client.HTTPConnection("127.0.0.1", link.port, timeout=10)
        connection.request("HEAD", bucket, headers={"Authorization": AUTH})
        assert connection.getresponse().status == 200
        with pytest.raises(ConnectionResetError):
            get(link, bucket).read()
        assert link.ranges("HEAD") == [""] and link.ranges("GET") == [""] and link.counts()["reset"] == 1
