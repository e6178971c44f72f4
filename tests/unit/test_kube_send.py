"""`Kube._send`: one request on the client's own connection pool, as the official client
would send it, and the API server's refusals as the controller's outcomes."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from warmpool.kube import api
from warmpool.kube.api import CREDENTIALS_SECONDS, Conflict, Gone, Kube, KubeError


class Answer:
    def __init__(self, status: int, body: Any = None, reason: str = "", raw: bytes | None = None):
        self.status = status
        self.reason = reason
        self.data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.headers = {"Date": "Sat, 05 Dec 2026 10:00:00 GMT"}


class Pool:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.answers: list[Answer] = []

    def urlopen(self, method: str, url: str, **kw: Any) -> Answer:
        self.sent.append({"method": method, "url": url, **kw})
        return self.answers.pop(0) if self.answers else Answer(200, {"kind": "Thing"})


class Tokens:
    """A configuration whose token changes each time it is read (a refresh hook's)."""

    def __init__(self) -> None:
        self.reads = 0
        self.host = "https://api.example:6443"

    def auth_settings(self) -> dict[str, Any]:
        self.reads += 1
        return {"BearerToken": {"key": "authorization", "value": f"Bearer t{self.reads}"}}


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> tuple[Kube, Pool, Tokens, list[float]]:
    monkeypatch.setattr(api, "DynamicClient", lambda client: None)  # no discovery here
    pool, tokens = Pool(), Tokens()
    client = SimpleNamespace(configuration=tokens, default_headers={"User-Agent": "ua/1"},
                             rest_client=SimpleNamespace(pool_manager=pool))
    k = Kube(client)  # type: ignore[arg-type]
    now = [100.0]
    k._clock = lambda: now[0]
    return k, pool, tokens, now


def test_a_write_carries_its_body_type_query_token_and_timeouts(kube: Any) -> None:
    k, pool, _, _ = kube
    assert k._send("PATCH", "/api/v1/namespaces/ns/pods/p", [("dryRun", "All")],
                   {"metadata": {"labels": {"a": "b"}}}, api.MERGE_PATCH) == {"kind": "Thing"}
    sent = pool.sent[0]
    assert sent["method"] == "PATCH"
    assert sent["url"] == "https://api.example:6443/api/v1/namespaces/ns/pods/p?dryRun=All"
    assert json.loads(sent["body"]) == {"metadata": {"labels": {"a": "b"}}}
    assert sent["headers"] == {"User-Agent": "ua/1", "Accept": "application/json",
                               "Content-Type": api.MERGE_PATCH, "authorization": "Bearer t1"}
    assert (sent["timeout"].connect_timeout, sent["timeout"].read_timeout) == api.REQUEST_TIMEOUT
    assert sent["redirect"] is False
    assert k.latest_date() is not None and k.latest_date()[0].startswith("Sat, 05 Dec")


def test_a_read_sends_no_body_and_encodes_its_selector(kube: Any) -> None:
    k, pool, _, _ = kube
    k._send("GET", "/api/v1/namespaces/ns/pods", [("labelSelector", "app=x,k in (1,2)")])
    sent = pool.sent[0]
    assert sent["body"] is None and "Content-Type" not in sent["headers"]
    assert sent["url"].endswith("/pods?labelSelector=app%3Dx%2Ck+in+%281%2C2%29")


@pytest.mark.parametrize(("answer", "raised", "message"), [
    (Answer(409, {"kind": "Status", "message": "the object has been modified"}), Conflict,
     "the object has been modified"),
    (Answer(410, {"kind": "Status", "message": "too old resource version"}), Gone,
     "too old resource version"),
    (Answer(404, {"kind": "Status", "message": 'pods "p" not found'}), KubeError,
     'pods "p" not found'),
    (Answer(502, raw=b"<html>bad gateway</html>"), KubeError, "<html>bad gateway</html>"),
    (Answer(503, reason="Service Unavailable"), KubeError, "503 Reason: Service Unavailable"),
])
def test_a_refusal_raises_the_outcome_with_the_servers_message(
        kube: Any, answer: Answer, raised: type[Exception], message: str) -> None:
    k, pool, _, _ = kube
    pool.answers.append(answer)
    with pytest.raises(raised) as err:
        k._send("GET", "/x")
    assert type(err.value) is raised
    assert message in str(err.value)
    if raised is KubeError:
        assert err.value.status == answer.status  # type: ignore[attr-defined]


def test_credentials_are_read_once_per_interval_and_again_after_a_401(kube: Any) -> None:
    k, pool, tokens, now = kube
    for _ in range(5):
        k._send("GET", "/x")
    assert tokens.reads == 1
    assert {s["headers"]["authorization"] for s in pool.sent} == {"Bearer t1"}

    now[0] += CREDENTIALS_SECONDS  # the interval passed: read again
    k._send("GET", "/x")
    assert tokens.reads == 2 and pool.sent[-1]["headers"]["authorization"] == "Bearer t2"

    pool.answers.append(Answer(401, {"kind": "Status", "message": "Unauthorized"}))
    with pytest.raises(KubeError) as err:
        k._send("GET", "/x")
    assert err.value.status == 401
    k._send("GET", "/x")  # within the interval, but the token was refused: read anew
    assert tokens.reads == 3 and pool.sent[-1]["headers"]["authorization"] == "Bearer t3"


def test_client_certificates_alone_send_no_authorization_header(kube: Any) -> None:
    k, pool, tokens, _ = kube
    tokens.auth_settings = lambda: {}  # type: ignore[method-assign]
    k._send("GET", "/x")
    assert "authorization" not in pool.sent[0]["headers"]


def test_a_huge_refusal_body_is_cut(kube: Any) -> None:
    k, pool, _, _ = kube
    pool.answers.append(Answer(502, raw=b"<html>" + b"x" * 100_000))
    with pytest.raises(KubeError) as err:
        k._send("GET", "/x")
    assert len(str(err.value)) < api.REFUSAL_CHARS + 100
    assert str(err.value).endswith("…")
