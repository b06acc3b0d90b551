"""Bearer-token authentication of the HTTP frontend (docs/http.md,
"Authentication"), end to end.

Every route of the route table is asked three ways (no token, a wrong one,
the right one) on a server with --http-auth-token, and the same three ways on
a server without a token, where nothing may change.  The list of routes
below is checked against the route table in src/http/http_routes.c and the
access table in docs/http.md, so a route cannot be added unclassified.
"""
import json
import os
import re
import subprocess
import time

from lmc.server import BASE_ARGS, LMCACHED, ROOT, Server, answers_http, finish, free_port, start_http
from test_http import request

TOKEN = "e2e-Token_0123456789abcdef.~+/="
WRONG = "e2e-Token_0123456789abcdef.~+/-"   # same length, last byte differs

KV_HEADERS = {"X-LMCache-Model-Name": "m", "X-LMCache-Tokens": "1,2,3",
              "Content-Type": "application/x-lmcache-kv; v=1"}
KV_JSON = {"model_name": "m", "tokens": [1, 2, 3], "cache_salt": ""}

# (method, sample path, body, extra headers, access): one per route-table
# entry; prefix routes ("/quota/{salt}") are asked with a sample suffix.
ROUTES = [
    ("GET", "/", None, None, "open"),
    ("GET", "/dashboard", None, None, "open"),
    ("GET", "/healthcheck", None, None, "open"),
    ("GET", "/api/healthcheck", None, None, "open"),
    ("GET", "/status", None, None, "open"),
    ("GET", "/api/status", None, None, "open"),
    ("GET", "/status/memory-pressure", None, None, "open"),
    ("GET", "/version", None, None, "open"),
    ("GET", "/lmc_version", None, None, "open"),
    ("GET", "/commit_id", None, None, "open"),
    ("GET", "/metrics", None, None, "open"),
    ("GET", "/config", None, None, "token"),
    ("GET", "/conf", None, None, "token"),
    ("GET", "/config/adapters", None, None, "token"),
    ("POST", "/cache/clear", {}, None, "token"),
    ("POST", "/clear-cache", None, None, "token"),
    ("GET", "/threads", None, None, "token"),
    ("POST", "/coordinator/command", {"type": "auth-test"}, None, "token"),
    ("GET", "/config/policies", None, None, "token"),
    ("PATCH", "/config/policies", {}, None, "token"),
    ("POST", "/config/policies/validate", {}, None, "token"),
    ("GET", "/cache/objects", None, None, "token"),
    ("DELETE", "/cache/objects", {"keys": [], "tier": "l1"}, None, "token"),
    ("POST", "/cache/prefetches", {}, None, "token"),
    ("GET", "/cache/prefetches/no-such-id", None, None, "token"),
    ("POST", "/cache/checksums", {}, None, "token"),
    ("GET", "/kvcache/check?block_ids=0&chunk_size=1", None, None, "token"),
    ("GET", "/quota", None, None, "token"),
    ("GET", "/quota/tenant", None, None, "token"),
    ("PUT", "/quota/tenant", {"limit_gb": 1}, None, "token"),
    ("DELETE", "/quota/tenant", None, None, "token"),
    ("GET", "/api/quota", None, None, "token"),
    ("GET", "/api/quota/tenant", None, None, "token"),
    ("PUT", "/api/quota/tenant", {"limit_gb": 1}, None, "token"),
    ("DELETE", "/api/quota/tenant", None, None, "token"),
    ("POST", "/api/kv/store", b"\0" * 64, KV_HEADERS, "token"),
    ("POST", "/api/kv/retrieve", KV_JSON, None, "token"),
    ("POST", "/api/kv/lookup", KV_JSON, None, "token"),
    ("POST", "/api/trace/replay", b"", {"Content-Type": "application/octet-stream"}, "token"),
    ("GET", "/reconfigure/l1", None, None, "token"),
    ("POST", "/reconfigure/l1", {}, None, "token"),
]


# ---- the route list is complete ------------------------------------------


