"""The test servers of remote_servers.py behave as the remote-reading tests rely on: moto's S3
(ranged GETs, ETags, If-Match, listings, Signature V4 checks), RangeHTTPServer (HTTP/1.1 ranges,
ETags, preconditions, keep-alive, no escaping its directory) and FaultProxy (byte-exact relaying,
each fault as a plain client sees it, signed S3 requests through it); all on 127.0.0.1, leaving
nothing running. Clients here are only http.client and boto3."""

import http.client
import os
import socket
import threading
import time
import urllib.parse

import pytest
from botocore.exceptions import ClientError
from remote_servers import FaultProxy, RangeHTTPServer, S3Server

pytestmark = pytest.mark.timeout(60)

DATA = bytes(range(256)) * 40  # 10240 bytes


def connect(url, timeout=10.0):
    return http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=timeout)


def send(connection, method, path, **headers):
    """(status, headers with lower-case names, body) of one request on connection."""
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    return response.status, {name.lower(): value for name, value in response.getheaders()}, body


def fetch(url, method, path, **headers):
    connection = connect(url)
    try:
        return send(connection, method, path, **headers)
    finally:
        connection.close()


def error_of(call):
    """(HTTP status, error code) of a boto3 call expected to fail."""
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value.response["ResponseMetadata"]["HTTPStatusCode"], caught.value.response["Error"]["Code"]


