"""Credentials fetched over the network, as boto3 and the AWS CLI fetch them: a profile's role assumed
through STS (with a source profile's keys, chained, from a web identity token), the container's and the
instance's metadata services. moto's S3 and STS server checks every request's signature (the keys a role
or a service hands out are moto's own, refused unless they came from it); the metadata services are
small servers of the tests' own (remote_servers.CredentialsServer). Everything listens on 127.0.0.1."""

import json
import os
import shutil
import stat
import time

import boto3
import numpy as np
import pytest
import torch
import zarr
from remote_servers import CredentialsServer, RangeHTTPServer, S3Server, SilentServer
from torch.utils.data import DataLoader

import torch_shards as ts

pytestmark = pytest.mark.timeout(180)

ROWS = [0, 5, 17, 99, 42]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("credentials") / "store.zarr"
    values = np.arange(100 * 6, dtype=np.float32).reshape(100, 6)
    zarr.create_array(root, shape=values.shape, chunks=(10, 6), dtype="float32")[:] = values
    return root


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No credentials anywhere but where a test puts them; the shared files are tmp_path/config and
    tmp_path/credentials (absent until written)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return tmp_path


@pytest.fixture
def server(store):
    """moto checking signatures, with the store at s3://private/p, and the role `reader` (s3:*, and
    assuming other roles) that anyone may assume."""
    with S3Server(verify_signatures=True) as server:
        server.create_bucket("private")
        server.put_tree("private", "p", store)
        server.reader = server.add_role("reader", ["s3:*", "sts:AssumeRole"])
        yield server


def reads_as_local(store, remote):
    local = ts.open(store).read(ROWS)
    got = remote.read(ROWS)
    assert sorted(got) == sorted(local)
    for key in local:
        assert torch.equal(got[key], local[key])


def open_remote(server, **options):
    # A store is kept per bucket and options: each opening differs by max_requests, so that none reuses an
    # earlier one's credentials.
    open_remote.count = getattr(open_remote, "count", 0) + 1
    return ts.open("s3://private/p", endpoint_url=server.endpoint_url, max_requests=100 + open_remote.count, **options)


