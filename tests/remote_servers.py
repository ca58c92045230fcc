"""Real servers for the tests of reading over S3 and HTTP(S), each a context manager that a test
starts and stops, listening on 127.0.0.1 only, on a free port:

- S3Server: moto's standalone S3 server in a subprocess, optionally rejecting requests whose
  AWS Signature V4 is wrong;
- RangeHTTPServer: the files under a local directory over HTTP/1.1 (keep-alive, Range, ETag, If-Match);
- FaultProxy: an HTTP/1.1 reverse proxy in front of either that injects faults (error statuses,
  connection resets, cut bodies, delays) into chosen requests;
- CredentialsServer: the services that hand out AWS credentials (instance and container metadata, SSO);
- SilentServer: a port that takes connections and never answers (a metadata service off EC2).

Startup waits are bounded, and leaving the `with` block ends every process, thread and connection
the server started, whether the test passed or not."""

import http.client
import json
import os
import re
import socket
import socketserver
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from xml.sax.saxutils import escape

import boto3
import botocore.config

HOST = "127.0.0.1"


# ---- S3 (moto) ------------------------------------------------------------------------------------


def _allow(actions) -> dict:
    return {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": "*"}]}


class S3Server:
    """moto's standalone S3 server (`python -m moto.server`) in a subprocess on 127.0.0.1, with
    helpers to fill it through boto3. `endpoint_url`, `access_key`, `secret_key` and `region` are
    what a client needs; they are set on entering the `with` block.

    By default moto accepts any credentials and signature (but answers unsigned requests for
    objects 403: buckets are private). With verify_signatures=True it checks every request's
    Signature V4 against an IAM user's access key (made by the first requests, before checking is
    switched on) and answers 403 SignatureDoesNotMatch to a wrong one.

    `process` is the server's subprocess.Popen while it runs. moto's server (werkzeug's) closes
    the connection after every response: for keep-alive on the client's side, put a FaultProxy in
    front of it."""

    region = "us-east-1"
    _USER = "torch-shards-tests"

    def __init__(self, verify_signatures: bool = False, startup_timeout: float = 30.0):
        self.verify_signatures = verify_signatures
        self.startup_timeout = startup_timeout
        self.endpoint_url = None
        self.access_key = "testing"
        self.secret_key = "testing"
        self.process = None
        self._output = None
        self._session = boto3.session.Session()  # its clients share the API models it loads once
        self._session_lock = threading.Lock()  # making clients is not thread-safe (using them is)
        self._client = None

    def __enter__(self):
        self._output = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)  # no checking until the IAM user exists
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + self.startup_timeout
            port = self._wait_for_port(deadline)
            self.endpoint_url = f"http://{HOST}:{port}"
            self._wait_until_answering(port, deadline)
            if self.verify_signatures:
                self._switch_on_signature_checks()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc_info):
        self._stop()

    def client(self, endpoint_url: Optional[str] = None, secret_key: Optional[str] = None):
        """A boto3 S3 client with this server's credentials (path-style addressing), sending to
        endpoint_url (a FaultProxy's url, say) instead of the server if given, signing with
        secret_key instead of the right one if given."""
        with self._session_lock:
            return self._session.client(
                "s3",
                endpoint_url=endpoint_url or self.endpoint_url,
                region_name=self.region,
                aws_access_key_id=self.access_key,
                aws_secret_access_key=secret_key or self.secret_key,
                config=botocore.config.Config(s3={"addressing_style": "path"}),
            )

    def create_bucket(self, name: str):
        self._s3().create_bucket(Bucket=name)

    def put_bytes(self, bucket: str, key: str, data: bytes):
        self._s3().put_object(Bucket=bucket, Key=key, Body=data)

    def put_file(self, bucket: str, key: str, path):
        with open(path, "rb") as file:
            self._s3().put_object(Bucket=bucket, Key=key, Body=file)

    def put_tree(self, bucket: str, prefix: str, local_dir) -> list:
        """Uploads every file under local_dir as prefix/relative/path (a zarr store, say); returns
        the keys, sorted."""
        keys = []
        for directory, _, names in os.walk(local_dir):
            for name in names:
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, local_dir).replace(os.sep, "/")
                key = f"{prefix.rstrip('/')}/{relative}" if prefix else relative
                self.put_file(bucket, key, path)
                keys.append(key)
        return sorted(keys)

    def delete(self, bucket: str, key: str):
        self._s3().delete_object(Bucket=bucket, Key=key)

    def _s3(self):
        if self._client is None:
            self._client = self.client()
        return self._client

    def _server_output(self) -> str:
        return os.pread(self._output.fileno(), 1 << 20, 0).decode(errors="replace")

    def _wait_for_port(self, deadline: float) -> int:
        # Werkzeug prints the port it bound (port 0: a free one) once it listens.
        while True:
            match = re.search(r"Running on http://127\.0\.0\.1:(\d+)", self._server_output())
            if match:
                return int(match.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's server exited with {self.process.returncode}:\n{self._server_output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"moto's server did not start in {self.startup_timeout} s:\n{self._server_output()}")
            time.sleep(0.05)

    def _wait_until_answering(self, port: int, deadline: float):
        while True:
            connection = http.client.HTTPConnection(HOST, port, timeout=max(deadline - time.monotonic(), 0.1))
            try:
                connection.request("GET", "/")  # ListBuckets, unsigned
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                connection.close()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"moto's server did not answer in {self.startup_timeout} s:\n{self._server_output()}"
                )
            time.sleep(0.05)

    def _iam(self):
        """An IAM client signing with the current access key."""
        return self._session.client(
            "iam",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def _switch_on_signature_checks(self):
        # Checks are off while moto's INITIAL_NO_AUTH_ACTION_COUNT is not reached (infinite by
        # default): make an IAM user allowed s3:* with an access key, then set the count to 0
        # (/moto-api/reset-auth) so that every later request is checked against that key.
        iam = self._iam()
        iam.create_user(UserName=self._USER)
        # s3:*, and IAM: its own keys' rotation (rotate_access_key), other users and roles (add_user, add_role),
        # which it may assume.
        actions = ["s3:*", "iam:*", "sts:AssumeRole"]
        iam.put_user_policy(UserName=self._USER, PolicyName="s3", PolicyDocument=json.dumps(_allow(actions)))
        key = iam.create_access_key(UserName=self._USER)["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        self._reset_auth(0)

    def _reset_auth(self, count: int):
        connection = http.client.HTTPConnection(urllib.parse.urlsplit(self.endpoint_url).netloc, timeout=10)
        try:
            connection.request("POST", "/moto-api/reset-auth", body=str(count).encode())
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"moto's reset-auth answered {response.status}: {response.read()!r}")
        finally:
            connection.close()

    def rotate_access_key(self):
        """With verify_signatures=True: a new access key for the server's user, the old one deleted (requests
        signed with it are then refused 403); access_key and secret_key become the new one's."""
        iam = self._iam()
        key = iam.create_access_key(UserName=self._USER)["AccessKey"]
        iam.delete_access_key(UserName=self._USER, AccessKeyId=self.access_key)
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def skip_checks(self, count: int):
        """With verify_signatures=True: the next `count` requests are not checked. moto checks an
        AssumeRoleWithWebIdentity as if signed, and fails it, where STS takes it unsigned."""
        self._reset_auth(count)

    def add_user(self, name: str, actions) -> tuple:
        """With verify_signatures=True: a new IAM user allowed `actions` (e.g. ["sts:AssumeRole"]);
        returns its (access key, secret key)."""
        iam = self._iam()
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(_allow(actions)))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def add_role(self, name: str, actions) -> str:
        """With verify_signatures=True: a new IAM role allowed `actions` (e.g. ["s3:*"]), which anyone may
        assume (moto's STS answers AssumeRole and AssumeRoleWithWebIdentity for it); returns its ARN."""
        iam = self._iam()
        trust = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
        }
        role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(_allow(actions)))
        return role["Arn"]

    def _stop(self):
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self._output is not None:
            self._output.close()
            self._output = None
        self._client = None


