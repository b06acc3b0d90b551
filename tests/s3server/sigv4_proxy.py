"""A front for the tests' S3 server that verifies AWS Signature Version 4.

moto_server accepts any access key and never recomputes a V4 signature.
The tests put this proxy in front of it:
every request is verified the way S3 verifies it (canonical request from
the received method, path, query, signed headers and x-amz-content-sha256;
string to sign over the credential scope; HMAC chain from the secret) and
answered 403 SignatureDoesNotMatch when the signature differs; a request
that verifies is forwarded to the server unchanged and its answer relayed.

    python3 sigv4_proxy.py LISTEN_PORT UPSTREAM_PORT ACCESS_KEY SECRET_KEY

Standard library only; listens on 127.0.0.1.  Counts are printed to stderr
on exit (verified, refused)."""
import hashlib
import hmac
import http.client
import http.server
import re
import signal
import sys
import urllib.parse

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                     r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate"}
MAX_BODY = 64 << 20  # the tests' objects are far smaller


def uri_encode(s, keep_slash):
    return urllib.parse.quote(s, safe="-_.~" + ("/" if keep_slash else ""))


def canonical_query(raw):
    pairs = []
    for part in raw.split("&") if raw else []:
        name, _, value = part.partition("=")
        pairs.append((uri_encode(urllib.parse.unquote(name), False),
                      uri_encode(urllib.parse.unquote(value), False)))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def expected_signature(method, raw_path, headers, signed, day, region, amz_date, secret):
    path, _, query = raw_path.partition("?")
    canonical_headers = "".join(
        f"{h}:{' '.join((headers.get(h) or '').split())}\n" for h in signed.split(";"))
    canonical = "\n".join([method, uri_encode(urllib.parse.unquote(path), True),
                           canonical_query(query), canonical_headers, signed,
                           headers.get("x-amz-content-sha256") or ""])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None  # (host, port), set in main
    access = secret = None
    counts = {"verified": 0, "refused": 0}

    def log_message(self, *args):
        pass

    def refuse(self, code, why):
        Handler.counts["refused"] += 1
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{why}</Message></Error>").encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def verify(self, body):
        """None when the request is signed right, else (code, message)."""
        m = AUTH_RE.match(self.headers.get("Authorization") or "")
        if not m:
            return "AccessDenied", "missing or malformed SigV4 Authorization header"
        access, day, region, signed, signature = m.groups()
        if access != self.access:
            return "InvalidAccessKeyId", "unknown access key"
        headers = {k.lower(): v for k, v in self.headers.items()}
        amz_date = headers.get("x-amz-date") or ""
        if not amz_date.startswith(day) or "host" not in signed.split(";"):
            return "AccessDenied", "x-amz-date or host not signed as SigV4 wants"
        payload = headers.get("x-amz-content-sha256") or ""
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            return "XAmzContentSHA256Mismatch", "payload hash differs"
        want = expected_signature(self.command, self.path, headers, signed, day, region,
                                  amz_date, self.secret)
        if not hmac.compare_digest(want, signature):
            return "SignatureDoesNotMatch", "the signature does not match"
        return None

    def relay(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY:
            self.close_connection = True  # the unread body would follow on this connection
            return self.refuse("EntityTooLarge", "body too large for the test proxy")
        body = self.rfile.read(length) if length else b""
        problem = self.verify(body)
        if problem:
            return self.refuse(*problem)
        Handler.counts["verified"] += 1
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn.request(self.command, self.path, body=body if length else None, headers=headers)
            r = conn.getresponse()
            data = r.read()
            self.send_response(r.status, r.reason)
            for k, v in r.getheaders():
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            # HEAD answers carry the object's length; others the relayed body's.
            self.send_header("Content-Length", r.getheader("Content-Length", "0")
                             if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = relay


def main():
    listen, upstream, Handler.access, Handler.secret = sys.argv[1:5]
    Handler.upstream = ("127.0.0.1", int(upstream))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(listen)), Handler)
    server.daemon_threads = True

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    print(f"sigv4_proxy: {Handler.counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