def test_a_profiles_role_is_assumed_with_its_source_profiles_keys(store, server, clean_env, monkeypatch):
    key, secret = server.add_user("assumer", ["sts:AssumeRole"])  # may assume roles, not read S3
    chained = server.add_role("chained", ["s3:*"])
    (clean_env / "credentials").write_text(f"[base]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    (clean_env / "config").write_text(
        f"[profile reader]\nrole_arn = {server.reader}\nsource_profile = base\nrole_session_name = training-job\n"
        f"[profile chained]\nrole_arn = {chained}\nsource_profile = reader\n"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", server.endpoint_url)
    # The source's own keys may not read: the reads below are signed with the role's.
    with pytest.raises(RuntimeError, match=r"s3://private/p.*access denied.*AccessDenied.*\[base\]"):
        open_remote(server, profile="base")
    reads_as_local(store, open_remote(server, profile="reader"))
    reads_as_local(store, open_remote(server, profile="chained"))  # AssumeRole twice, the second with the first's


def test_the_profile_option_skips_the_environments_keys(store, server, clean_env, monkeypatch):
    # As `aws --profile` and boto3's Session(profile_name=) do; AWS_PROFILE does not skip them.
    key, secret = server.add_user("assumer", ["sts:AssumeRole"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", server.endpoint_url)
    (clean_env / "config").write_text(
        f"[profile reader]\nrole_arn = {server.reader}\ncredential_source = Environment\n"
    )
    reads_as_local(store, open_remote(server, profile="reader"))
    monkeypatch.setenv("AWS_PROFILE", "reader")
    with pytest.raises(RuntimeError, match=r"access denied.*signed with the credentials from environment"):
        open_remote(server)


def test_a_web_identity_token_assumes_the_role(store, server, clean_env, monkeypatch):
    # EKS's IAM roles for service accounts: AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, no keys at all.
    token = clean_env / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJl\n")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", server.endpoint_url)
    with pytest.raises(RuntimeError, match=r"s3://private/p"):  # unsigned: moto refuses it (HTTP 500 when checking)
        open_remote(server)
    monkeypatch.setenv("AWS_ROLE_ARN", server.reader)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    server.skip_checks(1)  # the unsigned AssumeRoleWithWebIdentity; every S3 request after it is checked
    reads_as_local(store, open_remote(server))
    # The same from a profile's web_identity_token_file.
    for name in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name)
    (clean_env / "config").write_text(f"[profile pod]\nrole_arn = {server.reader}\nweb_identity_token_file = {token}\n")
    server.skip_checks(1)
    reads_as_local(store, open_remote(server, profile="pod"))
    # A token file that is not there: named.
    (clean_env / "config").write_text(
        f"[profile gone]\nrole_arn = {server.reader}\nweb_identity_token_file = {token}x\n"
    )
    with pytest.raises(RuntimeError, match=rf"role/reader.*cannot read the web identity token file {token}x"):
        open_remote(server, profile="gone")


def test_sts_refusing_the_role_names_it_the_profile_and_the_error(server, clean_env, monkeypatch):
    key, secret = server.add_user("nobody", ["s3:ListBucket"])  # may not assume roles
    (clean_env / "config").write_text(
        f"[profile base]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
        f"[profile reader]\nrole_arn = {server.reader}\nsource_profile = base\n"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", server.endpoint_url)
    expected = (
        rf"cannot assume the role {server.reader} \(.*config \[profile reader\]\) with AssumeRole at "
        rf"{server.endpoint_url}: HTTP 403 \(AccessDenied.*signed with the credentials from .*\[profile base\]"
    )
    with pytest.raises(RuntimeError, match=expected) as error:
        open_remote(server, profile="reader")
    assert secret not in str(error.value)


@pytest.mark.parametrize(
    "profile, expected",
    [
        ("[profile p]\nrole_arn = arn:aws:iam::1:role/r\n", r"'p' has a role_arn but no source_profile"),
        (
            "[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = q\n"
            "[profile q]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = p\n",
            r"source_profile of AWS profile 'q' leads back to 'p' \(p -> q\)",
        ),
        ("[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = nowhere\n", r"'nowhere' .* is in neither"),
        (
            "[profile p]\nrole_arn = arn:aws:iam::1:role/r\ncredential_source = Laptop\n",
            r"credential_source = 'Laptop' of AWS profile 'p' is none of",
        ),
        (
            "[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = p\nmfa_serial = arn:aws:iam::1:mfa/u\n",
            r"'p' needs an MFA code \(mfa_serial\).*export-credentials --profile p",
        ),
        (
            "[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = q\ncredential_source = Environment\n",
            r"'p' has both source_profile and credential_source",
        ),
        (
            "[profile p]\nrole_arn = arn:aws:iam::1:role/r\nweb_identity_token_file = /t\nduration_seconds = 60\n",
            r"duration_seconds = '60' is not seconds in \[900, 43200\]",
        ),
    ],
)
def test_a_role_configured_wrong_is_refused_before_any_request(clean_env, profile, expected):
    # No server runs: a request would fail differently.
    (clean_env / "config").write_text(profile)
    with pytest.raises((ValueError, RuntimeError), match=expected):
        ts.open("s3://private/p", endpoint_url="http://127.0.0.1:9", profile="p", retries=0)


def role_credentials(server, name="handed-out"):
    """Credentials of the role `reader` from moto's STS (what a metadata service would hand out)."""
    sts = boto3.client(
        "sts",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
    )
    answer = sts.assume_role(RoleArn=server.reader, RoleSessionName=name)["Credentials"]
    return {key: answer[key] for key in ("AccessKeyId", "SecretAccessKey")} | {"Token": answer["SessionToken"]}


def test_a_containers_credentials_sign_the_requests(store, server, clean_env, monkeypatch):
    # ECS / EKS Pod Identity: a full URI (http to loopback) and an authorization token file.
    with CredentialsServer(role_credentials(server)) as service:
        url = service.url + CredentialsServer.CONTAINER_PATH
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url)
        token = clean_env / "pod-token"
        token.write_text("container-token\n")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token))
        reads_as_local(store, open_remote(server))
        assert service.count("GET", CredentialsServer.CONTAINER_PATH) == 1
        # Fetched once per process (per URI): a token gone stale shows on another URI.
        token.write_text("stale-token\n")
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url + "?again")
        with pytest.raises(RuntimeError, match=rf"container's AWS credentials from {url}\?again.*HTTP 401"):
            open_remote(server)
    # Plain http anywhere but loopback and the ECS / EKS agents is refused before any request.
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://10.1.2.3/credentials")
    with pytest.raises(ValueError, match="AWS_CONTAINER_CREDENTIALS_FULL_URI='http://10.1.2.3/credentials'"):
        open_remote(server)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_forked_dataloader_workers_sign_with_what_their_parent_fetched(store, server, clean_env, monkeypatch, context):
    # A process forked from one that fetched credentials (a DataLoader worker) signs with them until they
    # are due, as its parent would: the service is not asked again per worker (and per epoch, where workers
    # start afresh each one). A spawned worker is a process of its own: it fetches them once.
    with CredentialsServer(role_credentials(server, name=context)) as service:
        path = CredentialsServer.CONTAINER_PATH
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{service.url}{path}?{context}")
        token = clean_env / "pod-token"
        token.write_text("container-token\n")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token))
        remote = open_remote(server)
        reads_as_local(store, remote)
        assert service.count("GET", path) == 1
        dataset = ts.ShardedDataset(remote, ts.BlockShuffling(block_size=10), batch_size=16)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
        local = ts.open(store)
        for _ in range(2):  # workers started afresh each epoch
            batches = list(loader)
            assert sorted(torch.cat([batch["index"] for batch in batches]).tolist()) == list(range(100))
            for batch in batches:
                expected = local.read(batch["index"].tolist())
                for key, value in expected.items():
                    assert torch.equal(batch[key], value), key
        assert service.count("GET", path) == (1 if context == "fork" else 1 + 2 * 2)


