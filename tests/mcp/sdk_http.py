"""Drive `pycell mcp --http` with the official MCP Python SDK's streamable
HTTP client (and raw HTTP where the SDK would hide the answer), and report
what happened: one JSON object on stdout; tests/tests/mcp_http.rs makes the
assertions.

    python sdk_http.py keys DIR
        an issuer's RSA key (DIR/issuer.pem, its JWK Set DIR/jwks.json),
        another key under the same key id (DIR/impostor.pem), and a
        self-signed TLS certificate for 127.0.0.1 (DIR/tls-cert.pem,
        DIR/tls-key.pem)
    python sdk_http.py check --url URL --keys DIR --issuer ISS --tokens JSON
        the steps below; JSON maps alice, bob, viewer, limited to tokens
    python sdk_http.py tls --url URL --keys DIR --token TOKEN
        one run over HTTPS, verifying the server's certificate

Steps of `check`: refusals (no token, a wrong token, JWTs expired, for
another audience, from another issuer, signed by another key), the
protected resource metadata, runs and sessions of token and OAuth callers
in both protocol eras (handshake 2025-11-25 and 2026-07-28), one identity
naming another's session handle, a token without the run scope, and one
identity's concurrency and rate limits. Every step is bounded in time.
"""

import argparse
import json
import os
import sys
import time

import anyio
import httpx2
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdk_client import REPORT, step  # noqa: E402

KID = "pycell-test-1"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# ------------------------------------------------------------------ keys