# ---- Threaded HTTP servers, common part -----------------------------------------------------------


class _LoopbackServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer on 127.0.0.1 (free port) that, on close, also ends the connections
    its threads hold open (keep-alive) and joins those threads. `owner` is the RangeHTTPServer or
    FaultProxy its handlers serve for; `closing` is set once it closes (handlers wait on it)."""

    # Connections waiting to be accepted: a client opening hundreds at once (a reader's 32 threads, each
    # with its requests in flight) must not overflow the backlog (socketserver's default of 5; 256 dropped
    # ~15,000 SYNs in a benchmark's epoch here), or its SYNs are dropped and retried a second later. The
    # kernel caps it at net.core.somaxconn.
    request_queue_size = 4096

    def __init__(self, handler_class, owner):
        self.owner = owner
        self.closing = threading.Event()
        self._open_lock = threading.Lock()
        self._open = {}  # connection's socket -> thread serving it
        self.accepted = 0  # connections accepted so far
        super().__init__((HOST, 0), handler_class)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # HTTPServer's would look the host's name up
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address):
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address), daemon=True)
        with self._open_lock:
            self._open[request] = thread
            self.accepted += 1
        thread.start()

    def _serve_connection(self, request, client_address):
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)

    def handle_error(self, request, client_address):
        # A client that goes away mid-response (a timeout, a test's fault) is expected here.
        if not isinstance(sys.exc_info()[1], OSError) and not self.closing.is_set():
            super().handle_error(request, client_address)

    def close(self, timeout: float = 5.0):
        self.closing.set()
        self.shutdown()
        self.server_close()
        with self._open_lock:
            open_connections = list(self._open.items())
        for connection, _ in open_connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread
        for _, thread in open_connections:
            thread.join(timeout)


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive) handler of a _LoopbackServer."""

    protocol_version = "HTTP/1.1"
    # A response's headers and body are two writes: with Nagle's algorithm the body would wait for the
    # client's delayed ACK of the headers (40 ms on Linux), a latency no object store adds.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass  # the owner's request log replaces lines on stderr

    def send_complete(self, status: int, body: bytes = b"", headers=()):
        """A whole response with its Content-Length, keeping the connection open (send_error
        would close it); no body to HEAD."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _HTTPService:
    """What RangeHTTPServer and FaultProxy share: the context manager running a _LoopbackServer
    with handler_class in a thread, `url`, a thread-safe log of the requests received,
    `requests`: (method, path, Range header or None) in arrival order, and the count of
    `connections` accepted."""

    handler_class = None

    def __init__(self):
        self.url = None
        self.requests = []
        self._lock = threading.Lock()
        self._server = None
        self._thread = None

    def __enter__(self):
        self._server = _LoopbackServer(self.handler_class, self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.url = f"http://{HOST}:{self._server.server_port}"
        return self

    def __exit__(self, *exc_info):
        self._server.close()
        self._thread.join(5.0)

    def count(self, method: Optional[str] = None, path_prefix: Optional[str] = None) -> int:
        """The number of requests logged with this method and a path starting with path_prefix
        (None: any)."""
        with self._lock:
            return sum(
                (method is None or logged_method == method) and (path_prefix is None or path.startswith(path_prefix))
                for logged_method, path, _ in self.requests
            )

    def reset_log(self):
        with self._lock:
            self.requests.clear()

    @property
    def connections(self) -> int:
        """The connections accepted so far."""
        with self._server._open_lock:
            return self._server.accepted

    def record(self, method: str, path: str, range_header: Optional[str]):
        with self._lock:
            self.requests.append((method, path, range_header))

    def wait(self, seconds: float):
        """Sleeps, cut short when the server closes."""
        if seconds > 0:
            self._server.closing.wait(seconds)


# ---- Files over HTTP ------------------------------------------------------------------------------

_UNSATISFIABLE = "unsatisfiable"


def _byte_range(header: Optional[str], size: int):
    """(first, last) bytes a `Range: bytes=a-b | a- | -n` header asks of size bytes; None to send
    them all (no header, or one HTTP lets a server ignore: several ranges, malformed, b < a); or
    _UNSATISFIABLE."""
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header or "")
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last n bytes
        suffix = int(last)
        return (max(size - suffix, 0), size - 1) if suffix > 0 and size > 0 else _UNSATISFIABLE
    first = int(first)
    if last != "" and int(last) < first:
        return None
    if first >= size:
        return _UNSATISFIABLE
    return first, size - 1 if last == "" else min(int(last), size - 1)


class _FileHandler(_Handler):
    """Serves RangeHTTPServer's files: GET and HEAD, one byte range, ETag and If-Match."""

    def do_GET(self):
        self._serve()

    def do_HEAD(self):
        self._serve()

    def _serve(self):
        files = self.server.owner
        range_header = self.headers.get("Range")
        files.record(self.command, self.path, range_header)
        files.wait(files.latency)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if files.s3_listing and self.command == "GET" and query.get("list-type") == ["2"]:
            return self._list_objects(files, query)
        path = files.resolve(self.path)
        if path is None:
            return self.send_complete(403, b"outside the served directory\n")
        try:
            file = open(path, "rb")
        except OSError:  # missing, a directory, unreadable
            return self.send_complete(404, b"not found\n")
        with file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return self.send_complete(404, b"not found\n")
            size = info.st_size
            etag = f'"{size:x}-{info.st_mtime_ns:x}-{info.st_ino:x}"'
            if_match = self.headers.get("If-Match")
            if (
                if_match is not None
                and if_match.strip() != "*"
                and etag not in [t.strip() for t in if_match.split(",")]
            ):
                return self.send_complete(412, b"precondition failed\n", [("ETag", etag)])
            span = _byte_range(range_header, size)
            if span == _UNSATISFIABLE:
                return self.send_complete(416, b"range not satisfiable\n", [("Content-Range", f"bytes */{size}")])
            first, last = span or (0, size - 1)
            self.send_response(200 if span is None else 206)
            if span is not None:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", self.date_time_string(int(info.st_mtime)))
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            if self.command == "GET":
                file.seek(first)
                left = last - first + 1
                while left > 0:
                    chunk = file.read(min(left, 1 << 20))
                    if not chunk:
                        raise OSError(f"{path} shrank while being sent")
                    self.wfile.write(chunk)
                    left -= len(chunk)

    def _list_objects(self, files, query):
        """S3's ListObjectsV2 of the bucket (the request path's first directory): keys are the
        files' paths below it; with delimiter "/", directories below the prefix as CommonPrefixes."""
        bucket = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).strip("/").split("/")[0]
        base = files.resolve("/" + bucket)
        if not bucket or base is None or not os.path.isdir(base):
            return self.send_complete(404, b"<Error><Code>NoSuchBucket</Code></Error>")
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        max_keys = int(query.get("max-keys", ["1000"])[0])
        after = query.get("continuation-token", [""])[0]
        entries = set()  # (key or common prefix, is a prefix)
        for directory, _, names in os.walk(base):
            for name in names:
                key = os.path.relpath(os.path.join(directory, name), base).replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                cut = key.find(delimiter, len(prefix)) if delimiter else -1
                entries.add((key[: cut + 1], True) if cut >= 0 else (key, False))
        listed = sorted(entry for entry in entries if entry[0] > after)
        page, truncated = listed[:max_keys], len(listed) > max_keys
        body = ["<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"]
        body.append(f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>")
        body.append(f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if truncated:
            body.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
        for name, is_prefix in page:
            if is_prefix:
                body.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
            else:
                info = os.stat(os.path.join(base, name))
                modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(info.st_mtime))
                etag = escape(f'"{info.st_size:x}-{info.st_mtime_ns:x}-{info.st_ino:x}"')
                body.append(
                    f"<Contents><Key>{escape(name)}</Key><LastModified>{modified}</LastModified><ETag>{etag}</ETag>"
                    f"<Size>{info.st_size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
                )
        body.append("</ListBucketResult>")
        self.send_complete(200, "".join(body).encode(), [("Content-Type", "application/xml")])


class RangeHTTPServer(_HTTPService):
    """The files under root over HTTP/1.1 with keep-alive, as an object store's HTTP endpoint
    would serve them: GET and HEAD; a single `Range: bytes=a-b | a- | -n` answered 206 with
    Content-Range (416 if unsatisfiable); a quoted ETag from size, mtime_ns and inode (rewriting a
    file changes it) and Content-Length on every 200, 206 and HEAD; If-Match with another ETag
    answered 412; missing files and directories 404 (no listings); paths outside root 403.

    latency: seconds slept before each response (settable; for benchmarks).
    s3_listing: also answer S3's ListObjectsV2 (GET /<bucket>?list-type=2...), each directory of
    root a bucket: an unsigned, path-style S3 endpoint for benchmarks, where moto's server (a
    connection per request, in Python) would be the bottleneck."""

    handler_class = _FileHandler

    def __init__(self, root, latency: float = 0.0, s3_listing: bool = False):
        super().__init__()
        self.root = os.path.realpath(root)
        self.latency = latency
        self.s3_listing = s3_listing

    def resolve(self, request_path: str) -> Optional[str]:
        """The local path a request's path names, None if outside root."""
        try:
            relative = urllib.parse.unquote(urllib.parse.urlsplit(request_path).path, errors="strict")
            path = os.path.realpath(os.path.join(self.root, relative.lstrip("/")))
        except ValueError:  # a NUL byte, undecodable escapes
            return None
        return path if path == self.root or path.startswith(self.root + os.sep) else None


# ---- Fault-injecting proxy ------------------------------------------------------------------------

_ERROR_STATUSES = {
    "status_500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "status_503": (503, "SlowDown", "Please reduce your request rate."),
    "status_429": (429, "TooManyRequests", "Please reduce your request rate."),
}
_BODY_CUTS = {"drop_mid_body": lambda size: size // 2, "truncate": lambda size: max(size - 1, 0)}
FAULT_KINDS = (*_ERROR_STATUSES, "reset", *_BODY_CUTS, "slow")
# Not forwarded either way (hop-by-hop, or recomputed since bodies are relayed whole).
_NOT_RELAYED = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
    "content-length",
    "expect",
}


@dataclass
class _Fault:
    kind: str
    count: int
    path_contains: Optional[str]
    seconds: Optional[float]
    retry_after: Optional[int]
    method: Optional[str] = None


class _ProxyHandler(_Handler):
    """Relays one client connection's requests to FaultProxy's upstream over one keep-alive
    connection of its own, applying the fault each request draws."""

    def setup(self):
        super().setup()
        self._upstream = None

    def finish(self):
        if self._upstream is not None:
            self._upstream.close()
        super().finish()

    def do_GET(self):
        self._relay()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _relay(self):
        proxy = self.server.owner
        body = self._read_body()
        proxy.record(self.command, self.path, self.headers.get("Range"))
        fault = proxy.take_fault(self.command, self.path)
        kind = fault.kind if fault else None
        proxy.wait(proxy.latency + (fault.seconds if kind == "slow" else 0))
        if self.server.closing.is_set():  # woken by the proxy closing: no answer
            self.close_connection = True
            return None
        if kind in _ERROR_STATUSES:
            status, code, message = _ERROR_STATUSES[kind]
            xml = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            xml += f"<Message>{message}</Message></Error>"
            headers = [("Content-Type", "application/xml")]
            if fault.retry_after is not None:
                headers.append(("Retry-After", str(fault.retry_after)))
            return self.send_complete(status, xml.encode(), headers)
        if kind == "reset":  # an RST, not a FIN: close at once with SO_LINGER 0
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return None
        try:
            response, payload = self._forward(body)
        except (OSError, http.client.HTTPException) as error:
            return self.send_complete(502, f"upstream: {error!r}\n".encode())
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _NOT_RELAYED:
                self.send_header(name, value)
        no_body = self.command == "HEAD" or response.status in (204, 304)
        length = response.getheader("Content-Length") if no_body else str(len(payload))
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        sent = _BODY_CUTS[kind](len(payload)) if kind in _BODY_CUTS else len(payload)
        self.wfile.write(payload[:sent])
        if sent < len(payload):
            self.close_connection = True
        return None

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailer fields
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes):
        """(response, its whole body) from the upstream for this request, sent with the client's
        headers unchanged (Host and Authorization included: a Signature V4 stays valid)."""
        proxy = self.server.owner
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in _NOT_RELAYED]
        if body or "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
            headers.append(("Content-Length", str(len(body))))
        if "Host" not in self.headers:
            headers.append(("Host", proxy.upstream_netloc))
        while True:
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(proxy.upstream_netloc, timeout=proxy.upstream_timeout)
            reused = self._upstream.sock is not None
            try:
                self._upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    self._upstream.putheader(name, value)
                self._upstream.endheaders(body)
                response = self._upstream.getresponse()
                return response, response.read()
            except ConnectionError:
                self._upstream.close()
                self._upstream = None
                if not reused:
                    raise
                # the upstream had closed the idle keep-alive connection: once more on a new one