@pytest.mark.parametrize("tokens", [True, False], ids=["imdsv2", "imdsv1"])
def test_the_instances_credentials_sign_the_requests_and_are_fetched_again_before_they_expire(
    store, server, clean_env, monkeypatch, tokens
):
    with CredentialsServer(role_credentials(server), lifetime=4, tokens=tokens) as service:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", service.url)
        remote = open_remote(server)
        reads_as_local(store, remote)
        roles = "/latest/meta-data/iam/security-credentials/reader"
        assert service.count("GET", roles) == 1
        assert service.count("PUT") == 1
        # Due two seconds before they expire (half their lifetime): the next request fetches them again.
        time.sleep(2.5)
        reads_as_local(store, remote)
        assert service.count("GET", roles) == 2


def test_an_instance_without_a_role_leaves_the_requests_unsigned_saying_why(store, clean_env, monkeypatch):
    # moto checking no signature answers an unsigned request 403, and the message says where credentials were
    # looked for.
    with S3Server() as server, CredentialsServer({}, role=None) as service:
        server.create_bucket("private")
        server.put_tree("private", "p", store)
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", service.url)
        expected = rf"unsigned.*instance metadata \({service.url}: the instance has no IAM role\)"
        with pytest.raises(RuntimeError, match=expected):
            open_remote(server)


def test_forked_dataloader_workers_do_not_wait_again_for_a_silent_metadata_service(store, clean_env, monkeypatch):
    # Off EC2 with no credentials anywhere: the process waits once for the instance metadata service, then
    # reads unsigned (a public bucket) and does not ask again for a minute; nor do its forked workers.
    shutil.copytree(store, clean_env / "served" / "public" / "p")
    with RangeHTTPServer(clean_env / "served", s3_listing=True) as server, SilentServer() as silent:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", silent.url)
        monkeypatch.setenv("AWS_METADATA_SERVICE_TIMEOUT", "0.5")
        remote = ts.open("s3://public/p", endpoint_url=server.url)
        reads_as_local(store, remote)
        assert silent.connections() == 1
        dataset = ts.ShardedDataset(remote, ts.BlockShuffling(block_size=10), batch_size=16)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
        for _ in range(2):  # workers started afresh each epoch
            assert sorted(torch.cat([batch["index"] for batch in loader]).tolist()) == list(range(100))
        assert silent.connections() == 1


def write_sso_login(home, start_url, token, expires_in, refresh_token=None):
    """What `aws sso login` leaves in the CLI's token cache (the file's name is a hash: any name is read);
    with refresh_token, an sso-session's login with its client registration. Returns the file's path."""
    cache = home / ".aws" / "sso" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + expires_in))
    login = {"startUrl": start_url, "region": "eu-west-1", "accessToken": token, "expiresAt": expires}
    if refresh_token:
        registered = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
        login |= {"refreshToken": refresh_token, "clientId": "client", "clientSecret": "client-secret"}
        login |= {"registrationExpiresAt": registered}
    path = cache / f"{abs(hash((start_url, token))):x}.json"
    path.write_text(json.dumps(login))
    return path
    (cache / "botocore-client-id-eu-west-1.json").write_text('{"clientId": "x", "clientSecret": "y"}')


