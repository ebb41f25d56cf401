//! Test programs that more than one end-to-end test file runs.

/// A prefork server: the parent listens, forks three workers that each
/// accept and answer two connections, closes its listener, connects six
/// times itself and prints the replies and the workers' exit statuses.
pub const PREFORK_SERVER: &str = r#"
import os, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
addr = srv.getsockname()
workers = []
for w in range(3):
    pid = os.fork()
    if pid == 0:
        for _ in range(2):
            conn, _ = srv.accept()
            data = conn.recv(100)
            conn.sendall(b"reply:" + data)
            conn.close()
        os._exit(0)
    workers.append(pid)
srv.close()
replies = []
for i in range(6):
    c = socket.create_connection(addr)
    c.sendall(b"req%d" % i)
    replies.append(c.recv(100).decode())
    c.close()
codes = [os.waitpid(p, 0)[1] for p in workers]
print(" ".join(replies), codes)
"#;