def route_table():
    """{(method, path, prefix): access} from the lmc_http_route tables their
    owners add to the frontend (src/**/*.c; docs/architecture.md, "HTTP
    routes"); the coordinator serves its own."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "src")):
        if os.path.basename(dirpath) == "coordinator":
            continue
        for name in sorted(files):
            if not name.endswith(".c"):
                continue
            with open(os.path.join(dirpath, name)) as f:
                text = f.read()
            for m in re.finditer(r"static const lmc_http_route \w+\[\] = \{", text):
                table = text[m.start():text.index("\n};", m.start())]
                entries = re.findall(r'\{"([A-Z]+)", "([^"]*)", (true|false), '
                                     r'(?:LMC_HTTP_)?(OPEN|TOKEN),', table)
                assert len(entries) == table.count('\n    {"'), \
                    f"a route entry of {name} the pattern missed"
                for meth, path, pre, acc in entries:
                    key = (meth, path, pre == "true")
                    assert key not in out, f"{key} added twice"
                    out[key] = acc.lower()
    return out


def documented_access():
    """{(method, path, prefix): access} from docs/http.md's access table, where
    a route is written `METHOD /path` or `METHOD /prefix/{name}`."""
    with open(os.path.join(ROOT, "docs", "http.md")) as f:
        text = f.read()
    rows = re.findall(r"^\| `([A-Z]+) (/[^`]*)` \| (open|token) \|", text, re.M)
    out = {}
    for method, path, access in rows:
        prefix = "{" in path
        key = (method, path[:path.index("{")] if prefix else path, prefix)
        assert key not in out, f"{method} {path} documented twice"
        out[key] = access
    return out


def entry_of(method, sample, table):
    path = sample.split("?")[0]
    hits = [k for k in table if k[0] == method and
            (path.startswith(k[1]) and len(path) > len(k[1]) if k[2] else path == k[1])]
    assert len(hits) == 1, (method, sample, hits)
    return hits[0]


def test_route_list_covers_every_route():
    table = route_table()
    assert len(table) >= 40
    assert documented_access() == table, "docs/http.md's access table and the route table differ"
    covered = {}
    for method, sample, _, _, access in ROUTES:
        key = entry_of(method, sample, table)
        assert key not in covered, f"{key} asked twice"
        assert table[key] == access, (key, table[key], access)
        covered[key] = access
    assert set(covered) == set(table), f"routes not in ROUTES: {set(table) - set(covered)}"
    open_routes = {k for k, v in table.items() if v == "open"}
    assert {p for _, p, _ in open_routes} == {
        "/", "/dashboard", "/healthcheck", "/api/healthcheck", "/status", "/api/status",
        "/status/memory-pressure", "/version", "/lmc_version", "/commit_id", "/metrics"}


# ---- servers --------------------------------------------------------------


def guarded_server(module_server):
    """The module's server that asks for TOKEN."""
    return module_server("--http-auth-token", TOKEN)


def ask(port, method, sample, body, headers, token):
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    return request(port, method, sample, body=body, headers=h)


def assert_401(st, hdrs, body, what):
    assert st == 401, (what, st, body)
    assert hdrs.get("www-authenticate", "").startswith("Bearer"), (what, hdrs)
    assert hdrs["content-type"].startswith("application/json")
    assert "detail" in json.loads(body), (what, body)


# ---- the matrix -----------------------------------------------------------


def test_matrix(module_server, http_server):
    guarded, unguarded = guarded_server(module_server), http_server
    for method, sample, body, headers, access in ROUTES:
        what = f"{method} {sample}"
        plain = [ask(unguarded.http_port, method, sample, body, headers, t)[0]
                 for t in (None, WRONG, TOKEN)]
        # Without a token configured nothing changes, whatever is sent.
        assert 401 not in plain and len(set(plain)) == 1, (what, plain)
        got = {t: ask(guarded.http_port, method, sample, body, headers, t)
               for t in (None, WRONG, TOKEN)}
        if access == "token":
            assert_401(*got[None], what + " without a token")
            assert_401(*got[WRONG], what + " with a wrong token")
        else:
            assert got[None][0] == got[WRONG][0] == plain[0], (what, got[None][0], plain)
        assert got[TOKEN][0] == plain[0], (what, got[TOKEN][0], got[TOKEN][2], plain)
    auth = json.loads(ask(guarded.http_port, "GET", "/status", None, None, None)[2])["http_auth"]
    assert auth["enabled"] is True and auth["exposed"] is False
    assert auth["rejected"] >= 2 * sum(1 for r in ROUTES if r[4] == "token")