def refuses_connections(url):
    try:
        address = urllib.parse.urlsplit(url)
        socket.create_connection((address.hostname, address.port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


@pytest.fixture(scope="module")
def s3_verified():
    with S3Server(verify_signatures=True) as server:
        yield server


@pytest.fixture
def files(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "data.bin").write_bytes(DATA)
    (root / "empty.bin").write_bytes(b"")
    (root / "sub" / "a b.txt").write_bytes(b"spaced")
    (tmp_path / "secret.txt").write_bytes(b"outside")
    return root


@pytest.fixture
def http_server(files):
    with RangeHTTPServer(files) as server:
        yield server


@pytest.fixture
def proxy(http_server):
    with FaultProxy(http_server.url) as server:
        yield server


# ---- S3Server ---------------------------------------------------------------------------------------


def test_s3_put_get_list_delete(s3, tmp_path):
    assert s3.endpoint_url.startswith("http://127.0.0.1:") and s3.region == "us-east-1"
    store = tmp_path / "store.zarr"
    (store / "X" / "0").mkdir(parents=True)
    (store / ".zattrs").write_bytes(b"{}")
    (store / "X" / ".zarray").write_bytes(b'{"shape": [4]}')
    (store / "X" / "0" / "0").write_bytes(b"chunk")
    (tmp_path / "one.bin").write_bytes(DATA)
    s3.create_bucket("put-get")
    s3.put_bytes("put-get", "bytes.bin", b"abc")
    s3.put_file("put-get", "dir/one.bin", tmp_path / "one.bin")
    assert s3.put_tree("put-get", "stores/store.zarr/", store) == [
        "stores/store.zarr/.zattrs",
        "stores/store.zarr/X/.zarray",
        "stores/store.zarr/X/0/0",
    ]
    client = s3.client()
    assert client.get_object(Bucket="put-get", Key="bytes.bin")["Body"].read() == b"abc"
    assert client.get_object(Bucket="put-get", Key="dir/one.bin")["Body"].read() == DATA
    assert client.get_object(Bucket="put-get", Key="stores/store.zarr/X/0/0")["Body"].read() == b"chunk"
    s3.delete("put-get", "bytes.bin")
    assert error_of(lambda: client.get_object(Bucket="put-get", Key="bytes.bin")) == (404, "NoSuchKey")
    assert error_of(lambda: client.get_object(Bucket="no-such-bucket", Key="k")) == (404, "NoSuchBucket")


def test_s3_ranged_gets_answer_206_with_content_range_and_etag(s3):
    s3.create_bucket("ranges")
    s3.put_bytes("ranges", "data.bin", DATA)
    client = s3.client()
    whole = client.get_object(Bucket="ranges", Key="data.bin")
    etag = whole["ETag"]
    size = len(DATA)
    for requested, first, last in [
        ("bytes=2-5", 2, 5),
        ("bytes=10000-", 10000, size - 1),
        ("bytes=-7", size - 7, size - 1),
        ("bytes=10200-99999", 10200, size - 1),
    ]:
        part = client.get_object(Bucket="ranges", Key="data.bin", Range=requested)
        assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert part["ContentRange"] == f"bytes {first}-{last}/{size}"
        assert part["ETag"] == etag
        assert part["Body"].read() == DATA[first : last + 1]
    head = client.head_object(Bucket="ranges", Key="data.bin", Range="bytes=2-5")
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 206 and head["ContentLength"] == 4
    assert error_of(lambda: client.get_object(Bucket="ranges", Key="data.bin", Range=f"bytes={size}-")) == (
        416,
        "InvalidRange",
    )
    # Like S3, moto answers several ranges, or one whose end precedes its start, with the whole object.
    for ignored in ["bytes=0-1,5-6", "bytes=5-2"]:
        answer = client.get_object(Bucket="ranges", Key="data.bin", Range=ignored)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200 and answer["Body"].read() == DATA


def test_s3_if_match(s3):
    s3.create_bucket("preconditions")
    s3.put_bytes("preconditions", "k", DATA)
    client = s3.client()
    etag = client.head_object(Bucket="preconditions", Key="k")["ETag"]
    part = client.get_object(Bucket="preconditions", Key="k", IfMatch=etag, Range="bytes=0-3")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206 and part["Body"].read() == DATA[:4]
    mismatch = '"0123456789abcdef0123456789abcdef"'
    assert error_of(lambda: client.get_object(Bucket="preconditions", Key="k", IfMatch=mismatch)) == (
        412,
        "PreconditionFailed",
    )
    assert error_of(
        lambda: client.get_object(Bucket="preconditions", Key="k", IfMatch=mismatch, Range="bytes=0-3")
    ) == (412, "PreconditionFailed")
    s3.put_bytes("preconditions", "k", DATA[::-1])  # rewritten: the old ETag no longer holds
    assert error_of(lambda: client.get_object(Bucket="preconditions", Key="k", IfMatch=etag)) == (
        412,
        "PreconditionFailed",
    )


def test_s3_list_objects_v2_with_delimiter(s3):
    s3.create_bucket("listing")
    for key in ["top.bin", "store/.zattrs", "store/X/.zarray", "store/X/0", "store/obs/.zattrs", "other/x"]:
        s3.put_bytes("listing", key, b"x")
    listing = s3.client().list_objects_v2(Bucket="listing", Prefix="store/", Delimiter="/")
    assert [entry["Key"] for entry in listing["Contents"]] == ["store/.zattrs"]
    assert [entry["Prefix"] for entry in listing["CommonPrefixes"]] == ["store/X/", "store/obs/"]
    assert listing["KeyCount"] == 3 and not listing["IsTruncated"]
    paged = s3.client().list_objects_v2(Bucket="listing", Prefix="store/", MaxKeys=2)
    assert paged["IsTruncated"] and paged["KeyCount"] == 2
    rest = s3.client().list_objects_v2(
        Bucket="listing", Prefix="store/", ContinuationToken=paged["NextContinuationToken"]
    )
    assert [entry["Key"] for entry in paged["Contents"] + rest["Contents"]] == [
        "store/.zattrs",
        "store/X/.zarray",
        "store/X/0",
        "store/obs/.zattrs",
    ]


def test_s3_by_default_accepts_any_signature(s3):
    s3.create_bucket("unchecked")
    s3.put_bytes("unchecked", "k", b"v")
    assert s3.client(secret_key="wrong").get_object(Bucket="unchecked", Key="k")["Body"].read() == b"v"


def test_s3_verify_signatures_rejects_a_wrong_signature(s3_verified):
    assert s3_verified.access_key.startswith("AKIA") and s3_verified.secret_key != "testing"
    s3_verified.create_bucket("checked")
    s3_verified.put_bytes("checked", "dir/k y+z.bin", DATA)  # characters that are escaped when signing
    client = s3_verified.client()
    assert client.get_object(Bucket="checked", Key="dir/k y+z.bin", Range="bytes=1-2")["Body"].read() == DATA[1:3]
    assert client.list_objects_v2(Bucket="checked", Prefix="dir/", Delimiter="/")["KeyCount"] == 1
    wrong = s3_verified.client(secret_key="wrong")
    assert error_of(lambda: wrong.get_object(Bucket="checked", Key="dir/k y+z.bin")) == (403, "SignatureDoesNotMatch")
    assert error_of(lambda: wrong.list_objects_v2(Bucket="checked")) == (403, "SignatureDoesNotMatch")
    status, _, _ = fetch(s3_verified.endpoint_url, "GET", "/checked/dir/k%20y%2Bz.bin")  # unsigned
    assert status == 403


def test_s3_server_process_ends_even_when_the_test_fails():
    with pytest.raises(RuntimeError, match="the test failed"):
        with S3Server() as server:
            process = server.process
            raise RuntimeError("the test failed")
    assert process.poll() is not None
    assert refuses_connections(server.endpoint_url)


# ---- RangeHTTPServer --------------------------------------------------------------------------------


def test_http_get_and_head(http_server):
    assert http_server.url.startswith("http://127.0.0.1:")
    status, headers, body = fetch(http_server.url, "GET", "/data.bin")
    assert (status, body) == (200, DATA)
    assert headers["content-length"] == str(len(DATA)) and headers["accept-ranges"] == "bytes"
    assert headers["etag"].startswith('"') and headers["etag"].endswith('"')
    status, head_headers, body = fetch(http_server.url, "HEAD", "/data.bin")
    assert (status, body) == (200, b"")
    assert head_headers["content-length"] == str(len(DATA)) and head_headers["etag"] == headers["etag"]
    assert fetch(http_server.url, "GET", "/sub/a%20b.txt?query=ignored")[::2] == (200, b"spaced")
    assert fetch(http_server.url, "GET", "/empty.bin")[::2] == (200, b"")


@pytest.mark.parametrize(
    "requested, first, last",
    [
        ("bytes=0-0", 0, 0),
        ("bytes=2-5", 2, 5),
        ("bytes=10000-", 10000, 10239),
        ("bytes=-7", 10233, 10239),
        ("bytes=10200-99999", 10200, 10239),
        ("bytes=-99999", 0, 10239),
    ],
)
def test_http_range_answers_206(http_server, requested, first, last):
    whole_etag = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    for method in ["GET", "HEAD"]:
        status, headers, body = fetch(http_server.url, method, "/data.bin", Range=requested)
        assert status == 206
        assert headers["content-range"] == f"bytes {first}-{last}/{len(DATA)}"
        assert headers["content-length"] == str(last - first + 1) and headers["etag"] == whole_etag
        assert body == (DATA[first : last + 1] if method == "GET" else b"")


@pytest.mark.parametrize(
    "path, requested", [("/data.bin", "bytes=10240-"), ("/data.bin", "bytes=-0"), ("/empty.bin", "bytes=0-")]
)
def test_http_unsatisfiable_range_answers_416(http_server, path, requested):
    status, headers, _ = fetch(http_server.url, "GET", path, Range=requested)
    size = len(DATA) if path == "/data.bin" else 0
    assert status == 416 and headers["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize("requested", ["bytes=0-1,5-6", "bytes=5-2", "items=0-1", "bytes=x-1"])
def test_http_ranges_it_may_ignore_answer_200(http_server, requested):
    assert fetch(http_server.url, "GET", "/data.bin", Range=requested)[::2] == (200, DATA)


def test_http_etag_changes_when_the_file_is_rewritten(http_server, files):
    path = files / "data.bin"
    etag = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    assert fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"] == etag
    path.write_bytes(DATA + b"!")  # another size
    grown = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    path.write_bytes(DATA)
    os.utime(path, ns=(1, 1))  # the same size, another mtime
    touched = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    (files / "new.bin").write_bytes(DATA)
    os.utime(files / "new.bin", ns=(1, 1))
    os.replace(files / "new.bin", path)  # the same size and mtime, another inode
    replaced = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    assert len({etag, grown, touched, replaced}) == 4


def test_http_if_match(http_server):
    etag = fetch(http_server.url, "HEAD", "/data.bin")[1]["etag"]
    assert fetch(http_server.url, "GET", "/data.bin", **{"If-Match": etag})[::2] == (200, DATA)
    assert fetch(http_server.url, "GET", "/data.bin", **{"If-Match": f'"other", {etag}'})[0] == 200
    assert fetch(http_server.url, "GET", "/data.bin", **{"If-Match": "*"})[0] == 200
    status, headers, body = fetch(http_server.url, "GET", "/data.bin", **{"If-Match": etag, "Range": "bytes=3-4"})
    assert (status, body) == (206, DATA[3:5])
    for method in ["GET", "HEAD"]:
        assert fetch(http_server.url, method, "/data.bin", **{"If-Match": '"other"'})[0] == 412
        assert fetch(http_server.url, method, "/data.bin", **{"If-Match": '"other"', "Range": "bytes=3-4"})[0] == 412


def test_http_missing_files_directories_and_escapes(http_server, files):
    os.symlink(files.parent / "secret.txt", files / "link.txt")
    for path in ["/missing.bin", "/sub/missing", "/data.bin/x"]:
        assert fetch(http_server.url, "GET", path)[0] == 404
        assert fetch(http_server.url, "HEAD", path)[0] == 404
    for path in ["/", "/sub", "/sub/"]:  # no listings
        assert fetch(http_server.url, "GET", path)[0] == 404
    for path in ["/../secret.txt", "/sub/../../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E%2Fsecret.txt"]:
        assert fetch(http_server.url, "GET", path)[::2] == (403, b"outside the served directory\n")
    assert fetch(http_server.url, "GET", "/link.txt")[0] == 403  # a symbolic link out of root
    assert fetch(http_server.url, "GET", "/sub/../data.bin")[::2] == (200, DATA)


def test_http_keeps_connections_alive(http_server):
    connection = connect(http_server.url)
    try:
        assert send(connection, "GET", "/data.bin")[0] == 200
        sock = connection.sock
        for path, headers, expected in [
            ("/data.bin", {"Range": "bytes=0-9"}, 206),
            ("/missing.bin", {}, 404),
            ("/data.bin", {"Range": "bytes=99999-"}, 416),
            ("/data.bin", {"If-Match": '"other"'}, 412),
            ("/../secret.txt", {}, 403),
            ("/data.bin", {}, 200),
        ]:
            assert send(connection, "GET", path, **headers)[0] == expected
            assert send(connection, "HEAD", path, **headers)[0] == expected
            assert connection.sock is sock  # not reconnected
    finally:
        connection.close()


def test_http_request_log_and_latency(files):
    with RangeHTTPServer(files, latency=0.2) as server:
        start = time.monotonic()
        fetch(server.url, "GET", "/data.bin", Range="bytes=0-1")
        assert time.monotonic() - start >= 0.2
        server.latency = 0.0
        fetch(server.url, "HEAD", "/data.bin")
        fetch(server.url, "GET", "/sub/a%20b.txt")
        assert server.requests == [
            ("GET", "/data.bin", "bytes=0-1"),
            ("HEAD", "/data.bin", None),
            ("GET", "/sub/a%20b.txt", None),
        ]
        assert server.count() == 3 and server.count("GET") == 2 and server.count("HEAD") == 1
        assert server.count(path_prefix="/sub/") == 1 and server.count("HEAD", "/sub/") == 0
        server.reset_log()
        assert server.requests == [] and server.count() == 0


def test_http_server_closes_with_a_connection_open(files):
    before = set(threading.enumerate())
    with RangeHTTPServer(files) as server:
        idle = connect(server.url)
        assert send(idle, "GET", "/data.bin")[0] == 200  # the connection stays open, its thread waiting
    try:
        assert set(threading.enumerate()) <= before
        assert refuses_connections(server.url)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            send(idle, "GET", "/data.bin")
    finally:
        idle.close()


# ---- FaultProxy ---------------------------------------------------------------------------------------


def test_proxy_relays_byte_exact(http_server, proxy):
    connection = connect(proxy.url)
    try:
        direct = fetch(http_server.url, "GET", "/data.bin")
        status, headers, body = send(connection, "GET", "/data.bin")
        assert (status, body) == (200, DATA)
        sock = connection.sock
        assert headers["etag"] == direct[1]["etag"] and headers["content-length"] == str(len(DATA))
        status, headers, body = send(connection, "GET", "/data.bin", Range="bytes=100-199")
        assert (status, body) == (206, DATA[100:200]) and headers["content-range"] == f"bytes 100-199/{len(DATA)}"
        status, headers, body = send(connection, "HEAD", "/data.bin", Range="bytes=-5")
        assert (status, body, headers["content-length"]) == (206, b"", "5")
        assert send(connection, "GET", "/data.bin", **{"If-Match": '"other"'})[0] == 412
        assert send(connection, "GET", "/missing.bin")[0] == 404
        assert send(connection, "GET", "/sub/a%20b.txt?x=1&y=%2F")[::2] == (200, b"spaced")
        assert connection.sock is sock  # keep-alive on the client's side
    finally:
        connection.close()
    assert [path for _, path, _ in http_server.requests[1:]] == [path for _, path, _ in proxy.requests]
    assert http_server.requests[-1] == ("GET", "/sub/a%20b.txt?x=1&y=%2F", None)
    assert proxy.fired == []


@pytest.mark.parametrize(
    "kind, status, code",
    [("status_503", 503, "SlowDown"), ("status_500", 500, "InternalError"), ("status_429", 429, "TooManyRequests")],
)
def test_proxy_error_status_faults(http_server, proxy, kind, status, code):
    proxy.inject(kind, count=2, retry_after=3)
    assert proxy.pending() == 2
    connection = connect(proxy.url)
    try:
        for _ in range(2):
            answer, headers, body = send(connection, "GET", "/data.bin")
            assert answer == status and f"<Code>{code}</Code>".encode() in body
            assert headers["retry-after"] == "3" and headers["content-length"] == str(len(body))
        assert http_server.count() == 0  # the upstream was not asked
        assert send(connection, "GET", "/data.bin")[::2] == (200, DATA)  # the same connection, then a normal answer
    finally:
        connection.close()
    assert proxy.pending() == 0
    assert proxy.fired == [(kind, "GET", "/data.bin")] * 2


def test_proxy_reset(proxy):
    proxy.inject("reset")
    connection = connect(proxy.url)
    try:
        with pytest.raises(ConnectionError):
            send(connection, "GET", "/data.bin")
    finally:
        connection.close()
    assert proxy.fired == [("reset", "GET", "/data.bin")]
    assert fetch(proxy.url, "GET", "/data.bin")[::2] == (200, DATA)


@pytest.mark.parametrize("kind, received", [("drop_mid_body", len(DATA) // 2), ("truncate", len(DATA) - 1)])
def test_proxy_cut_bodies(proxy, kind, received):
    proxy.inject(kind)
    connection = connect(proxy.url)
    try:
        connection.request("GET", "/data.bin")
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Length") == str(len(DATA))
        with pytest.raises(http.client.IncompleteRead) as cut:
            response.read()
        assert cut.value.partial == DATA[:received]
    finally:
        connection.close()
    proxy.inject(kind)
    connection = connect(proxy.url)
    try:
        connection.request("GET", "/data.bin", headers={"Range": "bytes=0-99"})
        response = connection.getresponse()
        assert response.status == 206
        with pytest.raises(http.client.IncompleteRead) as cut:
            response.read()
        assert len(cut.value.partial) == (50 if kind == "drop_mid_body" else 99)
    finally:
        connection.close()


def test_proxy_slow_makes_a_client_time_out(proxy):
    proxy.inject("slow", seconds=3)
    connection = connect(proxy.url, timeout=0.3)
    try:
        with pytest.raises(TimeoutError):
            send(connection, "GET", "/data.bin")
    finally:
        connection.close()
    proxy.inject("slow", seconds=0.3)
    start = time.monotonic()
    assert fetch(proxy.url, "GET", "/data.bin")[::2] == (200, DATA)
    assert time.monotonic() - start >= 0.3


def test_proxy_faults_match_paths_in_order(http_server, proxy):
    proxy.inject("status_503", path_contains="/sub/")
    proxy.inject("status_500", count=2)
    assert proxy.pending() == 3
    assert fetch(proxy.url, "GET", "/data.bin")[0] == 500
    assert fetch(proxy.url, "GET", "/sub/a%20b.txt")[0] == 503  # injected first, so it comes first
    assert fetch(proxy.url, "GET", "/sub/a%20b.txt")[0] == 500
    assert fetch(proxy.url, "GET", "/sub/a%20b.txt")[0] == 200
    assert proxy.pending() == 0
    assert [kind for kind, _, _ in proxy.fired] == ["status_500", "status_503", "status_500"]
    assert proxy.count() == 4 and http_server.count() == 1
    proxy.reset_log()
    assert proxy.requests == [] and proxy.fired == []
    for bad in [
        {"kind": "status_404"},
        {"kind": "reset", "count": 0},
        {"kind": "slow"},
        {"kind": "reset", "seconds": 1},
    ]:
        with pytest.raises(ValueError):
            proxy.inject(**bad)


def test_proxy_latency(proxy):
    proxy.latency = 0.2
    start = time.monotonic()
    fetch(proxy.url, "HEAD", "/data.bin")
    assert time.monotonic() - start >= 0.2


def test_proxy_closes_cleanly_while_a_request_sleeps(files):
    before = set(threading.enumerate())
    with RangeHTTPServer(files) as upstream, FaultProxy(upstream.url) as proxy:
        proxy.inject("slow", seconds=30)
        connection = connect(proxy.url, timeout=0.2)
        with pytest.raises(TimeoutError):
            send(connection, "GET", "/data.bin")
        start = time.monotonic()
    assert time.monotonic() - start < 5
    assert upstream.count() == 0
    connection.close()
    assert set(threading.enumerate()) <= before
    assert refuses_connections(proxy.url)


def test_proxy_to_upstream_gone_answers_502(files):
    with RangeHTTPServer(files) as server:
        upstream = server.url
    with FaultProxy(upstream) as proxy:
        assert fetch(proxy.url, "GET", "/data.bin")[0] == 502


def test_proxy_in_front_of_s3(s3):
    s3.create_bucket("proxied")
    with FaultProxy(s3.endpoint_url) as proxy:
        client = s3.client(endpoint_url=proxy.url)
        client.put_object(Bucket="proxied", Key="data.bin", Body=DATA)  # a body through the proxy
        part = client.get_object(Bucket="proxied", Key="data.bin", Range="bytes=10-19")
        assert part["ContentRange"] == f"bytes 10-19/{len(DATA)}" and part["Body"].read() == DATA[10:20]
        proxy.inject("status_503", path_contains="/proxied/data.bin")
        assert client.get_object(Bucket="proxied", Key="data.bin")["Body"].read() == DATA  # boto3 retried
        assert [kind for kind, _, _ in proxy.fired] == ["status_503"]
        assert proxy.count("GET", "/proxied/data.bin") == 3 and proxy.count("PUT") == 1


def test_proxy_passes_signatures_through(s3_verified):
    s3_verified.create_bucket("proxied-signed")
    with FaultProxy(s3_verified.endpoint_url) as proxy:
        client = s3_verified.client(endpoint_url=proxy.url)
        client.put_object(Bucket="proxied-signed", Key="dir/data.bin", Body=DATA)
        part = client.get_object(Bucket="proxied-signed", Key="dir/data.bin", Range="bytes=-4")
        assert part["Body"].read() == DATA[-4:]
        listing = client.list_objects_v2(Bucket="proxied-signed", Prefix="dir/", Delimiter="/")
        assert [entry["Key"] for entry in listing["Contents"]] == ["dir/data.bin"]
        wrong = s3_verified.client(endpoint_url=proxy.url, secret_key="wrong")
        assert error_of(lambda: wrong.get_object(Bucket="proxied-signed", Key="dir/data.bin")) == (
            403,
            "SignatureDoesNotMatch",
        )
