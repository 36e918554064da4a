"""A fake memcached node for router tests that need a node to misbehave (answer slowly, answer
garbage, answer twice): a listener on 127.0.0.1 serving each connection on its own thread.
Subclasses say what to send for each request line."""

import socket
import struct
import threading

from ports import free_port


class Reset(Exception):
    """Raised by FakeNode.answer: reset the connection (RST) at once, as a node that dies with
    the request in hand."""


class FakeNode:
    def __init__(self):
        self.lst = socket.socket()
        # a test may close the listener and listen again on the port (stop_listening)
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lst.bind(("127.0.0.1", free_port()))
        self.lst.listen(16)
        self.lst.settimeout(0.1)
        self.port = self.lst.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def answer(self, line, rest):
        """For one request line (without \\r\\n) and the bytes after it: (bytes to send, bytes
        left to parse), or None while a data block the line announced is still arriving; raise
        Reset to reset the connection."""
        raise NotImplementedError

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.lst.accept()
            except OSError:
                if self.lst.fileno() < 0:  # not listening (stop_listening): connects are refused
                    self.stop.wait(0.01)
                continue
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while not self.stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n" in buf:
                    line, rest = buf.split(b"\r\n", 1)
                    done = self.answer(line, rest)
                    if done is None:
                        break
                    out, buf = done
                    if out:
                        conn.sendall(out)
        except Reset:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        except OSError:
            pass

    def stop_listening(self):
        """Refuse new connections; those already accepted stay open."""
        self.lst.close()

    def listen_again(self):
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(16)
        lst.settimeout(0.1)
        self.lst = lst

    def close(self):
        self.stop.set()
        self.lst.close()
        for c in self.conns:
            c.close()
        self.thread.join()