def test_an_sso_profiles_role_credentials_sign_the_requests(store, server, clean_env, monkeypatch):
    start = "https://example.awsapps.com/start"
    with CredentialsServer(role_credentials(server), sso_token="current-login") as portal:
        monkeypatch.setenv("HOME", str(clean_env))
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
        (clean_env / "config").write_text(
            "[profile dev]\nsso_session = corp\nsso_account_id = 111122223333\nsso_role_name = Reader\n"
            f"[sso-session corp]\nsso_start_url = {start}\nsso_region = eu-west-1\n"
            f"[profile legacy]\nsso_start_url = {start}/\nsso_region = eu-west-1\n"
            "sso_account_id = 111122223333\nsso_role_name = Reader\n"
            "[profile other]\nsso_session = corp\nsso_account_id = 999999999999\nsso_role_name = Admin\n"
            "[profile broken]\nsso_session = nowhere\nsso_account_id = 1\nsso_role_name = R\n"
        )
        with pytest.raises(RuntimeError, match=r"AWS profile 'dev'.*no SSO login for .*aws sso login --profile dev"):
            open_remote(server, profile="dev")
        write_sso_login(clean_env, start, "old-login", -60)
        with pytest.raises(RuntimeError, match=r"profile 'dev'.*has expired.*; run `aws sso login --profile dev`"):
            open_remote(server, profile="dev")
        write_sso_login(clean_env, start, "current-login", 3600)  # the unexpired login is the one used
        reads_as_local(store, open_remote(server, profile="dev"))
        reads_as_local(store, open_remote(server, profile="legacy"))
        assert portal.count("GET", CredentialsServer.SSO_PATH) == 2
        with pytest.raises(
            RuntimeError, match=r"HTTP 403: the login may not use role Admin of account 999999999999"
        ) as error:
            open_remote(server, profile="other")
        assert "current-login" not in str(error.value)
        with pytest.raises(ValueError, match=r"names sso_session 'nowhere', which has no \[sso-session nowhere\]"):
            open_remote(server, profile="broken")


def test_an_expired_sso_session_login_is_refreshed_and_written_back(store, server, clean_env, monkeypatch):
    # As the CLI does for an sso-session: SSO-OIDC's CreateToken with the login's refresh token; the new token
    # and refresh token go back to the cache file. The older form (sso_start_url in the profile) has no
    # refresh: its expired login asks for `aws sso login`.
    start = "https://refresh.awsapps.com/start"
    with CredentialsServer(role_credentials(server), sso_token="refreshed-login") as portal:
        monkeypatch.setenv("HOME", str(clean_env))
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSO_OIDC", portal.url)
        (clean_env / "config").write_text(
            "[profile dev]\nsso_session = corp\nsso_account_id = 111122223333\nsso_role_name = Reader\n"
            "[profile dev2]\nsso_session = corp\nsso_account_id = 111122223333\nsso_role_name = Reader\n"
            f"[sso-session corp]\nsso_start_url = {start}\nsso_region = eu-west-1\n"
            f"[profile legacy]\nsso_start_url = {start}\nsso_region = eu-west-1\n"
            "sso_account_id = 111122223333\nsso_role_name = Reader\n"
        )
        login = write_sso_login(clean_env, start, "stale-login", -60, refresh_token="refresh-1")
        with pytest.raises(RuntimeError, match=r"profile 'legacy'.*has expired; run `aws sso login --profile legacy`"):
            open_remote(server, profile="legacy")
        assert portal.count("POST") == 0
        reads_as_local(store, open_remote(server, profile="dev"))
        assert portal.count("POST", "/token") == 1
        written = json.loads(login.read_text())
        assert written["accessToken"] == "refreshed-login" and written["refreshToken"] == "refresh-2"
        assert stat.S_IMODE(login.stat().st_mode) == 0o600  # it holds tokens: its owner's only
        assert time.mktime(time.strptime(written["expiresAt"], "%Y-%m-%dT%H:%M:%SZ")) > time.mktime(time.gmtime())
        # A refresh the service refuses (a revoked refresh token) names why, and what to run (another
        # profile: dev's credentials are kept by this process until they are due).
        write_sso_login(clean_env, start, "stale-again", -30, refresh_token="revoked")
        login.unlink()
        expected = r"has expired and could not be refreshed \(CreateToken at .* HTTP 400\); run `aws sso login"
        with pytest.raises(RuntimeError, match=expected):
            open_remote(server, profile="dev2")