def test_other_answers_need_no_token(module_server):
    p = guarded_server(module_server).http_port
    st, _, _ = request(p, "GET", "/no/such/path")
    assert st == 404
    st, hdrs, _ = request(p, "GET", "/cache/clear")      # known path, wrong method
    assert st == 405 and "POST" in hdrs["allow"]
    st, _, _ = request(p, "POST", "/run_script", body="print(1)")
    assert st == 404
    st, hdrs, body = request(p, "HEAD", "/config")         # HEAD is GET's class
    assert st == 401
    for scheme in ("Basic", "Token", "bearer"):
        st, hdrs, body = request(p, "GET", "/config", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert st == (200 if scheme == "bearer" else 401), scheme   # scheme is case-insensitive
    st, _, _ = request(p, "GET", "/config", headers={"Authorization": f"Bearer {TOKEN[:-1]}"})
    assert st == 401
    st, _, _ = request(p, "GET", "/config", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert st == 401


def test_unguarded_status(http_server):
    auth = json.loads(request(http_server.http_port, "GET", "/status")[2])["http_auth"]
    assert auth == {"enabled": False, "exposed": False, "rejected": 0}


def test_token_from_environment():
    s = start_http(env={"LMCACHE_HTTP_AUTH_TOKEN": TOKEN})
    try:
        assert_401(*request(s.http_port, "POST", "/clear-cache"), "env, no token")
        st, _, _ = request(s.http_port, "POST", "/clear-cache",
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert st == 200
    finally:
        finish(s)


def test_token_from_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    s = start_http("--http-auth-token-file", str(path))
    try:
        assert_401(*request(s.http_port, "GET", "/threads"), "file, no token")
        st, _, _ = request(s.http_port, "GET", "/threads",
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert st == 200
    finally:
        finish(s)


# ---- no token, exposed ------------------------------------------------------


def test_exposed_without_token_warns():
    port = free_port()
    s = Server("--http-host", "0.0.0.0", "--http-port", str(port))
    try:
        assert answers_http(port), s.output()
        auth = json.loads(request(port, "GET", "/status")[2])["http_auth"]
        assert auth == {"enabled": False, "exposed": True, "rejected": 0}
        assert "reachable from other hosts and has no --http-auth-token" in s.output()
    finally:
        finish(s)


def test_exposed_with_token_does_not_warn():
    port = free_port()
    s = Server("--http-host", "0.0.0.0", "--http-port", str(port), "--http-auth-token", TOKEN)
    try:
        assert answers_http(port), s.output()
        auth = json.loads(request(port, "GET", "/status")[2])["http_auth"]
        assert auth["enabled"] is True and auth["exposed"] is True
        assert "has no --http-auth-token" not in s.output()
    finally:
        finish(s)


# ---- refused at start ---------------------------------------------------------


def run_lmcached(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if k != "LMCACHE_HTTP_AUTH_TOKEN"}
    full_env.update(env or {})
    return subprocess.run([LMCACHED, "--port", str(free_port()), "--http-port", str(free_port()),
                           *BASE_ARGS, *args], capture_output=True, text=True, timeout=30,
                          env=full_env)


def test_bad_token_flags_refused(tmp_path):
    secret = "never-printed-" + "x" * 8
    tfile = tmp_path / "token"
    tfile.write_text(secret + "\n")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    two = tmp_path / "two"
    two.write_text(secret + "\nsecond-line\n")
    cases = [
        (["--http-auth-token", secret, "--http-auth-token-file", str(tfile)], None,
         "--http-auth-token-file: cannot be combined with --http-auth-token"),
        (["--http-auth-token-file", str(tfile)], {"LMCACHE_HTTP_AUTH_TOKEN": secret},
         "--http-auth-token-file: cannot be combined"),
        (["--http-auth-token", ""], None, "--http-auth-token (or LMCACHE_HTTP_AUTH_TOKEN): "
                                          "must not be empty"),
        ([], {"LMCACHE_HTTP_AUTH_TOKEN": ""}, "--http-auth-token"),
        (["--http-auth-token", secret + " with blank"], None, "--http-auth-token"),
        (["--http-auth-token-file", str(empty)], None, "--http-auth-token-file"),
        (["--http-auth-token-file", str(two)], None, "--http-auth-token-file"),
        (["--http-auth-token-file", str(tmp_path / "missing")], None,
         "--http-auth-token-file: cannot read"),
        (["--http-auth-token-file", str(tmp_path)], None, "--http-auth-token-file: cannot read"),
        (["--http-auth-token"], None, "--http-auth-token: expected one argument"),
        (["--http-max-buffered-mb", "0"], None, "--http-max-buffered-mb"),
    ]
    for args, env, needle in cases:
        r = run_lmcached(*args, env=env)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
        assert secret not in r.stderr + r.stdout, (args, r.stderr)


def test_token_never_shown(tmp_path):
    secret = "tok-" + os.urandom(12).hex()
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    # One line per JSON member: the whole configuration is longer than the
    # 4096 bytes the server keeps of one plugin line (docs/plugins.md).
    (plugins / "dump.sh").write_text('echo "$LMCACHE_RUNTIME_PLUGIN_CONFIG" | tr , "\\n" | '
                                     'sed "s/^/AUTHCFG /"\n'
                                     'exec sleep 300\n')
    s = start_http("--http-auth-token", secret, "--log-level", "DEBUG",
              "--runtime-plugin-locations", str(plugins))
    try:
        p = s.http_port
        seen = []
        for path in ("/status", "/api/status", "/config", "/conf", "/metrics", "/threads",
                     "/config/adapters", "/status/memory-pressure", "/dashboard", "/"):
            for tok in (secret, secret[:-1] + "0", None):
                seen.append(ask(p, "GET", path, None, None, tok)[2].decode(errors="replace"))
        cfg = json.loads(ask(p, "GET", "/config", None, None, secret)[2])
        assert cfg["http"]["http_auth_token"] == "***"
        for _ in range(100):
            if "AUTHCFG" in s.output():
                break
            time.sleep(0.1)
        assert '"http_auth_token":"***"' in s.output(), s.output()
    finally:
        finish(s)
    for text in seen:
        assert secret not in text
    assert secret not in s.output()
    r = subprocess.run([LMCACHED, "--http-auth-token", secret, "--help"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0
    assert secret not in r.stdout + r.stderr
    for flag in ("--http-auth-token", "--http-auth-token-file", "--http-max-buffered-mb",
                 "LMCACHE_HTTP_AUTH_TOKEN"):
        assert flag in r.stdout, flag