def write_key(path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with open(path, "wb") as f:
        f.write(pem)
    return key


def make_keys(d):
    issuer = write_key(os.path.join(d, "issuer.pem"))
    write_key(os.path.join(d, "impostor.pem"))
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(issuer.public_key()))
    jwk.update({"kid": KID, "alg": "RS256", "use": "sig"})
    with open(os.path.join(d, "jwks.json"), "w") as f:
        json.dump({"keys": [jwk]}, f)
    tls = write_key(os.path.join(d, "tls-key.pem"))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    import datetime
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(tls.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(tls, hashes.SHA256())
    )
    with open(os.path.join(d, "tls-cert.pem"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    make_cluster_ca(d)


def make_cluster_ca(d):
    """A cluster CA (DIR/ca.pem), the gateways' certificate for the name
    pycell-gateway (DIR/gateway-cert.pem, -key.pem) and the front end's
    (DIR/front-cert.pem, -key.pem), both signed by it; and a stranger's
    certificate signed by another CA (DIR/stranger-cert.pem, -key.pem)."""
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def ca(stem):
        key = write_key(os.path.join(d, f"{stem}-key.pem"))
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(stem))
            .issuer_name(name(stem))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        with open(os.path.join(d, f"{stem}.pem"), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        return key, cert

    def leaf(stem, cn, by, server):
        key = write_key(os.path.join(d, f"{stem}-key.pem"))
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(by[1].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
        with open(os.path.join(d, f"{stem}-cert.pem"), "wb") as f:
            f.write(b.sign(by[0], hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    cluster = ca("ca")
    leaf("gateway", "pycell-gateway", cluster, True)
    leaf("front", "pycell-front-end", cluster, False)
    leaf("stranger", "pycell-front-end", ca("other-ca"), False)


def mint(keys, key="issuer.pem", **claims):
    with open(os.path.join(keys, key), "rb") as f:
        pem = f.read()
    return jwt.encode(claims, pem, algorithm="RS256", headers={"kid": KID})


def jwts(args):
    now = int(time.time())
    base = {"iss": args.issuer, "aud": args.url, "sub": "carol", "scope": "pycell:run", "iat": now, "exp": now + 300}
    return {
        "valid": mint(args.keys, **base),
        "expired": mint(args.keys, **{**base, "iat": now - 600, "exp": now - 300}),
        "wrong_audience": mint(args.keys, **{**base, "aud": "https://other.example.net/mcp"}),
        "wrong_issuer": mint(args.keys, **{**base, "iss": "https://other-issuer.example.net"}),
        "wrong_key": mint(args.keys, key="impostor.pem", **base),
    }


# ------------------------------------------------------------------ raw HTTP


def initialize_body():
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }


async def raw(url, token=None, body=None, extra=None):
    headers = dict(ACCEPT)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra or {})
    async with httpx2.AsyncClient(timeout=30) as c:
        r = await c.post(url, headers=headers, json=body or initialize_body())
    return {"status": r.status_code, "www_authenticate": r.headers.get("www-authenticate"), "text": r.text[:2000]}


async def raw_call(url, token, name, arguments):
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return await raw(url, token, body, {"MCP-Protocol-Version": "2025-03-26"})


# ------------------------------------------------------------------ SDK


def client(url, token, mode, verify=True):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60, verify=verify)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def result(r):
    text = "\n".join(getattr(c, "text", "") for c in r.content)
    return {"is_error": r.is_error, "text": text[:2000], "structured": r.structured_content}


async def call(c, name, arguments):
    try:
        return result(await c.call_tool(name, arguments))
    except Exception as e:  # noqa: BLE001 - recorded for the Rust test
        return {"exception": f"{type(e).__name__}: {e}"}


async def owner_steps(url, token, mode):
    out = {}
    async with client(url, token, mode) as c:
        out["protocol_version"] = c.protocol_version
        out["run"] = await call(c, "run_python", {"code": "print(6 * 7)"})
        start = await call(c, "session_start", {})
        out["start"] = start
        h = (start.get("structured") or {}).get("session")
        out["handle"] = h
        out["assign"] = await call(c, "run_python", {"session": h, "code": "x = 41"})
        out["list"] = await call(c, "session_list", {})
    return out


async def stranger_steps(url, token, mode, handle):
    out = {}
    async with client(url, token, mode) as c:
        out["protocol_version"] = c.protocol_version
        out["cell"] = await call(c, "run_python", {"session": handle, "code": "x"})
        out["read"] = await call(c, "read_file", {"session": handle, "path": "x"})
        out["end"] = await call(c, "session_end", {"session": handle})
        out["list"] = await call(c, "session_list", {})
        out["own_run"] = await call(c, "run_python", {"code": "print('mine')"})
    return out


async def owner_again(url, token, handle):
    async with client(url, token, "auto") as c:
        value = await call(c, "run_python", {"session": handle, "code": "x + 1"})
        end = await call(c, "session_end", {"session": handle})
    return {"value": value, "end": end}


async def viewer_steps(url, token):
    out = {"run_raw": await raw_call(url, token, "run_python", {"code": "print(1)"})}
    async with client(url, token, "legacy") as c:
        out["info"] = await call(c, "sandbox_info", {})
        out["run"] = await call(c, "run_python", {"code": "print(1)"})
    return out


async def limit_steps(url, token):
    out = {}
    async with client(url, token, "legacy") as c:
        slow = {"code": "import time\ntime.sleep(2)\nprint('slept')"}
        results = [None, None]

        async def one(i):
            if i:
                await anyio.sleep(0.5)
            results[i] = await call(c, "run_python", slow)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            tg.start_soon(one, 1)
        out["concurrent"] = results
        out["sequential"] = [await call(c, "run_python", {"code": "print(1)"}) for _ in range(4)]
    return out


async def tasks_steps(url, owner, stranger):
    """A run that becomes a task for its owner: another caller can neither
    see nor cancel it; the owner follows it to its result."""
    from mcp.shared.exceptions import MCPError
    from sdk_tasks import AnyResult, CancelTask, GetTask, Tasks, TaskIdParams, follow

    def tasks_client(token):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        return Client(streamable_http_client(url, http_client=http), mode="2026-07-28", extensions=[Tasks()])

    out = {}
    code = "import time\nprint('started', flush=True)\ntime.sleep(6)\nprint('done')"
    async with tasks_client(owner) as a, tasks_client(stranger) as b:
        first = await a.session.call_tool("run_python", {"code": code}, allow_claimed=True)
        out["kind"] = type(first).__name__
        task_id = first.model_dump(by_alias=True, mode="json").get("taskId")
        for name, request in (("get", GetTask), ("cancel", CancelTask)):
            try:
                await b.session.send_request(request(params=TaskIdParams(taskId=task_id)), AnyResult)
                out[f"stranger_{name}"] = "answered"
            except MCPError as e:
                out[f"stranger_{name}"] = {"code": e.code, "message": e.message}
        _, last = await follow(a.session, task_id, 60)
        result = (last or {}).get("result") or {}
        out["final_status"] = (last or {}).get("status")
        out["stdout"] = (result.get("structuredContent") or {}).get("stdout")
    return out


async def get_endpoint(url, token):
    async with httpx2.AsyncClient(timeout=30) as c:
        r = await c.get(url, headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
    return {"status": r.status_code, "allow": r.headers.get("allow")}


async def metadata(url):
    origin, _, path = url.partition("://")[2].partition("/")
    scheme = url.split("://")[0]
    async with httpx2.AsyncClient(timeout=30) as c:
        r = await c.get(f"{scheme}://{origin}/.well-known/oauth-protected-resource/{path}")
        h = await c.get(f"{scheme}://{origin}/healthz")
    return {"status": r.status_code, "json": r.json() if r.status_code == 200 else r.text, "healthz": h.status_code}


async def check(args):
    tokens = json.loads(args.tokens)
    t = jwts(args)
    url = args.url
    await step("no_token", lambda: raw(url))
    await step("wrong_token", lambda: raw(url, "pycell_not-a-token"))
    for name in ["expired", "wrong_audience", "wrong_issuer", "wrong_key"]:
        await step(f"jwt_{name}", lambda name=name: raw(url, t[name]))
    await step("metadata", lambda: metadata(url))
    await step("rebinding", lambda: raw(url, tokens["alice"], extra={"Host": "evil.example.net"}))
    await step("get", lambda: get_endpoint(url, tokens["alice"]))
    await step("alice", lambda: owner_steps(url, tokens["alice"], "legacy"), timeout=90)
    handle = (REPORT.get("alice") or {}).get("handle")
    await step("bob", lambda: stranger_steps(url, tokens["bob"], "legacy", handle), timeout=90)
    await step("carol", lambda: stranger_steps(url, t["valid"], "auto", handle), timeout=90)
    await step("alice_again", lambda: owner_again(url, tokens["alice"], handle), timeout=90)
    await step("viewer", lambda: viewer_steps(url, tokens["viewer"]), timeout=90)
    await step("limited", lambda: limit_steps(url, tokens["limited"]), timeout=90)
    await step("tasks", lambda: tasks_steps(url, tokens["alice"], tokens["bob"]), timeout=90)


async def cluster_phase(args):
    """One phase of tests/tests/cluster.rs: `spread` (runs, then a session
    per node with state), `after_kill` and `after_restart` (the sessions of
    --handles, and new runs), `slow` (a run cut off by the test)."""
    handles = json.loads(args.handles or "[]")
    url, token = args.url, args.token

    async def runs(n):
        async with client(url, token, "legacy") as c:
            return [await call(c, "run_python", {"code": "print('ran')"}) for _ in range(n)]

    made = []

    async def sessions():
        out = []
        async with client(url, token, "auto") as c:
            for _ in range(3):
                s = await call(c, "session_start", {})
                h = (s.get("structured") or {}).get("session")
                made.append(h)
                out.append({"handle": h, "start": s, "assign": await call(c, "run_python", {"session": h, "code": "x = 41"})})
        return out

    async def fork_on_node():
        """A fork and a snapshot of the first session, and a session from
        the snapshot: each on the source's node (then ended)."""
        h = made[0]
        async with client(url, token, "auto") as c:
            f = await call(c, "session_fork", {"session": h})
            k = ((f.get("structured") or {}).get("session") or {}).get("session")
            cell = await call(c, "run_python", {"session": k, "code": "x + 1"})
            snap = await call(c, "session_snapshot", {"session": h})
            sid = (snap.get("structured") or {}).get("snapshot")
            started = await call(c, "session_start", {"from_snapshot": sid})
            r = (started.get("structured") or {}).get("session")
            restored = await call(c, "run_python", {"session": r, "code": "x + 2"})
            for s in (k, r):
                await call(c, "session_end", {"session": s})
        return {"source": h, "fork": k, "cell": cell, "snapshot": sid, "restored": r, "restored_cell": restored}

    async def cells():
        async with client(url, token, "auto") as c:
            return {h: await call(c, "run_python", {"session": h, "code": "x + 1"}) for h in handles}

    async def listed():
        async with client(url, token, "legacy") as c:
            return await call(c, "session_list", {})

    if args.phase == "spread":
        await step("runs", lambda: runs(6), timeout=90)
        await step("sessions", sessions, timeout=90)
        await step("info", lambda: listed(), timeout=30)
        await step("fork", fork_on_node, timeout=90)
    elif args.phase in ("after_kill", "after_restart"):
        await step("cells", cells, timeout=90)
        await step("runs", lambda: runs(4), timeout=90)
        await step("list", listed, timeout=30)
    elif args.phase == "slow":
        async def slow():
            async with client(url, token, "legacy") as c:
                return await call(c, "run_python", {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"})

        await step("slow", slow, timeout=90)


async def tls(args):
    async def run():
        cert = os.path.join(args.keys, "tls-cert.pem")
        async with client(args.url, args.token, "auto", verify=cert) as c:
            return await call(c, "run_python", {"code": "print('over tls')"})

    await step("tls_run", run, timeout=60)

    async def unverified():
        try:
            async with httpx2.AsyncClient(timeout=10) as c:
                await c.post(args.url, json=initialize_body(), headers=ACCEPT)
            return {"refused": False}
        except Exception as e:  # noqa: BLE001
            return {"refused": True, "error": type(e).__name__}

    await step("tls_unverified", unverified)
    plain = args.url.replace("https://", "http://")
    await step("tls_plain", lambda: raw(plain, args.token))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["keys", "check", "tls", "cluster"])
    p.add_argument("--phase")
    p.add_argument("--handles")
    p.add_argument("dir", nargs="?")
    p.add_argument("--url")
    p.add_argument("--keys")
    p.add_argument("--issuer")
    p.add_argument("--tokens")
    p.add_argument("--token")
    p.add_argument("--pycell", help="unused (the harness passes it)")
    args = p.parse_args()
    if args.what == "keys":
        make_keys(args.dir)
        return
    anyio.run({"check": check, "tls": tls, "cluster": cluster_phase}[args.what], args)
    print(json.dumps(REPORT, default=str))


if __name__ == "__main__":
    main()
