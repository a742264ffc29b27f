"""Servers for pycell's egress tests, run inside a network namespace the test
creates (loopback only: nothing here can reach any other address).

  *:8099          plain HTTP (also on 198.51.100.20, which the test adds
                  to the namespace's loopback)
  127.0.0.1:8443  HTTPS, certificate for tls.example.net from the test CA
  127.0.0.1:53    UDP: records any datagram (a DNS query that got here)

Paths:  /hello -> "hello from the test server"; /bytes/N -> N bytes of "x".
Every request that reaches a server is recorded in REQUEST_LOG as one line,
"METHOD PATH BODY-LENGTH", so a test can tell what got through the proxy.
Usage: servers.py CERT KEY DNS_LOG REQUEST_LOG; prints "ready" when all
listen.
"""
import http.server
import socket
import ssl
import sys
import threading

REQUEST_LOG = None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def record(self):
        # Like some origins, keep the connection open whatever the request
        # says (so only the proxy can hold it to one request).
        self.close_connection = False
        body = b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                try:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                except ValueError:  # a body the proxy cut off
                    self.close_connection = True
                    return
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        elif self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        with open(REQUEST_LOG, "a") as f:
            f.write(f"{self.command} {self.path} {len(body)}\n")

    def do_POST(self):
        self.do_GET()

    def do_GET(self):
        self.record()
        if self.close_connection:
            return
        if self.path.startswith("/bytes/"):
            n = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                self.wfile.write(chunk[: min(n, len(chunk))])
                n -= len(chunk)
            return
        body = b"hello from the test server"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main():
    global REQUEST_LOG
    cert, key, dns_log, REQUEST_LOG = sys.argv[1:5]
    http.server.ThreadingHTTPServer.daemon_threads = True
    serve(http.server.ThreadingHTTPServer(("0.0.0.0", 8099), Handler))
    tls = http.server.ThreadingHTTPServer(("127.0.0.1", 8443), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    serve(tls)
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("127.0.0.1", 53))

    def record():
        while True:
            data, peer = dns.recvfrom(4096)
            with open(dns_log, "a") as f:
                f.write(f"{peer} {len(data)}\n")

    threading.Thread(target=record, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin


main()
