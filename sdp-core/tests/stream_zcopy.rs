//! Zcopy through SdpStream over loopback (draft §9.2, §9.3): large
//! blocking writes against large blocking reads move by Read Zcopy or
//! Write Zcopy, the bytes arrive intact, and the counters say which
//! mechanism carried them.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use sdp_core::conn::{Config, Pipelining};
use sdp_core::stream::{SdpListener, SdpStream};

const MIB: usize = 1 << 20;

fn pair_with(client: &Config, server: &Config) -> (SdpStream, SdpStream) {
    let listener = SdpListener::bind_with("127.0.0.1:0", server).unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap().0);
    let c = SdpStream::connect_with(addr, client).unwrap();
    (c, t.join().unwrap())
}

fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|k| (k.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn zcopy_config() -> Config {
    Config {
        bcopy_threshold: 256 * 1024,
        read_zcopy: true,
        write_zcopy: true,
        ..Config::default()
    }
}

/// 64 MiB in 16 MiB writes against 16 MiB reads, Combined Mode: every
/// buffer goes by SrcAvail and the reader's RDMA Reads (but the payload
/// a Combined Mode SrcAvail carries).
#[test]
fn large_writes_move_by_read_zcopy() {
    let (c, s) = pair_with(&zcopy_config(), &zcopy_config());
    let sent = data(64 * MIB, 1);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(64 * MIB);
        let mut buf = vec![0; 16 * MIB];
        loop {
            match (&s).read(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        (got, s.info())
    });
    for chunk in sent.chunks(16 * MIB) {
        (&c).write_all(chunk).unwrap();
    }
    c.shutdown(Shutdown::Write).unwrap();
    let (got, rx) = reader.join().unwrap();
    assert!(got == sent, "{} bytes of {}", got.len(), sent.len());
    let tx = c.info().zcopy;
    let len = sent.len() as u64;
    assert_eq!(
        tx.bcopy_sent + tx.read_zcopy_sent + tx.write_zcopy_sent,
        len,
        "{tx:?}"
    );
    assert!(tx.read_zcopy_sent >= len - 4 * 1024, "{tx:?}");
    assert_eq!(
        rx.zcopy.read_zcopy_received, tx.read_zcopy_sent,
        "{:?}",
        rx.zcopy
    );
    assert_eq!(rx.zcopy.send_sms, 0, "{:?}", rx.zcopy);
}

/// A receive posted before the send, Pipelined Mode: the reader's buffer
/// is advertised by SinkAvail and the writer's RDMA Write places the
/// payload straight into it — no byte of it is copied on receive.
#[test]
fn posted_receive_moves_by_write_zcopy_without_a_copy() {
    let client = Config {
        pipelining: Pipelining::Always,
        ..zcopy_config()
    };
    let (c, s) = pair_with(&client, &zcopy_config());
    let sent = data(16 * MIB, 2);
    let s2 = s.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 16 * MIB];
        let n = (&s2).read(&mut buf).unwrap();
        buf.truncate(n);
        buf
    });
    // The read is posted and advertised before anything is written.
    while s.info().zcopy.sink_avails == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    (&c).write_all(&sent).unwrap();
    let got = reader.join().unwrap();
    assert!(got == sent, "{} bytes", got.len());
    let rx = s.info();
    assert_eq!(rx.zcopy.write_zcopy_received, sent.len() as u64, "{rx:?}");
    assert_eq!(rx.copies.bytes_copied_from_pool, 0, "{rx:?}");
    assert_eq!(rx.copies.bytes_received_direct, 0, "{rx:?}");
    assert_eq!(c.info().zcopy.write_zcopy_sent, sent.len() as u64);
}
