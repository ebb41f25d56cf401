//! Released streams finish their close with nobody calling the library
//! (a test binary of its own: `progress::wait_released` counts every
//! stream of the process).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use sdp_core::stream::{SdpListener, SdpStream};

fn pair() -> (SdpStream, SdpStream) {
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap().0);
    let c = SdpStream::connect(addr).unwrap();
    (c, t.join().unwrap())
}

#[test]
fn released_streams_finish_their_close_in_the_background() {
    // Both DisConns and both FINs, with nobody calling the library: the
    // peer's DisConn and FIN often arrive together, and the FIN must not
    // be missed behind the short read of the DisConn.
    for _ in 0..20 {
        let (c, s) = pair();
        c.set_nonblocking(true).unwrap();
        s.set_nonblocking(true).unwrap();
        (&c).write_all(b"x").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut buf = [0u8; 4];
        let mut got = Vec::new();
        let t = Instant::now();
        loop {
            match (&s).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        assert_eq!(got, b"x");
        drop(c);
        drop(s);
        let left =
            sdp_core::stream::progress::wait_released(Instant::now() + Duration::from_secs(3));
        assert_eq!(left, 0, "a released stream did not finish its close");
    }
}