class FaultProxy(_HTTPService):
    """An HTTP/1.1 reverse proxy on 127.0.0.1 in front of upstream_url (an S3Server or a
    RangeHTTPServer), keep-alive on both sides, that forwards each request (method, path and
    query, headers with Host, Authorization and Range unchanged, body) and relays the response,
    unless a fault injected with inject() applies to it.

    latency: seconds added to every request (settable). `requests` logs every request received,
    `fired` every fault applied: (kind, method, path)."""

    handler_class = _ProxyHandler

    def __init__(self, upstream_url: str, upstream_timeout: float = 30.0):
        super().__init__()
        self.upstream_netloc = urllib.parse.urlsplit(upstream_url).netloc
        self.upstream_timeout = upstream_timeout
        self.latency = 0.0
        self.fired = []
        self._faults = []

    def inject(
        self,
        kind: str,
        count: int = 1,
        path_contains: Optional[str] = None,
        seconds: Optional[float] = None,
        retry_after: Optional[int] = None,
        method: Optional[str] = None,
    ):
        """Applies a fault to the next count requests whose path (with query) contains
        path_contains (None: any request), of `method` only if given; faults injected earlier
        apply first. Kinds:

        status_503, status_500, status_429: that status with an S3-style XML error body (and
          Retry-After: retry_after if given), without contacting the upstream;
        reset: the connection is reset (TCP RST), no response;
        drop_mid_body: the upstream's status line, headers and the first half of its body, then
          the connection is closed (Content-Length still promises all of it);
        truncate: the same with all but the body's last byte;
        slow: sleeps `seconds` before handling the request (to make a client time out).

        A response without a body (to HEAD, say) is relayed whole despite drop_mid_body or truncate."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}: one of {FAULT_KINDS}")
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        if (kind == "slow") != (seconds is not None):
            raise ValueError("seconds goes with kind='slow', and only with it")
        with self._lock:
            self._faults.append(_Fault(kind, count, path_contains, seconds, retry_after, method))

    def pending(self) -> int:
        """The number of injected fault applications not consumed yet."""
        with self._lock:
            return sum(fault.count for fault in self._faults)

    def take_fault(self, method: str, path: str) -> Optional[_Fault]:
        """Consumes and logs the first injected fault this request matches."""
        with self._lock:
            for fault in self._faults:
                if (fault.path_contains is None or fault.path_contains in path) and fault.method in (None, method):
                    fault.count -= 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                    self.fired.append((fault.kind, method, path))
                    return fault
        return None

    def reset_log(self):
        with self._lock:
            self.requests.clear()
            self.fired.clear()


# ---- AWS's credential services --------------------------------------------------------------------


class _CredentialsHandler(_Handler):
    def do_PUT(self):
        self.server.owner.answer(self)

    def do_GET(self):
        self.server.owner.answer(self)

    def do_POST(self):
        self.server.owner.answer(self)


class CredentialsServer(_HTTPService):
    """The two services that hand a machine its AWS credentials, as they answer:

    - EC2's instance metadata service: PUT /latest/api/token (with X-aws-ec2-metadata-token-ttl-seconds)
      answers a session token (IMDSv2), GET /latest/meta-data/iam/security-credentials/ the instance's role
      name and GET .../<role> its credentials; with tokens=True each GET without the token is refused
      401, with tokens=False the PUT is refused 405 (a service of IMDSv1 only). role=None: an instance
      without a role (404);
    - a container's credentials endpoint (ECS, EKS Pod Identity): GET /container/credentials, refused 401
      unless the Authorization header is `authorization`;
    - IAM Identity Center's portal (SSO): GET /federation/credentials?account_id=&role_name=, refused 401
      unless the x-amz-sso_bearer_token header is `sso_token`, 403 for another account or role than
      `sso_role` (account id, role name); and its SSO-OIDC token service: POST /token with grantType
      refresh_token, clientId `client`, clientSecret `client-secret` and refreshToken `refresh_token`
      answers `sso_token` for `lifetime` seconds and a new refresh token (400 otherwise).

    All hand out `credentials` (AccessKeyId, SecretAccessKey, Token; replace it at any time) with an
    Expiration `lifetime` seconds after the request."""

    handler_class = _CredentialsHandler
    CONTAINER_PATH = "/container/credentials"
    SSO_PATH = "/federation/credentials"
    _ROLES = "/latest/meta-data/iam/security-credentials/"

    def __init__(
        self,
        credentials: dict,
        lifetime: float = 3600,
        role: Optional[str] = "reader",
        authorization: str = "container-token",
        tokens: bool = True,
        sso_token: str = "sso-access-token",
        sso_role: tuple = ("111122223333", "Reader"),
    ):
        super().__init__()
        self.credentials = credentials
        self.lifetime = lifetime
        self.role = role
        self.authorization = authorization
        self.tokens = tokens
        self.sso_token = sso_token
        self.sso_role = sso_role
        self.refresh_token = "refresh-1"
        self._session_token = "imds-session-token-" + os.urandom(8).hex()

    def _answer_credentials(self, handler):
        expiration = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + self.lifetime))
        body = dict(self.credentials, Code="Success", Type="AWS-HMAC", Expiration=expiration)
        handler.send_complete(200, json.dumps(body).encode(), [("Content-Type", "application/json")])

    def _answer_sso(self, handler):
        if handler.headers.get("x-amz-sso_bearer_token") != self.sso_token:
            return handler.send_complete(401, b'{"message": "Session token not found or invalid"}')
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
        if (query.get("account_id", [""])[0], query.get("role_name", [""])[0]) != tuple(self.sso_role):
            return handler.send_complete(403, b'{"message": "No access"}')
        role = {
            "accessKeyId": self.credentials["AccessKeyId"],
            "secretAccessKey": self.credentials["SecretAccessKey"],
            "sessionToken": self.credentials["Token"],
            "expiration": int((time.time() + self.lifetime) * 1000),
        }
        handler.send_complete(
            200, json.dumps({"roleCredentials": role}).encode(), [("Content-Type", "application/json")]
        )

    def _answer_oidc(self, handler):
        body = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length", 0))) or b"{}")
        expected = {
            "grantType": "refresh_token",
            "clientId": "client",
            "clientSecret": "client-secret",
            "refreshToken": self.refresh_token,
        }
        if body != expected:
            return handler.send_complete(400, b'{"error": "invalid_grant"}')
        self.refresh_token = "refresh-" + str(int(self.refresh_token.split("-")[1]) + 1)
        answer = {"accessToken": self.sso_token, "expiresIn": int(self.lifetime), "refreshToken": self.refresh_token}
        handler.send_complete(200, json.dumps(answer).encode(), [("Content-Type", "application/json")])

    def answer(self, handler):
        path = handler.path
        self.record(handler.command, path, None)
        if handler.command == "POST":
            return self._answer_oidc(handler) if path == "/token" else handler.send_complete(404)
        if handler.command == "PUT":
            if path != "/latest/api/token":
                return handler.send_complete(404)
            if not self.tokens:
                return handler.send_complete(405)
            if not handler.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return handler.send_complete(400)
            return handler.send_complete(200, self._session_token.encode())
        if path.split("?")[0] == self.SSO_PATH:
            return self._answer_sso(handler)
        if path.split("?")[0] == self.CONTAINER_PATH:
            if handler.headers.get("Authorization") != self.authorization:
                return handler.send_complete(401, b'{"message": "unauthorized"}')
            return self._answer_credentials(handler)
        if not path.startswith(self._ROLES):
            return handler.send_complete(404)
        if self.tokens and handler.headers.get("X-aws-ec2-metadata-token") != self._session_token:
            return handler.send_complete(401)
        if self.role is None:
            return handler.send_complete(404)
        if path == self._ROLES:
            return handler.send_complete(200, self.role.encode())
        if path == self._ROLES + self.role:
            return self._answer_credentials(handler)
        return handler.send_complete(404)


# ---- a service that never answers ------------------------------------------------------------------


class SilentServer:
    """A port on 127.0.0.1 whose connections the kernel completes and nobody answers, as a metadata
    service's address off EC2 behaves behind some networks: a client waits for its timeout.
    `connections()` counts the connections made so far."""

    def __enter__(self):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind((HOST, 0))
        self._socket.listen(128)
        self._socket.setblocking(False)
        self._taken = []
        self.url = f"http://{HOST}:{self._socket.getsockname()[1]}"
        return self

    def connections(self) -> int:
        while True:
            try:
                connection, _ = self._socket.accept()
            except BlockingIOError:
                return len(self._taken)
            self._taken.append(connection)  # kept open, never answered

    def __exit__(self, *exc):
        for connection in self._taken:
            connection.close()
        self._socket.close()
